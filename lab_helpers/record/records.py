"""The lab's results file: one JSON line per run (and per rank), appended, never rewritten.

Why JSON lines with one ``write`` per record: a student's lease is expensive, so a crash, a ``kill -9`` or a
full disk must never damage records that are already there. Each record is written by a single append
under an exclusive lock and fsynced; a write that fails half-way is cut back to where it started; and a
damaged trailing line (a kill in the middle of that one write) is skipped by the reader with a warning and
fenced off with a newline before the next append, so it can never swallow a later record. An exception of
any kind in the middle of the write (an interrupt too) cuts the file back to where it started.

Every record is redacted as it is written (tokens from the environment and Hugging Face token shapes), so no
error text or reason ever stores a secret, and ``export-reference`` cannot publish one.

The file is opened without following a symbolic link (``O_NOFOLLOW``) and must be a regular file: a link planted
as ``runs.jsonl`` must not make a run (perhaps as root) append to the file it points at. When the file cannot be
opened or written at the end of a run, ``store_records`` puts the record in a fallback file and says how to merge
it back. Readers set aside, with one warning that counts them, every line that is not a record the schema
accepts (``record_schema.record_unfit``): one hostile line must not break every table.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import math
import numbers
import os
import re
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_helpers.config.iteration_times import steady_timing
from lab_helpers.config.paths import describe_os_error, open_regular, results_dir
from lab_helpers.config.record_schema import STATUSES, conform, record_unfit
from lab_helpers.config.secrets import redact_mapping

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
    return append_records([record], path=path)


def record_lines(records: Sequence[Mapping[str, Any]]) -> bytes:
    """Records as the lines a records file stores (``_record_line``), each checked first: a record without
    ``experiment`` or with an unknown ``status`` is refused (ValueError), so that nothing malformed is ever stored."""
    for record in records:
        if not record.get("experiment"):
            raise ValueError("a record needs an 'experiment'")
        if record.get("status") not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {record.get('status')!r}")
    return b"".join(_record_line(record) for record in records)


def _record_line(record: Mapping[str, Any]) -> bytes:
    """A record as the one line the file stores: JSON-clean, redacted, keys sorted."""
    return (json.dumps(_json_safe(redact_mapping(record)), sort_keys=True, allow_nan=False) + "\n").encode()


def _open_locked(target: Path) -> int:
    """An fd for appending to ``target`` (``open_results_file``) holding its exclusive lock: the one lock every
    writer of a records file takes (ranks of one run append at the same moment; ``merge_records`` holds it across
    its whole merge). A file unlinked while this waited for its lock (a fallback file that a merge took) is opened
    again, so that nothing is appended to a file no one can read any more. Raises RecordWriteError."""
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


def _append_locked(fd: int, target: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to the locked ``fd`` in one write, fsynced; a failure or an interrupt half-way
    cuts the file back to where it started."""
    size_before = os.fstat(fd).st_size
    try:
        if size_before and _last_byte(target, size_before) != b"\n":
            data = b"\n" + data  # fence off a damaged tail left by an earlier crash
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException as exc:  # an interrupt half-way too: a half-written record is worse than none
        os.ftruncate(fd, size_before)
        if isinstance(exc, OSError):
            raise RecordWriteError(exc.errno, f"could not store the record in {target}: {exc.strerror}") from exc
        raise


def open_results_file(target: Path) -> int:
    """An fd for appending to ``target``: created if missing, by the rule of every file the lab appends to
    (``paths.open_regular``: never through a symbolic link, never anything but a regular file). Raises OSError."""
    return open_regular(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def append_records(records: Sequence[Mapping[str, Any]], *, path: Path | str | None = None) -> Path:
    """``append_record`` for several records (a run's ranks) in one fenced, fsynced write: all are stored, or none.

    A file this call created is removed again when the write fails, so that a full disk is not left with an empty
    fallback file that looks like a stored record."""
    data = record_lines(records)
    target = results_path(path)
    existed = os.path.lexists(target)
    fd = _open_locked(target)
    try:
        try:
            _append_locked(fd, target, data)
        except RecordWriteError:
            if not existed and os.fstat(fd).st_size == 0:
                with contextlib.suppress(OSError):
                    target.unlink()
            raise
    finally:
        os.close(fd)
    return target


_DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO}
"""A file system that failed with one of these takes no fallback either: the next place is off it."""


