"""Where the lab keeps its configs, checkpoints, data and results.

One place decides, so notebooks, the CLI and tests agree. Each location can be moved with an environment
variable (tests point ``LAB_RESULTS`` at a temporary folder; an instructor may point ``LAB_CHECKPOINTS``
at a shared disk).
"""

from __future__ import annotations

import os
import stat
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


LOCATION_ENV = ("LAB_RESULTS", "LAB_CHECKPOINTS", "LAB_DATA")
"""The folders a user may move. A relative value is read against the working directory of the process that reads
it; the training process runs in the lab's home, so the launcher makes each absolute once (``absolute_locations``)."""


def _location(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().absolute() if value else default


def checkpoints_dir() -> Path:
    return _location("LAB_CHECKPOINTS", lab_home() / "checkpoints")


def data_dir() -> Path:
    return _location("LAB_DATA", lab_home() / "data")


def results_dir() -> Path:
    return _location("LAB_RESULTS", lab_home() / "results")


def absolute_locations() -> dict[str, str]:
    """``LAB_RESULTS``, ``LAB_CHECKPOINTS`` and ``LAB_DATA`` as this process reads them, made absolute: the
    environment a child started in another working directory needs to read the same folders."""
    return {name: str(_location(name, Path())) for name in LOCATION_ENV if os.environ.get(name)}


def regular_file_inside(folder: Path, relative: str | Path) -> Path | None:
    """``folder/relative`` resolved, if it is a regular file that stays inside ``folder`` once every link is
    followed; else None. A record is data that anyone can edit: its ``timeline_path`` must never make the lab read
    (or export-reference publish) ``/etc/passwd``, a link to a secret, a directory or a FIFO that blocks a read."""
    text = str(relative)
    if not text or Path(text).is_absolute() or ".." in Path(text).parts or "\0" in text:
        return None
    try:
        root = folder.resolve()
        path = (root / text).resolve(strict=True)
        if not path.is_relative_to(root) or not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, an unreadable folder
        return None
    return path


REFERENCE_DIRNAME = "reference_results"


def reference_dir() -> Path:
    """Reference results shipped with the lab: ``<lab home>/reference_results/<gpu-name>.jsonl``."""
    return lab_home() / REFERENCE_DIRNAME
