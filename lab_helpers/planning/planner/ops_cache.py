"""Traced op costs and memory plans kept on disk, so that each process does not trace the same steps again (04's
explorer, ``what_if``, the tests and the benchmarks would each take ~40 s on 2 cores; a run's launcher a second).

The key digests all a trace depends on (the spec, the length, the planner's code, torch's and litgpt's versions and
litgpt's code, since 0.5.13 has no ``__version__``): changed code is a miss, never a stale answer. One JSON file per
key, written whole or not at all; JSON, not pickle, since a folder anyone may write must not run code when read.
Entries are read by ``paths.read_lab_file``'s rule and checked against their schema; any problem is a miss said in
one line: the cache never fails a prediction. ``$LAB_TRACE_CACHE``: the folder, or ``0`` for none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from lab_helpers.config.paths import read_lab_file

from .op_costs import OpCost, OpCosts

CACHE_ENV = "LAB_TRACE_CACHE"
FORMAT = 1  # bump when the file's layout changes
ENTRY_MAX_BYTES = 8 * 2**20  # the largest entry (a 7B model's traced ops) is ~70 kB: more is not the cache's


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "").strip()
    if value == "0":
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lab_helpers" / "traced-ops"


@functools.cache
def code_digest() -> str:
    """litgpt's code too: an edited or source install keeps its version."""
    lab = Path(__file__).resolve().parents[2]  # lab_helpers/
    digest = hashlib.sha256(f"{FORMAT} torch {installed('torch')} litgpt {installed('litgpt')}".encode())
    litgpt = importlib.util.find_spec("litgpt")
    litgpt_files = sorted(Path(litgpt.origin).parent.rglob("*.py")) if litgpt and litgpt.origin else []
    for path in sorted([*Path(__file__).parent.glob("*.py"), *(lab / "config").glob("*.py")]) + litgpt_files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def installed(package: str) -> str:
    """``package``'s installed version (its dist-info), or "?" where it has none (run from a source tree)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def key_for(spec_text: str, seq_len: int) -> str:
    return hashlib.sha256(f"{code_digest()}\0{seq_len}\0{spec_text}".encode()).hexdigest()


def load(key: str) -> OpCosts | None:
    data = load_json(key)
    if data is None:
        return None
    try:
        if set(data) != {"micro_batch", "optimizer_step", "notes"} or not _texts(data["notes"]):
            raise ValueError("not the layout store writes")
        return OpCosts(micro_batch=_ops(data["micro_batch"]), optimizer_step=_ops(data["optimizer_step"]),
                       notes=tuple(data["notes"]))  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        return refused(key, str(exc) or type(exc).__name__)


def refused(key: str, why: str) -> None:
    warnings.warn(f"trace cache {key[:12]}: not used ({why}): traced again", stacklevel=3)


def store(key: str, ops: OpCosts) -> None:
    store_json(key, {
        "micro_batch": [[dataclasses.asdict(op), n] for op, n in ops.micro_batch],
        "optimizer_step": [[dataclasses.asdict(op), n] for op, n in ops.optimizer_step],
        "notes": list(ops.notes),
    })  # fmt: skip


def load_json(key: str) -> Any:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        return json.loads(read_lab_file(folder / f"{key}.json", max_bytes=ENTRY_MAX_BYTES, folder=folder))
    except OSError as exc:  # a link, not a regular file, too large: said; no entry or no usable folder: silent
        return refused(key, exc.strerror) if exc.errno in (errno.ELOOP, errno.EINVAL, errno.EFBIG) else None
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, nested past Python's stack
        return refused(key, f"not JSON: {type(exc).__name__}")


def store_json(key: str, data: Any) -> None:
    folder = cache_dir()
    if folder is None:
        return
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as handle:
            temporary = handle.name
            json.dump(data, handle)
        os.replace(temporary, folder / f"{key}.json")
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


_OP_NUMBERS = ("flops", "bytes", "kernels", "tensors", "chunks", "depth")


def _ops(rows: Any) -> tuple[tuple[OpCost, float], ...]:
    ops = []
    for op, n in rows:
        if set(op) != {field.name for field in dataclasses.fields(OpCost)} or not _texts([op["name"]]):
            raise ValueError("an op not of OpCost's fields")
        if not (op["unit"] is None or _texts([op["unit"]])) or not isinstance(op["depth"], int):
            raise ValueError(f"op {op['name']}: a unit or depth of another type")
        if not all(_count(value) for value in [n, *(op[name] for name in _OP_NUMBERS)]):
            raise ValueError(f"op {op['name']}: a count that is no finite number >= 0")
        ops.append((OpCost(**op), n))
    return tuple(ops)


def _count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _texts(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)