def state_dir() -> Path | None:
    """``$XDG_STATE_HOME/lab``, else ``~/.local/state/lab``: where a record goes when the results folder's file
    system takes nothing (None: no home folder is known)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(state):
        return Path(state) / "lab"
    try:
        return Path.home() / ".local" / "state" / "lab"
    except (RuntimeError, KeyError):
        return None


def temp_fallback_dir() -> Path:
    """This user's folder in the system's temporary directory: the last place a record can go."""
    return Path(tempfile.gettempdir()) / f"lab-{os.getuid()}"


def fallback_places(run_id: str, run_dir: Path | None) -> list[Path]:
    """Where ``store_records`` tries a run's record after the results file, in order: the run's own folder, then
    places off the results folder's file system (the state folder, the system's temporary directory)."""
    places = [] if run_dir is None else [run_dir / _RUN_FOLDER_FALLBACK]
    places += [folder / f"runs.{run_id}.jsonl" for folder in (state_dir(), temp_fallback_dir()) if folder is not None]
    return places


def store_records(records: Sequence[Mapping[str, Any]], *, path: Path | str | None, run_dir: Path | None) -> Path:
    """The one place that stores a run's records: the results file; where that fails, the run's folder, then a
    fallback off the failed file system (``fallback_places``); one line says where and how to merge it back.

    The records go in one write (all or none) wherever they land. A file system that failed for want of room or
    because it turned read-only (``_DISK_ERRORS``) is not tried again for a fallback, and no empty file is left on
    it. Raises RecordWriteError (one line naming every place tried) only when no place at all took the records.
    """
    target = results_path(path)
    run_id = str(records[0].get("run_id") or "run") if records else "run"
    tried: list[tuple[Path, RecordWriteError]] = []
    failed_devices: set[int] = set()
    for place in [target, *fallback_places(run_id, run_dir)]:
        if place != target and (_device_of(place) in failed_devices or not _private_folder(place.parent)):
            continue
        try:
            append_records(records, path=place)
        except RecordWriteError as exc:
            tried.append((place, exc))
            if exc.errno in _DISK_ERRORS and (device := _device_of(place)) is not None:
                failed_devices.add(device)
            continue
        if place != target:
            first = tried[0][1] if tried else None
            why = first.strerror if first is not None else f"could not store the record in {target}"
            _say(f"lab: {why}; the record is in {place} instead: merge it back with "
                 f"`python -m lab_helpers merge-records {place}`")  # fmt: skip
        return place
    first = tried[0][1]
    also = ", ".join(str(place) for place, _ in tried[1:])
    raise RecordWriteError(first.errno, first.strerror + (f"; nor in {also}" if also else ""))


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr is gone: the record is stored all the same
        pass


def _device_of(path: Path) -> int | None:
    """The device of ``path``, or of its nearest folder that exists."""
    for folder in (path, *path.parents):
        try:
            return os.stat(folder).st_dev
        except OSError:
            continue
    return None


def _private_folder(folder: Path) -> bool:
    """False for the system-temp fallback folder when it is not this user's own folder (another user's, a link):
    /tmp is shared, and a record must not be written where another user chose."""
    if folder != temp_fallback_dir():
        return True
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


FALLBACK_NAMES = "runs.<run_id>.jsonl or runs/<run_id>/record.jsonl"
_FALLBACK_FILE = re.compile(r"runs\.(?P<run_id>[^/]+)\.jsonl")
_RUN_FOLDER_FALLBACK = "record.jsonl"


@dataclass
class MergeResult:
    """What ``merge_records`` did: records appended, records already there, and whether the fallback was removed
    (only when every one of its lines is in the results file afterwards) or why it was kept."""

    source: Path
    target: Path
    run_id: str
    merged: int = 0
    already_there: int = 0
    removed: bool = False
    kept_because: str | None = None  # None and not removed: another merge took the file meanwhile

    def line(self) -> str:
        said = f"merged {self.merged} record(s) of run {self.run_id} into {self.target}"
        if self.already_there:
            said += f" ({self.already_there} already there)"
        if self.removed:
            return f"{said}; removed {self.source}"
        if self.kept_because is not None:
            return f"{said}; kept {self.source}: {self.kept_because}"
        return f"{said}; {self.source} was merged and removed meanwhile by another merge-records"


def merge_records(source: Path | str, *, path: Path | str | None = None) -> MergeResult:
    """Append the records of a fallback file (``store_records``) to the results file, then remove the fallback.

    What is merged is only what the lab itself writes as a fallback: a regular file named ``runs.<run_id>.jsonl``
    or ``<run_id>/record.jsonl`` whose every record is one of that run's (one per rank); anything else (the results
    file itself or a link to it, a notebook, a reference file, a backup of many runs) is refused with a
    LabConfigError and left as it is. The whole merge holds the results file's lock (the one ``append_record``
    takes) and the fallback's, so two merges of one file at once append it once. Records already there (same
    ``run_id`` and ``rank``) are not appended again. Each appended record is marked ``merged_at``: readers place it
    by when it started (``record_order``), so an old run merged late never hides a newer one. The fallback is
    unlinked only when every one of its lines is a record that is in the results file afterwards; else it is kept
    and ``kept_because`` says why. Raises RecordWriteError when the results file cannot take the records (the
    fallback is then kept as it is).
    """
    source = Path(os.path.abspath(source))
    target = Path(os.path.abspath(results_path(path)))
    run_id = _fallback_run_id(source)
    src_fd = _open_fallback(source)
    try:
        _refuse_the_target(source, os.fstat(src_fd), target)
        _fallback_records(source, _read_fd(src_fd, source), run_id)  # refused before the results file is touched
        fd = _open_locked(target)
        try:
            fcntl.flock(src_fd, fcntl.LOCK_EX)  # a rank still appending to its fallback waits, then writes anew
            info = os.fstat(src_fd)
            _refuse_the_target(source, info, target, os.fstat(fd))
            result = MergeResult(source, target, run_id)
            if info.st_nlink == 0:  # another merge took it while this one waited for the lock
                return result
            records, damaged = _fallback_records(source, _read_fd(src_fd, source), run_id)
            stored = {(r.get("run_id"), r.get("rank")) for r in iter_records(target)}
            new: dict[tuple, bytes] = {}
            merged_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            for record in records:
                key = (record.get("run_id"), record.get("rank"))
                if key in stored or key in new:
                    result.already_there += 1
                else:  # marked: it takes its place among the records by its start (record_order), not at the end
                    new[key] = _record_line({**record, "merged_at": record.get("merged_at") or merged_at})
            if new:
                _append_locked(fd, target, b"".join(new.values()))
            result.merged = len(new)
            stored = {(r.get("run_id"), r.get("rank")) for r in iter_records(target)}
            missing = sum((r.get("run_id"), r.get("rank")) not in stored for r in records)
            if damaged:
                result.kept_because = f"{damaged[0]}{' and more' if len(damaged) > 1 else ''} (look, then remove it)"
            elif missing:
                result.kept_because = f"{missing} of its records are not in {target} after the merge"
            else:
                source.unlink()  # still under the fallback's lock: no rank's record can land in it unseen
                result.removed = True
            return result
        finally:
            os.close(fd)
    finally:
        os.close(src_fd)


def _not_a_fallback(source: Path, why: str) -> Exception:
    from lab_helpers.config.config_error import LabConfigError

    return LabConfigError(f"{source}: {why}; merge-records takes only a fallback file a run named "
                          f"({FALLBACK_NAMES}); nothing was changed")  # fmt: skip


def _fallback_run_id(source: Path) -> str:
    """The run a fallback file's name gives, or a LabConfigError for a name the lab never gives one."""
    if source.name == _RUN_FOLDER_FALLBACK:
        return source.parent.name
    if match := _FALLBACK_FILE.fullmatch(source.name):
        return match.group("run_id")
    raise _not_a_fallback(source, "not the name of a fallback file")


