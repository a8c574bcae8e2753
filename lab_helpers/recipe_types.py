"""Type checks of a resolved recipe against litgpt's own signatures, before anything starts.

Why: ``--set`` values are read as YAML, so ``train.max_steps=abc`` is a string, ``train=5`` replaces a whole
section and ``checkpoint_dir=null`` a required path. litgpt would reject each of them after a process start, a
model load, or not at all (a traceback in the lab's own checks, or a run that fails minutes in). Each bad
value here is one line: the key, what was expected, and an example taken from the recipe itself.

The expected types are litgpt's annotations (``setup``'s parameters, ``TrainArgs``/``EvalArgs``/``LogArgs``
fields, the data module's fields), so the check follows litgpt when it changes.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab_helpers.config_error import LabConfigError, setup_function


def check_recipe_types(recipe: Mapping[str, Any], command: str, examples: Mapping[str, Any]) -> None:
    """Raise LabConfigError naming the first value whose type litgpt would reject; keys litgpt does not know
    are left to ``check_recipe_keys``. ``examples`` is the recipe before overrides (for the example values)."""
    hints = typing.get_type_hints(setup_function(command))
    for key, value in recipe.items():
        if key in hints:
            _check(key, value, hints[key], _lookup(examples, key))


def _check(key: str, value: Any, annotation: Any, example: Any) -> None:
    if annotation is Any:
        return
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):  # train, eval, log
        if not isinstance(value, Mapping):
            _fail(key, value, f"a mapping of {key} settings", _dotted_example(key, annotation, example))
        hints = typing.get_type_hints(annotation)
        for sub, sub_value in value.items():
            if sub in hints:
                _check(f"{key}.{sub}", sub_value, hints[sub], _lookup(example, sub))
        return
    if _is_data_module(annotation):
        _check_data(key, value, example)
        return
    if not _matches(value, annotation):
        _fail(key, value, _describe(annotation), _example(key, annotation, example))


def _check_data(key: str, value: Any, example: Any) -> None:
    """``data``: null, or ``{class_path: a litgpt DataModule, init_args: {...}}`` with well-typed init_args."""
    from litgpt.data import DataModule

    if value is None:
        return
    wanted = "a data module: class_path and init_args"
    if not isinstance(value, Mapping) or not isinstance(value.get("class_path"), str) or not value["class_path"]:
        _fail(key, value, wanted, f"{key}.class_path=litgpt.data.JSON")
    class_path = value["class_path"]
    module_name, _, name = class_path.rpartition(".")
    try:
        import importlib

        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        _fail(f"{key}.class_path", class_path, "an importable litgpt data module", f"{key}.class_path=litgpt.data.JSON")
    if not (isinstance(cls, type) and issubclass(cls, DataModule)):
        _fail(f"{key}.class_path", class_path, "a litgpt data module class", f"{key}.class_path=litgpt.data.JSON")
    init_args = value.get("init_args")
    if init_args is None:
        return
    if not isinstance(init_args, Mapping):
        _fail(f"{key}.init_args", init_args, f"a mapping of {name}'s settings", f"{key}.num_workers=0")
    hints = typing.get_type_hints(cls)
    for sub, sub_value in init_args.items():
        if sub in hints:
            sub_example = _lookup(_lookup(example, "init_args"), sub)
            _check(f"{key}.{sub}", sub_value, hints[sub], sub_example)


def _is_data_module(annotation: Any) -> bool:
    from litgpt.data import DataModule

    return any(isinstance(arg, type) and issubclass(arg, DataModule) for arg in _union_args(annotation))


def _union_args(annotation: Any) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    if annotation is Path:
        return isinstance(value, str | Path) and str(value).strip() != ""
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        return isinstance(value, Mapping)
    if origin in (list, tuple) or annotation in (list, tuple):
        return isinstance(value, list | tuple)
    return True  # a class this module cannot check


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(arg) for arg in typing.get_args(annotation)]
        return " or ".join(dict.fromkeys(parts))
    if origin is typing.Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(annotation))
    return {
        type(None): "null",
        bool: "true or false",
        int: "a whole number",
        float: "a finite number",
        str: "text",
        Path: "a path",
        dict: "a mapping",
    }.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _example(key: str, annotation: Any, example: Any) -> str:
    if example is not None and not isinstance(example, Mapping | list) and _matches(example, annotation):
        return f"{key}={_yaml_scalar(example)}"
    for arg in _union_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return f"{key}={typing.get_args(arg)[0]}"
        sample = {bool: "true", int: "4", float: "0.5", str: "text", Path: "some/path", dict: "{a: 1}"}.get(arg)
        if sample is not None:
            return f"{key}={sample}"
    return f"{key}=..."


def _dotted_example(key: str, cls: type, example: Any) -> str:
    hints = typing.get_type_hints(cls)
    for sub, value in (example or {}).items() if isinstance(example, Mapping) else ():
        if sub in hints and value is not None and not isinstance(value, Mapping | list):
            return f"{key}.{sub}={_yaml_scalar(value)}"
    first = next(iter(hints))
    return f"{key}.{first}=..."


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _lookup(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, Mapping) else None


def _fail(key: str, value: Any, expected: str, example: str) -> typing.NoReturn:
    shown = "null" if value is None else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise LabConfigError(f"{key}: expected {expected}, e.g. --set {example}; got {shown}")
