"""The one bounded reader of YAML a person gives the lab (``--set`` values, recipe files). YAML lets a few hundred
characters stand for gigabytes: an alias bomb in ``--set`` cost ``plan`` 63 s and 4.5 GB. So the text is first
walked as parser events, which expand nothing, and refused before anything is built.
"""

from __future__ import annotations

from typing import Any

import yaml

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.secrets import for_terminal

MAX_DEPTH = 32  # a litgpt recipe nests 3 deep (data > init_args > value)
MAX_NODES = 100_000  # the lab's largest YAML file (an experiments matrix) has ~2,000
MAX_NUMBER_CHARS = 100  # a float64 needs 25; Python refuses to read an int of over 4,300 digits
MAX_CHARS = 4_000_000

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a safe loader either way; libyaml's is 10x faster
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def load_yaml(text: str, *, what: str) -> Any:
    """YAML's own syntax errors (``yaml.YAMLError``) are the caller's to word."""
    if len(text) > MAX_CHARS:
        raise LabConfigError(f"{what}: {len(text):,} characters of YAML; the lab reads at most {MAX_CHARS:,}")
    _check_events(text, what)
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 -- a safe loader (CSafeLoader or SafeLoader)


def _check_events(text: str, what: str) -> None:
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise LabConfigError(
                f"{what}: YAML anchors and aliases (&name, *name) are not read in values; write the value out"
            )
        if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            depth += 1
            nodes += 1
            if depth > MAX_DEPTH:
                raise LabConfigError(f"{what}: nested deeper than {MAX_DEPTH} levels; a recipe value needs 3 at most")
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if len(event.value) > MAX_NUMBER_CHARS and _is_number(event):
                raise LabConfigError(
                    f"{what}: a number of {len(event.value):,} characters; the lab reads at most {MAX_NUMBER_CHARS}"
                )
        if nodes > MAX_NODES:
            raise LabConfigError(f"{what}: more than {MAX_NODES:,} values; a recipe has a few dozen")


def _is_number(event: yaml.ScalarEvent) -> bool:
    """Whether YAML would build a number from this scalar: tagged ``!!int``/``!!float``, or plain and resolved so."""
    if event.tag in _NUMBER_TAGS:
        return True
    if not event.implicit[0]:  # quoted or tagged otherwise: text
        return False
    return yaml.resolver.Resolver().resolve(yaml.ScalarNode, event.value, (True, False)) in _NUMBER_TAGS


def shown(text: str, limit: int = 80) -> str:
    text = for_terminal(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