def _open_fallback(source: Path) -> int:
    """A read-only fd on ``source``: a regular file, not a link, no larger than a results file may be."""
    from lab_helpers.config.config_error import LabConfigError

    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LabConfigError(f"{source}: no such records file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_fallback(source, "a symbolic link") from None
        raise LabConfigError(f"{source}: not read ({describe_os_error(exc)}); kept as it is") from None
    info = os.fstat(fd)
    problem = (
        "not a regular file" if not stat.S_ISREG(info.st_mode)
        else f"{info.st_size / 2**30:.1f} GiB, more than one run's records" if info.st_size > MAX_RESULTS_BYTES
        else None
    )  # fmt: skip
    if problem is not None:
        os.close(fd)
        raise _not_a_fallback(source, problem)
    return fd


def _refuse_the_target(source: Path, info: os.stat_result, target: Path, target_info=None) -> None:
    """Never merge the results file into itself (the same file by any name: a link, a hard link, ``..``)."""
    try:
        target_info = target_info or os.stat(target)
    except OSError:
        return
    if (info.st_dev, info.st_ino) == (target_info.st_dev, target_info.st_ino):
        raise _not_a_fallback(source, f"the results file itself ({target})")


def _read_fd(fd: int, source: Path) -> bytes:
    from lab_helpers.config.config_error import LabConfigError

    chunks, offset = [], 0
    try:
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
    except OSError as exc:
        raise LabConfigError(f"{source}: not read ({describe_os_error(exc)}); kept as it is") from None
    return b"".join(chunks)


def _fallback_records(source: Path, data: bytes, run_id: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of a fallback file and its lines that are not records (a kill in the middle of a write); a
    LabConfigError when it holds no record, or a record of another run than its name gives."""
    records, damaged = [], []
    for where, record, problem in _scan(data):
        if problem is not None:
            damaged.append(f"{where} is not a record ({problem})")
        elif record.get("run_id") != run_id:
            raise _not_a_fallback(source, f"{where} is a record of run {_shown(record.get('run_id'))}, not of run "
                                          f"{run_id} its name gives")  # fmt: skip
        else:
            records.append(record)
    if not records:
        raise _not_a_fallback(source, "no record in it" + (f" ({damaged[0]})" if damaged else ""))
    return records, damaged


def _run_of(frame, row: int) -> str:
    run_id = frame["run_id"].iloc[row] if "run_id" in frame else None
    return f", run {_shown(run_id)}" if isinstance(run_id, str) else ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


MAX_RESULTS_BYTES = 1 << 30  # a results file holds thousands of runs in a few MB; more is not a results file
_SHOWN_PROBLEMS = 3


def iter_records(path: Path | str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the stored records in order, setting aside every line that is not a record the schema accepts
    (a damaged line, a hand-edited or hostile one) with one warning that counts them and names the first few."""
    target = results_path(path)
    data = _read_results_file(target)
    if data is None:
        return
    set_aside: list[str] = []
    for where, record, problem in _scan(data):
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


def _scan(data: bytes) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """(where, record, None) for each line that is a record the schema accepts, (where, None, why not) for each
    other non-blank line; ``where`` is "line N" or "trailing line"."""
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = "trailing line" if number >= len(lines) - 1 else f"line {number}"
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # bad JSON or bad UTF-8 (UnicodeDecodeError is a ValueError)
            yield where, None, _DAMAGED
            continue
        if (problem := record_unfit(record)) is not None:
            yield where, None, problem
            continue
        yield where, record, None


def _read_results_file(target: Path) -> bytes | None:
    """The file's bytes, or None (with a warning) when it is not a regular file one may read: a symbolic link,
    a directory, a FIFO (whose read would block), a device, or a file too large to be a results file."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"{target}: not read: {describe_os_error(exc)}", stacklevel=3)
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            warnings.warn(f"{target}: not read: not a regular file", stacklevel=3)
            return None
        if info.st_size > MAX_RESULTS_BYTES:
            warnings.warn(f"{target}: not read: {info.st_size / 2**30:.1f} GiB is not a results file", stacklevel=3)
            return None
        return fh.read()


def read_records(path: Path | str | None = None) -> list[dict[str, Any]]:
    return list(iter_records(path))


def lab_and_reference_records() -> list[dict[str, Any]]:
    """The lab's own results (``$LAB_RESULTS/runs.jsonl``) and the shipped reference results: what the time
    model fits its MFU to on this node (``plan_command.predict_step_time`` passes them in)."""
    from lab_helpers.config.paths import reference_dir

    paths = [results_dir() / "runs.jsonl", *sorted(reference_dir().glob("*.jsonl"))]
    return [record for path in paths for record in read_records(path)]


def conformed(record: dict[str, Any]) -> dict[str, Any]:
    """A stored record as every reader sees it: every schema field present, the time figures derived from what it
    measured (``iteration_times.steady_timing``: the same arithmetic for a record written today and for an old
    one, whose stored tokens/s and MFU came from ``train_s``); a figure it cannot derive keeps what the record
    stored. Measured values are never changed."""
    out = conform(record)
    out.update({key: value for key, value in steady_timing(out).items() if value is not None})
    return out


def load_results(path: Path | str | None = None):
    """All records as a pandas DataFrame, one row per record (per rank for distributed runs), with every
    field of ``record_schema`` as a column (None where an older record lacks it)."""
    import pandas as pd  # keeps `python -m lab_helpers run` from paying pandas' import time

    records = [conformed(record) for record in read_records(path)]
    if not records:
        return pd.DataFrame(columns=["experiment", "profile", "status", "rank"])
    frame = pd.DataFrame(records)  # json_normalize(max_level=0) is this after a deep copy of every record
    for column in ("experiment", "profile", "status", "rank"):
        if column not in frame:
            frame[column] = None
    if odd := odd_started_at(frame):
        shown = "; ".join(
            f"record {i + 1} ({_shown(frame['experiment'].iloc[i])}{_run_of(frame, i)}): started_at "
            f"{_shown(frame['started_at'].iloc[i])} is {why}"
            for i, why in odd[:_SHOWN_PROBLEMS]
        ) + ("; ..." if len(odd) > _SHOWN_PROBLEMS else "")
        warnings.warn(f"{results_path(path)}: {len(odd)} record(s) with an odd start time ({shown}): a clock ahead "
                      "or behind, or an edited record; tables take runs in the order they were stored, not by "
                      "started_at", stacklevel=2)  # fmt: skip
    return frame


# ------------------------------------------------------------------------------------------------ selecting

LATE_MARKS = ("recovered", "merged_at")
"""Fields of a record the lab appends after runs that started later may be stored: a run recovered from its run
folder (``recovery``), a fallback file merged back (``merge_records``). Such a record takes its place in the order
of records by when it started, never after a run that started after it."""

CLOCK_SLACK_S = 300.0
"""How far a ``started_at`` may run ahead of the records after it (or of now) before it is shown as odd: clocks
of two machines, or one adjusted by NTP, differ by seconds, not by minutes."""


def record_order(frame) -> list[float]:
    """Each row's place in the order of records: its position in the file (append-only: a later line is a later
    run, whatever any clock said), so that a clock ahead or an edited ``started_at`` hides nothing. A row appended
    late by the lab itself (``LATE_MARKS``) is placed just before the first ordinary row that started after it.
    Linear in the rows, bar one binary search per late row."""
    import bisect

    import pandas as pd

    rows = len(frame)
    started = _started(frame)
    late = _late(frame)
    ordinary = [i for i in range(rows) if not late[i]]
    running_max, peaks = None, []  # the latest start among ordinary rows so far (NaT counts as none)
    for i in ordinary:
        if not pd.isna(started[i]) and (running_max is None or started[i] > running_max):
            running_max = started[i]
        peaks.append(running_max.value if running_max is not None else -(2**63))
    order = [float(i) for i in range(rows)]
    for i in range(rows):
        if late[i] and not pd.isna(started[i]):
            j = bisect.bisect_right(peaks, started[i].value)  # the first ordinary row that started after it
            if j < len(ordinary) and ordinary[j] < i:
                order[i] = ordinary[j] - 0.5 + i / (2.0 * rows + 1)  # before it; late rows keep their own order
    return order


def odd_started_at(frame) -> list[tuple[int, str]]:
    """(row, why) for each ordinary row whose ``started_at`` cannot be when it started -- a clock ahead or behind,
    an edited record. A run is stored once it has ended, so a run stored earlier started before every run stored
    later had ended: where two rows break that, the fewer of the two explanations is shown (the rows ahead of
    the runs stored after them, or the rows behind the runs stored before them), and any start in the future.
    Tables order by ``record_order`` whatever this finds; nothing is changed."""
    import datetime as dt

    import pandas as pd

    started, late = _started(frame), _late(frame)
    wall = list(pd.to_numeric(frame["wall_s"], errors="coerce")) if "wall_s" in frame else [None] * len(frame)
    slack = pd.Timedelta(seconds=CLOCK_SLACK_S)
    now = pd.Timestamp(dt.datetime.now(dt.UTC))
    rows = [i for i in range(len(frame)) if not late[i] and not pd.isna(started[i])]
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


def _duration(seconds: Any) -> bool:
    return seconds is not None and 0 <= seconds < 1e7  # NaN fails both comparisons


def _started(frame) -> list:
    import pandas as pd

    if "started_at" not in frame:
        return [pd.NaT] * len(frame)
    return list(pd.to_datetime(frame["started_at"], errors="coerce", utc=True, format="ISO8601"))


def _late(frame) -> list[bool]:
    late = [False] * len(frame)
    for mark in LATE_MARKS:
        if mark in frame:
            late = [was or not _missing(value) for was, value in zip(late, frame[mark], strict=True)]
    return late


def _missing(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, float) and value != value)


def latest_runs(df, *, profile: str | None = None, order: Sequence[str] | None = None):
    """The latest record per (experiment, rank), sorted by the lab's experiment order (then rank).

    "Latest" is the last in the order of records (``record_order``: the position in the file, never a clock), so a
    rerun of an experiment replaces the earlier run in every table and plot while the file keeps both, and a
    ``started_at`` ahead of its time (``odd_started_at``) hides nothing.
    ``order`` defaults to the order of configs/experiments/*.yaml; experiments not in it follow, as recorded.
    """
    import pandas as pd

    if df is None or len(df) == 0:
        return empty_runs_frame()
    frame = df.copy()
    for column in ("experiment", "rank", "profile", "started_at", "status"):
        if column not in frame:
            frame[column] = None
    frame["_position"] = record_order(frame.reset_index(drop=True))
    if profile is not None:
        frame = frame[frame["profile"] == profile]
    frame = frame[frame["experiment"].notna()]
    if frame.empty:
        return empty_runs_frame()
    frame["experiment"] = _marked_simulated(frame)  # never the same row, bar or point as a real N-GPU run
    frame["_rank"] = pd.to_numeric(frame["rank"], errors="coerce").fillna(0).astype(int)
    frame = frame.sort_values("_position", kind="stable")
    frame = frame.groupby(["experiment", "_rank"], sort=False, dropna=False).tail(1)
    rank_of = _order_index(frame["experiment"], order)
    frame["_order"] = frame["experiment"].map(rank_of)
    frame = frame.sort_values(["_order", "_rank"], kind="stable")
    return frame.drop(columns=["_position", "_order"]).rename(columns={"_rank": "rank_n"}).reset_index(drop=True)


def simulated_label(experiment: str, world_size: int) -> str:
    """How every table and plot names a simulated rank's run (``simulated_world_size``): its memory is real, its
    time has no communication in it, and it must never pass for a real N-GPU run."""
    return f"{experiment} (simulated rank 0 of {world_size}, no communication)"


def _marked_simulated(frame):
    """The experiment column with simulated ranks' runs renamed by ``simulated_label``."""
    import pandas as pd

    if "simulated_world_size" not in frame:
        return frame["experiment"]
    worlds = pd.to_numeric(frame["simulated_world_size"], errors="coerce")
    return [
        simulated_label(str(name), int(world)) if pd.notna(world) and world > 1 else name
        for name, world in zip(frame["experiment"], worlds, strict=True)
    ]


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
