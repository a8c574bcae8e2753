"""The lab's results file: one JSON line per run (and rank), appended, never rewritten. A lease is expensive, so a
crash, a ``kill -9`` or a full disk must never damage records already there: each is one locked, fsynced append,
cut back on any failure, and a damaged trailing line is skipped and fenced off. Records are redacted as written; a
link planted as ``runs.jsonl`` is never followed; and one hostile line is set aside, never breaking every table.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import numbers
import os
import re
import stat
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from lab_helpers.config.iteration_times import length_split, steady_timing, timed_iterations
from lab_helpers.config.paths import describe_os_error, open_regular, reference_dir, results_dir, write_all
from lab_helpers.config.record_schema import STATUSES, conform, record_unfit, short_repr
from lab_helpers.config.secrets import redact_mapping
from lab_helpers.record.time_bound import AGREEMENT_FIELDS, agree_within_noise, pooled_candidate, rederived

RESULTS_FILENAME = "runs.jsonl"


class RecordWriteError(OSError):
    """A record could not be stored; the file is left exactly as it was before the attempt."""


def results_path(path: Path | str | None = None) -> Path:
    return Path(path) if path is not None else results_dir() / RESULTS_FILENAME


def _json_safe(value: Any) -> Any:
    """A run that finished must never lose its record to a value's type; JSON has no NaN."""
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
    return append_records([record], path=path)


def record_lines(records: Sequence[Mapping[str, Any]]) -> bytes:
    """Each checked first: a malformed record would stay forever, as the file is never rewritten."""
    for record in records:
        if not record.get("experiment"):
            raise ValueError("a record needs an 'experiment'")
        if record.get("status") not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {record.get('status')!r}")
    return b"".join(record_line(record) for record in records)


def record_line(record: Mapping[str, Any]) -> bytes:
    """A record as the one line the file stores: JSON-clean, redacted, keys sorted."""
    return (json.dumps(_json_safe(redact_mapping(record)), sort_keys=True, allow_nan=False) + "\n").encode()


