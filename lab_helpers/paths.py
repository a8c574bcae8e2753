"""Where the lab keeps its configs, checkpoints, data and results.

One place decides, so notebooks, the CLI and tests agree. Each location can be moved with an environment
variable (tests point ``LAB_RESULTS`` at a temporary folder; an instructor may point ``LAB_CHECKPOINTS``
at a shared disk).
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def lab_home() -> Path:
    """The lab's root: ``$LAB_HOME``, else the checkout this package lives in, else the working directory."""
    if env := os.environ.get("LAB_HOME"):
        return Path(env).expanduser().resolve()
    checkout = _PACKAGE_DIR.parent
    if (checkout / "configs").is_dir():
        return checkout
    return Path.cwd()


def configs_dir() -> Path:
    return lab_home() / "configs"


def checkpoints_dir() -> Path:
    return Path(os.environ.get("LAB_CHECKPOINTS") or lab_home() / "checkpoints")


def data_dir() -> Path:
    return Path(os.environ.get("LAB_DATA") or lab_home() / "data")


def results_dir() -> Path:
    return Path(os.environ.get("LAB_RESULTS") or lab_home() / "results")


REFERENCE_DIRNAME = "reference_results"


def reference_dir() -> Path:
    """Reference results shipped with the lab: ``<lab home>/reference_results/<gpu-name>.jsonl``."""
    return lab_home() / REFERENCE_DIRNAME
