"""Value ranges of a resolved recipe, checked before anything starts: the key, the allowed range, what was given.

Why: ``recipe_types`` checks types, and a well-typed value can still be impossible. ``train.epochs=0`` and
``train.max_seq_length=0`` trained nothing and were recorded ``ok``; a negative ``max_seq_length``,
``log_interval=0``, ``num_workers=-1`` or a negative learning rate started a training process that failed
after its model load. Each is refused here in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lab_helpers.config_error import LabConfigError

# (dotted key, smallest allowed, strictly above the smallest?, None allowed?); train.max_steps and
# train.lr_warmup_steps are checked together in experiments.check_batch_and_precision (max_steps > warmup >= 1)
_RANGES: tuple[tuple[str, float, bool, bool], ...] = (
    ("train.epochs", 1, False, True),
    ("train.max_tokens", 1, False, True),
    ("train.max_seq_length", 1, False, True),
    ("train.log_interval", 1, False, False),
    ("train.save_interval", 1, False, True),
    ("train.max_norm", 0, True, True),
    ("train.min_lr", 0, False, True),
    ("eval.interval", 1, False, True),
    ("eval.max_iters", 0, False, True),
    ("eval.max_new_tokens", 0, False, True),
    ("data.init_args.num_workers", 0, False, True),
    ("optimizer.init_args.lr", 0, True, True),
    ("optimizer.init_args.weight_decay", 0, False, True),
    ("lora_r", 1, False, True),
    ("lora_alpha", 0, True, True),
)


def check_recipe_ranges(recipe: Mapping[str, Any]) -> None:
    """Raise LabConfigError for the first number outside its range (types are ``recipe_types``' job: a value
    that is not a number is left to it)."""
    for key, low, strict, nullable in _RANGES:
        present, value = _lookup(recipe, key)
        if not present or (value is None and nullable):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        ok = math.isfinite(value) and (value > low if strict else value >= low)
        if not ok:
            allowed = f"> {low}" if strict else f">= {low}"
            raise LabConfigError(f"{key} must be {allowed}; got {value!r} (e.g. --set {key}={_example(key, low)})")
    dropout = _lookup(recipe, "lora_dropout")[1]
    if isinstance(dropout, int | float) and not isinstance(dropout, bool) and not 0 <= dropout < 1:
        raise LabConfigError(f"lora_dropout must be in [0, 1); got {dropout!r} (e.g. --set lora_dropout=0.05)")


def _lookup(recipe: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = recipe
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _example(key: str, low: float) -> str:
    return {"optimizer.init_args.lr": "0.0002", "train.max_norm": "1.0", "lora_alpha": "16"}.get(key, str(int(low) or 1))
