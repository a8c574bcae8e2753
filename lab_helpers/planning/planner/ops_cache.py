"""Traced op costs and memory plans kept on disk, so that each process does not trace the same steps again.

Why: the time model is fitted to the shipped records by tracing each record's training step on fake tensors
(``tracer.trace``), seconds per model on a CPU, and 04's explorer, ``what_if``, the tests and the benchmarks each
did it again in their own process (about 40 s each on a 2-core machine). What a trace gives is a pure function of
the spec (every field, the model's config included), the sequence length, the planner's code and the torch and
litgpt that ran it, so the key is a digest of all of these: changed code or another torch is a miss, never a stale
answer. A file per key, written whole or not at all (a temporary file renamed), JSON rather than pickle: a
folder anyone may write to must not run code when read. Any problem reading or writing is a miss: the cache
never fails a prediction. ``$LAB_TRACE_CACHE``: the folder (default: ``$XDG_CACHE_HOME/lab_helpers/traced-ops``,
else ``~/.cache/...``), or ``0`` for none. Standard library only: joblib's ``Memory`` would add a dependency and
pickle. Memory plans (``plan.predict``) are kept the same way, under their own keys: every run's launcher, each
notebook kernel and each CLI call traced its run's plan again (a second or more each).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .op_costs import OpCost, OpCosts

CACHE_ENV = "LAB_TRACE_CACHE"
FORMAT = 1  # bump when the file's layout changes


def cache_dir() -> Path | None:
    """Where traced ops are kept, or None where ``$LAB_TRACE_CACHE`` is ``0``."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value == "0":
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lab_helpers" / "traced-ops"


@functools.cache
def code_digest() -> str:
    """A digest of what a trace depends on besides its spec: the planner's code, the lab's config code it reads
    (recipe defaults, LoRA settings), and the torch and litgpt versions."""
    import litgpt
    import torch

    lab = Path(__file__).resolve().parents[2]  # lab_helpers/
    digest = hashlib.sha256(f"{FORMAT} {torch.__version__} {getattr(litgpt, '__version__', '?')}".encode())
    for path in sorted([*Path(__file__).parent.glob("*.py"), *(lab / "config").glob("*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def key_for(spec_text: str, seq_len: int) -> str:
    """The file name of one trace: the spec's ``repr`` (every field), the length and ``code_digest``."""
    return hashlib.sha256(f"{code_digest()}\0{seq_len}\0{spec_text}".encode()).hexdigest()


def load(key: str) -> OpCosts | None:
    """The traced ops kept under ``key``, or None (not there, unreadable, another layout)."""
    data = load_json(key)
    try:
        return OpCosts(
            micro_batch=_ops(data["micro_batch"]),
            optimizer_step=_ops(data["optimizer_step"]),
            notes=tuple(str(note) for note in data["notes"]),
        )
    except (ValueError, KeyError, TypeError):  # None (a miss) included
        return None


def store(key: str, ops: OpCosts) -> None:
    """Keep ``ops`` under ``key`` (``store_json``)."""
    store_json(key, {
        "micro_batch": [[dataclasses.asdict(op), n] for op, n in ops.micro_batch],
        "optimizer_step": [[dataclasses.asdict(op), n] for op, n in ops.optimizer_step],
        "notes": list(ops.notes),
    })  # fmt: skip


def load_json(key: str) -> Any:
    """What ``store_json`` kept under ``key``, or None (no cache, not there, unreadable)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        return json.loads((folder / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def store_json(key: str, data: Any) -> None:
    """Keep ``data`` under ``key``: written to a temporary file and renamed, so a reader sees all of it or none;
    an unusable folder keeps nothing and raises nothing."""
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


def _ops(rows: Any) -> tuple[tuple[OpCost, float], ...]:
    return tuple((OpCost(**op), n) for op, n in rows)