def open_locked(target: Path) -> int:
    """The one lock every writer of a records file takes. A file unlinked while this waited (a copy off a failed
    disk, once indexed) is opened again, so nothing is appended to a file no one can read."""
    while True:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = open_results_file(target)
        except OSError as exc:
            raise RecordWriteError(
                exc.errno, f"could not store the record in {target}: {describe_os_error(exc)}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def append_locked(fd: int, target: Path, data: bytes) -> None:
    """A failure or an interrupt half-way cuts the file back to where it started."""
    size_before = os.fstat(fd).st_size
    try:
        if size_before and _last_byte(target, size_before) != b"\n":
            data = b"\n" + data  # fence off a damaged tail left by an earlier crash
        write_all(fd, data)
        os.fsync(fd)
    except BaseException as exc:  # an interrupt half-way too: a half-written record is worse than none
        os.ftruncate(fd, size_before)
        if isinstance(exc, OSError):
            raise RecordWriteError(exc.errno, f"could not store the record in {target}: {exc.strerror}") from exc
        raise


def open_results_file(target: Path) -> int:
    return open_regular(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def append_records(records: Sequence[Mapping[str, Any]], *, path: Path | str | None = None) -> Path:
    """All stored or none; a file this call created is removed if the write fails, so that a full disk is not left
    with an empty record file that looks like a stored record."""
    data = record_lines(records)
    target = results_path(path)
    existed = os.path.lexists(target)
    fd = open_locked(target)
    try:
        try:
            append_locked(fd, target, data)
        except RecordWriteError:
            if not existed and os.fstat(fd).st_size == 0:
                with contextlib.suppress(OSError):
                    target.unlink()
            raise
    finally:
        os.close(fd)
    return target


def _run_of(frame, row: int) -> str:
    run_id = frame["run_id"].iloc[row] if "run_id" in frame else None
    return f", run {short_repr(run_id)}" if isinstance(run_id, str) else ""


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)


MAX_RESULTS_BYTES = 1 << 30  # a results file holds thousands of runs in a few MB; more is not a results file
_SHOWN_PROBLEMS = 3


def iter_records(path: Path | str | None = None) -> Iterator[dict[str, Any]]:
    """A line at a time: 100,000 records never stand in memory as text beside the records."""
    target = results_path(path)
    fh = _open_results_file(target)
    if fh is None:
        return
    set_aside: list[str] = []
    with fh:
        for where, record, problem in _scan(fh):
            if problem is not None:
                set_aside.append(
                    f"damaged {where} (an interrupted write)" if problem is _DAMAGED else f"{where}: {problem}"
                )
                continue
            yield record
    if set_aside:
        shown = "; ".join(set_aside[:_SHOWN_PROBLEMS]) + ("; ..." if len(set_aside) > _SHOWN_PROBLEMS else "")
        count = f"{len(set_aside)} line" + ("s" if len(set_aside) > 1 else "")
        warnings.warn(f"{target}: set aside {count} that {'is' if len(set_aside) == 1 else 'are'} not a record "
                      f"({shown}); the rest is read", stacklevel=2)  # fmt: skip


_DAMAGED = "bad JSON or UTF-8"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""The only way an ASCII line's JSON can hold text that is not valid Unicode: a ``\\ud800``-``\\udfff`` escape."""


def scan_lines(data: bytes) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """``where`` is "line N" or "trailing line"."""
    return _scan(io.BytesIO(data))


def _scan(lines: Iterable[bytes]) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """Keys and repeated text are shared between the records read: a key's text is half a record's memory."""
    decoder = json.JSONDecoder(object_pairs_hook=_shared_keys())
    pending: list[bytes] = []  # the last two lines: whether they are "trailing" is known at the end
    number = 0
    for raw in lines:
        pending.append(raw)
        if len(pending) > 2:
            number += 1
            if (scanned := _scan_one(decoder, pending.pop(0), f"line {number}")) is not None:
                yield scanned
    parts = number + len(pending) + (1 if not pending or pending[-1].endswith(b"\n") else 0)
    for raw in pending:
        number += 1
        where = "trailing line" if number >= parts - 1 else f"line {number}"
        if (scanned := _scan_one(decoder, raw, where)) is not None:
            yield scanned


def _scan_one(
    decoder: json.JSONDecoder, raw: bytes, where: str
) -> tuple[str, dict[str, Any] | None, str | None] | None:
    if not raw.strip():
        return None
    raw = raw[:-1] if raw.endswith(b"\n") else raw  # the line as text split at newlines gave it
    try:  # json.loads' own steps: the encoding its bytes say, lone surrogates let through to the check below
        record = decoder.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, RecursionError):  # bad JSON or bad UTF-8 (UnicodeDecodeError is a ValueError)
        return where, None, _DAMAGED
    unicode = raw.isascii() and not _SURROGATE_ESCAPE.search(raw)
    if (problem := record_unfit(record, text_is_unicode=unicode)) is not None:
        return where, None, problem
    return where, record, None


def _shared_keys():
    """A string cannot change, so sharing it changes nothing a reader sees."""
    texts: dict[str, str] = {}
    shared = texts.setdefault

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return {shared(key, key): shared(value, value) if value.__class__ is str else value for key, value in pairs}

    return build


def _open_results_file(target: Path) -> BinaryIO | None:
    """None with a warning for a link, a directory, a FIFO (whose read would block) or a file too large."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"{target}: not read: {describe_os_error(exc)}", stacklevel=4)
        return None
    fh = os.fdopen(fd, "rb", buffering=1 << 20)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        fh.close()
        warnings.warn(f"{target}: not read: not a regular file", stacklevel=4)
        return None
    if info.st_size > MAX_RESULTS_BYTES:
        fh.close()
        warnings.warn(f"{target}: not read: {info.st_size / 2**30:.1f} GiB is not a results file", stacklevel=4)
        return None
    return fh


def read_records(path: Path | str | None = None) -> list[dict[str, Any]]:
    return list(iter_records(path))


def write_records_json(out: Any, path: Path | str | None = None) -> None:
    """What the list's ``json.dumps(..., indent=1)`` writes, a record at a time: 100,000 never stand in memory."""
    opening = "[\n "
    for record in iter_records(path):
        out.write(opening + json.dumps(record, indent=1).replace("\n", "\n "))
        opening = ",\n "
    out.write("[]" if opening == "[\n " else "\n]")


