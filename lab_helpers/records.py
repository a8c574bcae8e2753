"""The lab's results file: one JSON line per run (and per rank), appended, never rewritten.

Why JSON lines with one ``write`` per record: a student's lease is expensive, so a crash, a ``kill -9`` or a
full disk must never damage records that are already there. Each record is written by a single append
under an exclusive lock and fsynced; a write that fails half-way is cut back to where it started; and a
damaged trailing line (a kill in the middle of that one write) is skipped by the reader with a warning and
fenced off with a newline before the next append, so it can never swallow a later record. An exception of
any kind in the middle of the write (an interrupt too) cuts the file back to where it started.

Every record is redacted as it is written (tokens from the environment and Hugging Face token shapes), so no
error text or reason ever stores a secret, and ``export-reference`` cannot publish one.
"""

from __future__ import annotations

import fcntl
import json
import math
import numbers
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab_helpers.paths import results_dir
from lab_helpers.record_schema import STATUSES, conform
from lab_helpers.secrets import redact_mapping

RESULTS_FILENAME = "runs.jsonl"



class RecordWriteError(OSError):
    """A record could not be stored; the file is left exactly as it was before the attempt."""


def results_path(path: Path | str | None = None) -> Path:
    """The results file: ``path`` if given, else ``<results_dir>/runs.jsonl``."""
    return Path(path) if path is not None else results_dir() / RESULTS_FILENAME


def _json_safe(value: Any) -> Any:
    """Make a value JSON-clean: NaN and infinities become null (JSON has no NaN); paths, dates and any other
    non-JSON value become strings -- a run that finished must never lose its record to a value's type."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (Path, str)):
        return str(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, numbers.Integral):  # numpy and torch scalars
        return int(value)
    if isinstance(value, numbers.Real):
        return _json_safe(float(value))
    if isinstance(value, (set, frozenset)):
        return [_json_safe(v) for v in sorted(value, key=str)]
    return str(value)


def append_record(record: Mapping[str, Any], *, path: Path | str | None = None) -> Path:
    """Append one record durably and return the file it went to.

    Refuses a record without ``experiment`` or with an unknown ``status`` so that nothing malformed is ever
    stored (a bad record would be there forever: the file is never rewritten).
    """
    if not record.get("experiment"):
        raise ValueError("a record needs an 'experiment'")
    if record.get("status") not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {record.get('status')!r}")
    line = (json.dumps(_json_safe(redact_mapping(record)), sort_keys=True, allow_nan=False) + "\n").encode()
    target = results_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # ranks of one run append at the same moment
        size_before = os.fstat(fd).st_size
        try:
            if size_before and _last_byte(target, size_before) != b"\n":
                line = b"\n" + line  # fence off a damaged tail left by an earlier crash
            _write_all(fd, line)
            os.fsync(fd)
        except BaseException as exc:  # an interrupt half-way too: a half-written record is worse than none
            os.ftruncate(fd, size_before)
            if isinstance(exc, OSError):
                raise RecordWriteError(exc.errno, f"could not store the record in {target}: {exc.strerror}") from exc
            raise
    finally:
        os.close(fd)  # also releases the lock
    return target


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def iter_records(path: Path | str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the stored records in order, skipping (with a warning) any line that is not a whole record."""
    target = results_path(path)
    if not target.exists():
        return
    with open(target, "rb") as fh:
        lines = fh.read().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            where = "trailing line" if number >= len(lines) - 1 else f"line {number}"
            warnings.warn(f"{target}: skipping damaged {where} (an interrupted write)", stacklevel=2)
            continue
        yield record


def read_records(path: Path | str | None = None) -> list[dict[str, Any]]:
    return list(iter_records(path))


def load_results(path: Path | str | None = None):
    """All records as a pandas DataFrame, one row per record (per rank for distributed runs), with every
    field of ``record_schema`` as a column (None where an older record lacks it)."""
    import pandas as pd  # keeps `python -m lab_helpers run` from paying pandas' import time

    records = [conform(record) for record in read_records(path)]  # older records: every field, MFU derived
    if not records:
        return pd.DataFrame(columns=["experiment", "profile", "status", "rank"])
    frame = pd.json_normalize(records, max_level=0)
    for column in ("experiment", "profile", "status", "rank"):
        if column not in frame:
            frame[column] = None
    return frame


# ------------------------------------------------------------------------------------------------ selecting


def latest_runs(df, *, profile: str | None = None, order: Sequence[str] | None = None):
    """The latest record per (experiment, rank), sorted by the lab's experiment order (then rank).

    "Latest" is by ``started_at`` (ISO time); records without one count by their position in the file, so a
    rerun of an experiment replaces the earlier run in every table and plot while the file keeps both.
    ``order`` defaults to the order of configs/experiments/*.yaml; experiments not in it follow, as recorded.
    """
    import pandas as pd

    if df is None or len(df) == 0:
        return empty_runs_frame()
    frame = df.copy()
    for column in ("experiment", "rank", "profile", "started_at", "status"):
        if column not in frame:
            frame[column] = None
    if profile is not None:
        frame = frame[frame["profile"] == profile]
    frame = frame[frame["experiment"].notna()]
    if frame.empty:
        return empty_runs_frame()
    frame["_position"] = range(len(frame))
    frame["_rank"] = pd.to_numeric(frame["rank"], errors="coerce").fillna(0).astype(int)
    frame["_started"] = pd.to_datetime(frame["started_at"], errors="coerce", utc=True, format="ISO8601")
    frame = frame.sort_values(["_started", "_position"], na_position="first", kind="stable")
    frame = frame.groupby(["experiment", "_rank"], sort=False, dropna=False).tail(1)
    rank_of = _order_index(frame["experiment"], order)
    frame["_order"] = frame["experiment"].map(rank_of)
    frame = frame.sort_values(["_order", "_rank"], kind="stable")
    return (
        frame.drop(columns=["_position", "_started", "_order"])
        .rename(columns={"_rank": "rank_n"})
        .reset_index(drop=True)
    )


def _order_index(experiments, order: Sequence[str] | None) -> dict[str, int]:
    wanted = list(order) if order is not None else _lab_order()
    index = {name: i for i, name in enumerate(dict.fromkeys(wanted))}
    for name in experiments:
        index.setdefault(name, len(index))
    return index


def _lab_order() -> list[str]:
    """The notebooks' order (configs/experiments/<section>.yaml); empty when the configs are not at hand."""
    try:
        from lab_helpers.experiments import load_experiments

        return list(load_experiments())
    except Exception:
        return []


def empty_runs_frame():
    import pandas as pd

    return pd.DataFrame(columns=["experiment", "profile", "status", "rank", "rank_n"])
