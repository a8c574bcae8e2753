"""Export recorded runs as the lab's reference results (``reference_results/<name>.jsonl``).

Students without a GPU, or without finished runs, analyse these in 03_compare. They are written from real
records only -- the latest record per experiment and rank of one profile -- with each run's timeline copied
beside them, plus the exact command and machine that produced them.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import warnings
from pathlib import Path

from lab_helpers.experiments import LabConfigError
from lab_helpers.paths import reference_dir, regular_file_inside, results_dir
from lab_helpers.records import append_record, latest_runs, load_results, read_records

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def export_reference(name: str, *, profile: str, note: str = "") -> Path:
    """Write ``reference_results/<name>.jsonl`` (replacing an earlier export of that name) and return it.

    The new export is written to a temporary file and moved into place, so a failure half-way (a refused
    record, a full disk) leaves the earlier export as it was.
    """
    if not _NAME.match(name):
        raise LabConfigError(f"reference name {name!r}: use letters, digits, '.', '_' and '-' only (e.g. H100-80GB)")
    latest = latest_runs(load_results(), profile=profile)
    if latest.empty:
        raise LabConfigError(f"no records of profile {profile!r} in {results_dir()} to export")
    chosen = {(run_id, _rank(rank)) for run_id, rank in zip(latest["run_id"], latest["rank"], strict=True)}
    folder = reference_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.jsonl"
    tmp = folder / f".{name}.jsonl.tmp{os.getpid()}"  # the old export stays whole until the new one is
    tmp.unlink(missing_ok=True)
    try:
        for record in read_records():  # the stored records themselves, not a DataFrame round trip of them
            if (record.get("run_id"), _rank(record.get("rank"))) not in chosen:
                continue
            if record.get("timeline_path"):
                record["timeline_path"] = _copy_timeline(record, folder)
            record["reference_note"] = note or f"exported with: {' '.join(sys.argv) or 'export_reference'}"
            append_record(record, path=tmp)  # redacted as it is written (records.py)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _copy_timeline(record: dict, folder: Path) -> str | None:
    """Copy the record's timeline into the export and return its path there, or None when it is not a regular
    file inside the results folder once every link is resolved (a record is data, and data can be edited by
    hand: a timeline linked to a secret must never be published). Said in one line."""
    timeline = str(record["timeline_path"])
    source = regular_file_inside(results_dir(), timeline)
    destination = folder / timeline
    if source is None or not destination.resolve().is_relative_to(folder.resolve()):
        warnings.warn(
            f"record {record.get('run_id')!r}: timeline {timeline!r} is not a regular file inside {results_dir()} "
            "(missing, a link leading out, or not a file); exported without it",
            stacklevel=3,
        )
        return None
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.unlink(missing_ok=True)  # never write through a link left there
    shutil.copyfile(source, destination)
    return timeline


def _rank(value) -> int | None:
    """Ranks come back from pandas as floats or NaN; records hold ints or None."""
    return None if value is None or value != value else int(value)


__all__ = ["export_reference"]