def lab_and_reference_records() -> list[dict[str, Any]]:
    """What the time model fits its MFU to on this node."""
    from lab_helpers.config.paths import reference_dir

    paths = [results_dir() / "runs.jsonl", *sorted(reference_dir().glob("*.jsonl"))]
    return [record for path in paths for record in read_records(path)]


def conformed(record: dict[str, Any], folders: Sequence[Path] | None = None) -> dict[str, Any]:
    """Time figures re-derived from what was measured, for old records too, and ``bound`` by today's rule; a
    measured value is never changed."""
    out = conform(record)
    timed = timed_iterations(out)  # once: both derivations read the same timed iterations
    out.update({key: value for key, value in steady_timing(out, timed).items() if value is not None})
    out.update({key: value for key, value in length_split(out, timed).items() if value is not None})  # seq_lens'
    out.update(rederived(out, (results_dir(), reference_dir()) if folders is None else folders))
    return out


def conformed_records(records: Iterable[dict[str, Any]], folders: Sequence[Path] | None = None) -> list[dict[str, Any]]:
    """A ``bound`` agreed within the noise needs the other runs, so this is the step the tables and the key read."""
    if folders is None:
        folders = (results_dir(), reference_dir())
    return agree_within_noise([conformed(record, folders) for record in records])


def _conformed_rows(records: Iterable[dict[str, Any]], folders: Sequence[Path]) -> tuple[list[str], list[list[Any]]]:
    """What ``pd.DataFrame`` makes of the conformed dicts, without 100,000 dicts of 100 keys in memory together."""
    nan = float("nan")
    columns: list[str] = []
    rows: list[list[Any]] = []
    pooled: list[tuple[int, dict[str, Any]]] = []
    for record in records:
        out = conformed(record, folders)
        if (keys := list(out)) == columns:  # the common case: the keys seen already, in their order (conform's)
            rows.append(list(out.values()))
        else:
            columns += [key for key in keys if key not in set(columns)]
            rows.append([out.get(key, nan) for key in columns])
        if pooled_candidate(out):
            pooled.append((len(rows) - 1, {key: out.get(key) for key in AGREEMENT_FIELDS}))
    agree_within_noise([fields for _, fields in pooled])
    if pooled:
        bound, reason = columns.index("bound"), columns.index("bound_reason")
        for index, fields in pooled:
            rows[index][bound], rows[index][reason] = fields["bound"], fields["bound_reason"]
    for row in rows:  # a key first seen late: NaN in the rows before it
        row += [nan] * (len(columns) - len(row))
    return columns, rows


def load_results(path: Path | str | None = None):
    import pandas as pd  # keeps `python -m lab_helpers run` from paying pandas' import time

    folders = (results_path(path).parent, results_dir(), reference_dir())  # where its timelines are
    columns, rows = _conformed_rows(iter_records(path), folders)
    if not rows:
        return pd.DataFrame(columns=["experiment", "profile", "status", "rank"])
    frame = pd.DataFrame(rows, columns=columns)  # as from the dicts: the same conversion of each column
    del rows  # the frame holds the values now
    for column in ("experiment", "profile", "status", "rank"):
        if column not in frame:
            frame[column] = None
    if odd := odd_started_at(frame):
        shown = "; ".join(
            f"record {i + 1} ({short_repr(frame['experiment'].iloc[i])}{_run_of(frame, i)}): started_at "
            f"{short_repr(frame['started_at'].iloc[i])} is {why}"
            for i, why in odd[:_SHOWN_PROBLEMS]
        ) + ("; ..." if len(odd) > _SHOWN_PROBLEMS else "")
        warnings.warn(f"{results_path(path)}: {len(odd)} record(s) with an odd start time ({shown}): a clock ahead "
                      "or behind, or an edited record; tables take runs in the order they were stored, not by "
                      "started_at", stacklevel=2)  # fmt: skip
    return frame


