"""Export recorded runs as reference results (``reference_results/<gpu>.jsonl``), which students without a GPU
analyse in 03_compare. An export only ever adds: shipped records stay byte for byte, so earlier GPU sessions are never
lost, and the file is renamed into place, never left half written.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import sys
import tarfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_helpers.config.experiments import LabConfigError
from lab_helpers.config.paths import (
    describe_os_error,
    fsync_dir,
    lab_folder,
    reference_dir,
    regular_file_inside,
    results_dir,
    shown_path,
    write_lab_file,
)
from lab_helpers.hardware.gpu_peaks import reference_name_for_gpu
from lab_helpers.record.records import latest_runs, load_results, read_records, record_lines, results_path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # never hidden (".", ".."), a name the file system takes
CI_CPU_REFERENCE = "ci-cpu"  # the ci profile's file: its records name no GPU
TIMELINE_ARCHIVE = "results.tar.gz"  # what scripts/gpu-chunk.sh brings back beside its runs.jsonl


@dataclass(frozen=True)
class Exported:
    path: Path
    added: int
    already_there: int
    gpu: str | None

    def line(self) -> str:
        on = f" (measured on {self.gpu})" if self.gpu else ""
        return f"{self.path}: {self.added} added, {self.already_there} already there{on}"


def record_gpu(record: Mapping[str, Any]) -> str | None:
    """The GPU a record was measured on: the first of ``environment.gpu_names``, else its ``device_name``."""
    environment = record.get("environment")
    names = environment.get("gpu_names") if isinstance(environment, Mapping) else None
    if isinstance(names, list) and names and isinstance(names[0], str) and names[0].strip():
        return names[0]
    device = record.get("device_name")
    cpu = isinstance(device, str) and device.startswith("cpu (")  # child_report.device_name() on a CPU: no GPU
    return device if isinstance(device, str) and device.strip() and not cpu else None


def export_references(
    name: str | None = None,
    *,
    profile: str | None = None,
    note: str = "",
    source: Path | str | None = None,
    force: bool = False,
) -> list[Exported]:
    """One file per GPU, named after it; a ``name`` that disagrees with the records' GPU is refused. A file takes only
    records of its own profile and GPU unless ``force``, so ci records never land in the shipped H100 file."""
    if name is not None and not _NAME.match(name):
        raise LabConfigError(f"reference name {_shown(name)}: use letters, digits, '.', '_' and '-' only, starting "
                             "with a letter or digit, at most 100 characters (e.g. h100-80gb)")  # fmt: skip
    records, timelines = _chosen_records(profile, source)
    by_file: dict[str, list[dict[str, Any]]] = {}
    gpus: dict[str, str | None] = {}
    for record in records:
        gpu = record_gpu(record)
        stem = reference_name_for_gpu(gpu) or name or (CI_CPU_REFERENCE if record.get("profile") == "ci" else None)
        if stem is None:
            raise LabConfigError(
                f"record {record.get('run_id')!r} ({record.get('experiment')}) names no GPU, so its file cannot "
                "be told from it: give NAME (e.g. h100-80gb)"
            )
        by_file.setdefault(stem, []).append(record)
        gpus.setdefault(stem, gpu)
    if name is not None and set(by_file) != {name}:
        folder = reference_dir()
        measured = ", ".join(f"{gpus[stem]}: {folder.name}/{stem}.jsonl" for stem in sorted(by_file) if stem != name)
        raise LabConfigError(
            f"export-reference {name}: the records were measured on another GPU, so they go to another file "
            f"({measured}); leave NAME out, and each GPU's records go to its own file"
        )
    folder = reference_dir()
    try:
        lab_folder(folder)
    except OSError as exc:
        raise LabConfigError(f"reference folder {shown_path(folder)}: {describe_os_error(exc)}") from None
    with _folder_lock(folder):  # two exports at once would each rename their own copy over the other's
        if not force:  # every file checked before any is written
            for stem, rows in by_file.items():
                _refuse_another_kind(folder / f"{stem}.jsonl", rows)
        return [_add_to(folder, stem, rows, gpus[stem], note, timelines) for stem, rows in by_file.items()]


def _kind(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record.get("profile")), record_gpu(record) or "no GPU (a CPU)"


def _refuse_another_kind(target: Path, rows: list[dict[str, Any]]) -> None:
    if not _existing_bytes(target):
        return
    shipped = {_kind(record) for record in read_records(target)}
    new = sorted({_kind(record) for record in rows} - shipped)
    if shipped and new:
        held = "; ".join(f"profile {p} on {g}" for p, g in sorted(shipped))
        raise LabConfigError(
            f"export-reference: {target.parent.name}/{target.name} holds records of {held}, and these are of "
            f"{'; '.join(f'profile {p} on {g}' for p, g in new)}: nothing exported (one file per GPU and profile: "
            "give another NAME, e.g. ci-cpu, or --force to add them to this file anyway)"
        )


def _shown(name: str) -> str:
    text = repr(name)
    return text if len(text) <= 40 else f"{text[:30]}...' ({len(name)} characters)"


def export_reference(
    name: str, *, profile: str | None = None, note: str = "", source: Path | str | None = None, force: bool = False
) -> Path:
    return export_references(name, profile=profile, note=note, source=source, force=force)[0].path


def _chosen_records(profile: str | None, source: Path | str | None) -> tuple[list[dict[str, Any]], _Timelines]:
    """The stored records themselves, not a DataFrame round trip of them."""
    if source is None:
        if profile is None:
            raise LabConfigError("export-reference: no profile given")
        latest = latest_runs(load_results(), profile=profile)
        if latest.empty:
            raise LabConfigError(f"no records of profile {profile!r} in {results_dir()} to export")
        chosen = {(run_id, _rank(rank)) for run_id, rank in zip(latest["run_id"], latest["rank"], strict=True)}
        records = [r for r in read_records() if (r.get("run_id"), _rank(r.get("rank"))) in chosen]
        return records, _Timelines(results_dir())
    path = Path(source)
    if not path.is_file():
        raise LabConfigError(f"--from {source}: no such file (a runs.jsonl, e.g. the one a GPU chunk brought back)")
    records = read_records(results_path(path))
    profiles = sorted({str(r.get("profile")) for r in records})
    if profile is None and len(profiles) > 1:
        raise LabConfigError(f"--from {source} holds records of profiles {', '.join(profiles)}: give --profile")
    if profile is not None:
        records = [r for r in records if r.get("profile") == profile]
    if not records:
        raise LabConfigError(f"no records{f' of profile {profile!r}' if profile else ''} in {source} to export")
    return records, _Timelines(path.parent, archive=path.parent / TIMELINE_ARCHIVE)


def _add_to(
    folder: Path, stem: str, records: list[dict[str, Any]], gpu: str | None, note: str, timelines: _Timelines
) -> Exported:
    target = folder / f"{stem}.jsonl"
    old = _existing_bytes(target)
    shipped = {_key(r) for r in read_records(target)} if old else set()
    new = []
    for record in records:
        if _key(record) not in shipped:
            shipped.add(_key(record))
            new.append(record)
    if new:
        rows = []
        for record in new:
            record = dict(record)
            if record.get("timeline_path"):
                record["timeline_path"] = timelines.copy(record, folder)
            record["reference_note"] = note or f"exported with: {' '.join(sys.argv) or 'export_reference'}"
            rows.append(record)
        fence = b"\n" if old and not old.endswith(b"\n") else b""
        # the old bytes, then the new lines (redacted: records.record_lines), written by the lab's one rule for a
        # file (paths.write_lab_file: a new file renamed into place, never through a link): never half a file
        _write(target, old + fence + record_lines(rows))
        fsync_dir(folder)
    return Exported(target, added=len(new), already_there=len(records) - len(new), gpu=gpu)


def _write(path: Path, data) -> None:
    try:
        write_lab_file(path, data)
    except OSError as exc:
        raise LabConfigError(f"{shown_path(path)}: not written: {describe_os_error(exc)}; nothing exported") from None


class _Timelines:
    """A folder's timelines, else those in the chunk's ``results.tar.gz``: only a regular file inside is copied."""

    def __init__(self, folder: Path, archive: Path | None = None):
        self.folder, self.archive = folder, archive
        self._members: dict[str, tarfile.TarInfo] | None = None

    def copy(self, record: dict, destination_folder: Path) -> str | None:
        """None for a timeline that is not a regular file inside the source: a record can be edited by hand, and a
        timeline linked to a secret must never be published."""
        timeline = str(record["timeline_path"])
        destination = destination_folder / timeline
        source = regular_file_inside(self.folder, timeline)
        member = None if source is not None else self._member(timeline)
        inside = destination.resolve().is_relative_to(destination_folder.resolve())
        if (source is None and member is None) or not inside:
            also = f" nor in {self.archive}" if self.archive is not None else ""
            warnings.warn(
                f"record {record.get('run_id')!r}: timeline {timeline!r} is not a regular file inside {self.folder}"
                f"{also} (missing, a link leading out, or not a file); exported without it",
                stacklevel=4,
            )
            return None
        if source is not None:
            with open(source, "rb") as data:
                _write(destination, lambda out: shutil.copyfileobj(data, out))
        else:
            with tarfile.open(self.archive, "r:gz") as tar, tar.extractfile(member) as data:
                _write(destination, lambda out: shutil.copyfileobj(data, out))
        return timeline

    def _member(self, timeline: str) -> tarfile.TarInfo | None:
        if self.archive is None or regular_file_inside(self.archive.parent, self.archive.name) is None:
            return None
        if self._members is None:
            try:
                with tarfile.open(self.archive, "r:gz") as tar:  # regular files only: no link, no device
                    self._members = {os.path.normpath(m.name): m for m in tar.getmembers() if m.isreg()}
            except (OSError, tarfile.TarError):
                self._members = {}
        return self._members.get(os.path.normpath(timeline))


def _existing_bytes(target: Path) -> bytes:
    try:
        info = target.lstat()
    except FileNotFoundError:
        return b""
    if not stat.S_ISREG(info.st_mode):
        raise LabConfigError(f"{target} is not a regular file (a link?): left as it is, nothing exported")
    return target.read_bytes()


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _key(record: Mapping[str, Any]) -> tuple[Any, int | None]:
    """The ranks of one distributed run share its ``run_id``."""
    return record.get("run_id"), _rank(record.get("rank"))


def _rank(value) -> int | None:
    """Ranks come back from pandas as floats or NaN; records hold ints or None."""
    return None if value is None or value != value else int(value)


__all__ = ["Exported", "export_reference", "export_references", "record_gpu", "reference_name_for_gpu"]
