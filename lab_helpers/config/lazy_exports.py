"""Exports imported on first use (PEP 562): their modules import torch (seconds), and every ``python -m lab_helpers``
command imports these packages. ``lazy_loader`` does this too; eight lines do not earn a dependency.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def attach(module_name: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``exports``: name -> ``".submodule"`` (the attribute of the same name) or ``"package.module.attr"``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        where = exports[name]
        if where.startswith("."):
            value = getattr(importlib.import_module(where, module_name), name)
        else:
            module, _, attribute = where.rpartition(".")
            value = getattr(importlib.import_module(module), attribute)
        vars(sys.modules[module_name])[name] = value  # found once, then an ordinary module attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module_name]), *exports})

    return __getattr__, __dir__