# ------------------------------------------------------------------------------------------------ selecting

CLOCK_SLACK_S = 300.0
"""Two machines' clocks, or one adjusted by NTP, differ by seconds, not by minutes."""

_NAT_TICKS = -(2**63)


def odd_started_at(frame) -> list[tuple[int, str]]:
    """A run is stored once it has ended, so a run stored earlier started before every run stored later had ended;
    where two rows break that, the fewer of the two explanations is shown. Nothing is changed."""
    import datetime as dt

    import pandas as pd

    now = pd.Timestamp(dt.datetime.now(dt.UTC))
    if (found := _odd_in_ticks(frame, now)) is not None:
        return found
    started = _started(frame)  # a start nanoseconds cannot hold (before 1677): Timestamps
    wall = list(pd.to_numeric(frame["wall_s"], errors="coerce")) if "wall_s" in frame else [None] * len(frame)
    slack = pd.Timedelta(seconds=CLOCK_SLACK_S)
    rows = [i for i in range(len(frame)) if not pd.isna(started[i])]
    odd = {i: "in the future" for i in rows if started[i] > now + slack}
    rows = [i for i in rows if i not in odd]  # a start in the future says nothing of the others
    ends = {i: started[i] + pd.Timedelta(seconds=float(wall[i]) if _duration(wall[i]) else 0.0) for i in rows}
    ahead, earliest_end = [], None  # the earliest end of a run stored after the row at hand
    for i in reversed(rows):
        if earliest_end is not None and started[i] > earliest_end + slack:
            ahead.append(i)
        earliest_end = ends[i] if earliest_end is None else min(earliest_end, ends[i])
    behind, latest_start = [], None  # the latest start of a run stored before the row at hand
    for i in rows:
        if latest_start is not None and ends[i] + slack < latest_start:
            behind.append(i)
        latest_start = started[i] if latest_start is None else max(latest_start, started[i])
    if ahead and len(ahead) <= len(behind):
        odd.update({i: "later than the end of a run stored after it" for i in ahead})
    elif behind:
        odd.update({i: "earlier than the start of a run stored before it" for i in behind})
    return sorted(odd.items())


def _odd_in_ticks(frame, now) -> list[tuple[int, str]] | None:
    """Timestamps per row take seconds for 100,000 records; None where a start is beyond nanoseconds' range."""
    import numpy as np
    import pandas as pd

    if "started_at" in frame:
        times = pd.to_datetime(frame["started_at"], errors="coerce", utc=True, format="ISO8601")
        try:
            started = np.asarray(times.dt.as_unit("ns").array.asi8, dtype=np.int64)
        except (OverflowError, ValueError):  # OutOfBoundsDatetime is a ValueError
            return None
    else:
        started = np.full(len(frame), _NAT_TICKS, dtype=np.int64)
    wall = pd.to_numeric(frame["wall_s"], errors="coerce").tolist() if "wall_s" in frame else [None] * len(frame)
    slack = pd.Timedelta(seconds=CLOCK_SLACK_S).value
    valid = started != _NAT_TICKS
    future = valid & (started > now.as_unit("ns").value + slack)
    odd = {i: "in the future" for i in np.flatnonzero(future).tolist()}
    rows = np.flatnonzero(valid & ~future)  # a start in the future says nothing of the others
    if not len(rows):
        return sorted(odd.items())
    starts = started[rows]
    # Timedelta(seconds=...)'s own rounding of each wall_s (pd.to_timedelta rounds some differently)
    ends = starts + np.array([pd.Timedelta(seconds=float(wall[i]) if _duration(wall[i]) else 0.0).value
                              for i in rows.tolist()], dtype=np.int64)  # fmt: skip
    earliest_after = np.append(np.minimum.accumulate(ends[::-1])[::-1][1:], np.iinfo(np.int64).max - slack)
    ahead = rows[starts > earliest_after + slack].tolist()  # later than the end of a run stored after it
    latest_before = np.insert(np.maximum.accumulate(starts)[:-1], 0, _NAT_TICKS + slack)
    behind = rows[ends + slack < latest_before].tolist()  # earlier than the start of a run stored before it
    if ahead and len(ahead) <= len(behind):
        odd.update({i: "later than the end of a run stored after it" for i in ahead})
    elif behind:
        odd.update({i: "earlier than the start of a run stored before it" for i in behind})
    return sorted(odd.items())


