"""Where a run's records go when the results file takes none (a full disk, a read-only mount, a link planted as
``runs.jsonl``): the run's own folder, else off that file system; ``merge-records`` brings such a file back.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_helpers.config.paths import describe_os_error
from lab_helpers.record.records import (
    MAX_RESULTS_BYTES,
    RecordWriteError,
    append_locked,
    append_records,
    iter_records,
    open_locked,
    record_line,
    results_path,
    scan_lines,
    short_repr,
)

_DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO}
"""A file system that failed with one of these takes no fallback either: the next place is off it."""


def state_dir() -> Path | None:
    state = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(state):
        return Path(state) / "lab"
    try:
        return Path.home() / ".local" / "state" / "lab"
    except (RuntimeError, KeyError):
        return None


def temp_fallback_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"lab-{os.getuid()}"


def fallback_places(run_id: str, run_dir: Path | None) -> list[Path]:
    """The run's own folder first, then places off the results folder's file system."""
    places = [] if run_dir is None else [run_dir / _RUN_FOLDER_FALLBACK]
    places += [folder / f"runs.{run_id}.jsonl" for folder in (state_dir(), temp_fallback_dir()) if folder is not None]
    return places


def store_records(records: Sequence[Mapping[str, Any]], *, path: Path | str | None, run_dir: Path | None) -> Path:
    """A file system that failed for want of room or turned read-only is not tried again for a fallback.
    Raises RecordWriteError only when no place took the records."""
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
    for folder in (path, *path.parents):
        try:
            return os.stat(folder).st_dev
        except OSError:
            continue
    return None


def _private_folder(folder: Path) -> bool:
    """/tmp is shared: a record must not be written in a folder another user chose."""
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
    """Only a file the lab writes as one run's fallback (never the results file, a reference, a backup of many
    runs). Both files' locks are held, so two merges append once; ``merged_at`` lets readers place a record by its
    start, so an old run merged late never hides a newer one. The fallback goes only once all of it is stored."""
    source = Path(os.path.abspath(source))
    target = Path(os.path.abspath(results_path(path)))
    run_id = _fallback_run_id(source)
    src_fd = _open_fallback(source)
    try:
        _refuse_the_target(source, os.fstat(src_fd), target)
        _fallback_records(source, _read_fd(src_fd, source), run_id)  # refused before the results file is touched
        fd = open_locked(target)
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
                    new[key] = record_line({**record, "merged_at": record.get("merged_at") or merged_at})
            if new:
                append_locked(fd, target, b"".join(new.values()))
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
    if source.name == _RUN_FOLDER_FALLBACK:
        return source.parent.name
    if match := _FALLBACK_FILE.fullmatch(source.name):
        return match.group("run_id")
    raise _not_a_fallback(source, "not the name of a fallback file")


def _open_fallback(source: Path) -> int:
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
    """Lines that are not records (a kill in the middle of a write) come back apart, to keep the file."""
    records, damaged = [], []
    for where, record, problem in scan_lines(data):
        if problem is not None:
            damaged.append(f"{where} is not a record ({problem})")
        elif record.get("run_id") != run_id:
            raise _not_a_fallback(source, f"{where} is a record of run {short_repr(record.get('run_id'))}, not of run "
                                          f"{run_id} its name gives")  # fmt: skip
        else:
            records.append(record)
    if not records:
        raise _not_a_fallback(source, "no record in it" + (f" ({damaged[0]})" if damaged else ""))
    return records, damaged
