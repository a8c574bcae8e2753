"""Where a run's record is kept: its own folder first (``runs/<run_id>/record.jsonl``, synced), then ``runs.jsonl``,
the index every reader uses. A record the index could not take is added to it by the next store or command
(``recovery.recover_orphans``), so nothing is appended late and out of order. Where the run folder cannot be
written either (the results disk filled up or turned read-only), the record goes off that file system, and is
brought back the same way.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lab_helpers.record.records import RecordWriteError, append_records, results_path

RECORD_FILENAME = "record.jsonl"
INDEX_COMMAND = "python -m lab_helpers results"

_DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO}
"""A file system that failed with one of these takes no copy either: the next place is off it."""


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


def off_disk_places(run_id: str) -> list[Path]:
    """Where a record goes when its run folder cannot take it: by its run id, so the run folder finds it again."""
    return [folder / f"runs.{run_id}.jsonl" for folder in (state_dir(), temp_fallback_dir()) if folder is not None]


def store_records(records: Sequence[Mapping[str, Any]], *, path: Path | str | None, run_dir: Path | None) -> Path:
    """The run folder, then the index; returns where readers find the records now (the index, or the one place that
    kept them, named in one line). Raises RecordWriteError only when no place took them."""
    target = results_path(path)
    run_id = str(records[0].get("run_id") or "run") if records else "run"
    tried: list[tuple[Path, RecordWriteError]] = []
    kept = None
    if run_dir is not None:
        try:
            kept = append_records(records, path=run_dir / RECORD_FILENAME)
        except RecordWriteError as exc:
            tried.append((run_dir / RECORD_FILENAME, exc))
    try:
        return append_records(records, path=target)
    except RecordWriteError as exc:
        tried.insert(0, (target, exc))
    if kept is None:
        kept = _off_disk(records, run_id, tried)
    why = tried[0][1].strerror
    _say(f"lab: {why}; the record is kept in {kept}: the next lab command adds it to {target} once that can be "
         f"written (or `{INDEX_COMMAND}`)")  # fmt: skip
    return kept


def _off_disk(records: Sequence[Mapping[str, Any]], run_id: str, tried: list[tuple[Path, RecordWriteError]]) -> Path:
    failed_devices = {device for place, exc in tried if exc.errno in _DISK_ERRORS
                      if (device := _device_of(place)) is not None}  # fmt: skip
    for place in off_disk_places(run_id):
        if _device_of(place) in failed_devices or not _private_folder(place.parent):
            continue
        try:
            return append_records(records, path=place)
        except RecordWriteError as exc:
            tried.append((place, exc))
            if exc.errno in _DISK_ERRORS and (device := _device_of(place)) is not None:
                failed_devices.add(device)
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