def _duration(seconds: Any) -> bool:
    return seconds is not None and 0 <= seconds < 1e7  # NaN fails both comparisons


def _started(frame) -> list:
    import pandas as pd

    if "started_at" not in frame:
        return [pd.NaT] * len(frame)
    return list(pd.to_datetime(frame["started_at"], errors="coerce", utc=True, format="ISO8601"))


_LATEST_KEYS = ("experiment", "rank", "profile", "started_at", "status", "simulated_world_size")


def latest_runs(df, *, profile: str | None = None, order: Sequence[str] | None = None):
    """The latest by position in the file, never a clock: a rerun replaces the earlier run in every table while the
    file keeps both. Chosen on ``_LATEST_KEYS`` alone, as copying every column took most of a comparison's time."""
    import numpy as np
    import pandas as pd

    if df is None or len(df) == 0:
        return empty_runs_frame()
    missing = [column for column in ("experiment", "rank", "profile", "started_at", "status") if column not in df]
    frame = df[[column for column in _LATEST_KEYS if column in df]].copy()
    for column in missing:
        frame[column] = None
    frame["_row"] = np.arange(len(df))
    if profile is not None:
        frame = frame[frame["profile"] == profile]
    frame = frame[frame["experiment"].notna()]
    if frame.empty:
        return empty_runs_frame()
    frame["experiment"] = _marked_simulated(frame)  # never the same row, bar or point as a real N-GPU run
    frame["_rank"] = pd.to_numeric(frame["rank"], errors="coerce").fillna(0).astype(int)
    frame = frame.groupby(["experiment", "_rank"], sort=False, dropna=False).tail(1)
    rank_of = _order_index(frame["experiment"], order)
    frame["_order"] = frame["experiment"].map(rank_of)
    frame = frame.sort_values(["_order", "_rank"], kind="stable")
    latest = df.iloc[frame["_row"].to_numpy()].copy()
    for column in missing:
        latest[column] = None
    if "simulated_world_size" in df:  # renamed where simulated (a list, as _marked_simulated gives it)
        latest["experiment"] = list(frame["experiment"])
    latest["rank_n"] = frame["_rank"].to_numpy()
    return latest.reset_index(drop=True)


def simulated_label(experiment: str, world_size: int) -> str:
    """Its memory is real, its time has no communication in it: it must never pass for a real N-GPU run."""
    return f"{experiment} (simulated rank 0 of {world_size}, no communication)"


def _marked_simulated(frame):
    import numpy as np
    import pandas as pd

    if "simulated_world_size" not in frame:
        return frame["experiment"]
    worlds = pd.to_numeric(frame["simulated_world_size"], errors="coerce")
    names = list(frame["experiment"])
    for i in np.flatnonzero(worlds.gt(1).to_numpy()).tolist():  # NaN is not above 1
        names[i] = simulated_label(str(names[i]), int(worlds.iloc[i]))
    return names


def _order_index(experiments, order: Sequence[str] | None) -> dict[str, float]:
    wanted = list(order) if order is not None else _lab_order()
    index: dict[str, float] = {name: i for i, name in enumerate(dict.fromkeys(wanted))}
    for name in experiments:
        base = str(name).split(" (simulated rank 0 of ", 1)[0]
        # a simulated rank's run right after its experiment's real one
        index.setdefault(name, index[base] + 0.5 if base in index and base != name else len(index))
    return index


def _lab_order() -> list[str]:
    """The notebooks' order (configs/experiments/<section>.yaml); empty when the configs are not at hand."""
    try:
        from lab_helpers.config.experiments import load_experiments

        return list(load_experiments())
    except Exception:
        return []


def empty_runs_frame():
    import pandas as pd

    return pd.DataFrame(columns=["experiment", "profile", "status", "rank", "rank_n"])
