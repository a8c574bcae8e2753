"""What ``runs.jsonl``, the index, lacks is taken from the run folders, at every command's start and before every
store: a run's own ``record.jsonl`` (the index could not take it then), its copy off a failed disk, or, where the
launcher was killed after its training ended (a ``kill -9``, a kernel restart, a lost SSH session), its record
rebuilt from its reports, marked recovered, with what only the launcher knew unknown. A run folder is data anyone
may have edited: its files are read only when regular files inside it (``paths.open_lab_file``), or the run is
skipped in one line.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import fcntl
import io
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lab_helpers.config.paths import open_lab_file, read_lab_file, results_dir, shown_path, write_lab_file
from lab_helpers.config.secrets import redact_mapping
from lab_helpers.launch.runner import ProcessOutcome, say
from lab_helpers.launch.sampler import TimelineSummary
from lab_helpers.record.records import MAX_RESULTS_BYTES, _json_safe, append_records, results_path, scan_lines
from lab_helpers.record.store import INDEX_COMMAND, RECORD_FILENAME, off_disk_places
from lab_helpers.training.child_report import read_reports

LAUNCH_FILENAME = "launch.json"
_TAIL_BYTES = 64 * 1024
LAUNCH_MAX_BYTES = 4 * 2**20  # the fields known before the run and its ranks: a few kB
TIMELINE_MAX_BYTES = 256 * 2**20  # a sample a second of 8 GPUs for a day is ~70 MB
_checked: set[Path] = set()  # results files already checked by this process


def write_launch(run_dir: Path, base: Mapping[str, Any], ranks: list[int | None]) -> None:
    """Written before the training starts: what a recovery needs to build the run's records."""
    data = json.dumps(_json_safe(redact_mapping({"base": dict(base), "ranks": ranks})), sort_keys=True)
    write_lab_file(run_dir / LAUNCH_FILENAME, data.encode())  # a regular file, never through a link


@contextlib.contextmanager
def holding_run(run_dir: Path, *, wait: bool = True) -> Iterator[bool]:
    """Held while the run is live and until its record is stored, so a recovery started meanwhile leaves it alone;
    a launcher killed with -9 lets go at once."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def orphaned_runs(results_file: Path | None = None) -> list[Path]:
    """Cheap: a folder listing and one pass over the results file's bytes, with no record parsed."""
    orphans = []
    for run_dir in _unrecorded(results_file):
        with holding_run(run_dir, wait=False) as held:
            if held:
                orphans.append(run_dir)
    return orphans


def _unrecorded(results_file: Path | None, only: Path | None = None) -> list[Path]:
    """Run folders with something to index and no line in the index; by name, which is by start. None where
    ``runs`` is a link or the results file cannot be read (what is recorded is then unknown), or where the index is
    not the one beside ``runs`` (a results file given elsewhere must not take every run of the lab's folder)."""
    runs = results_dir() / "runs"
    if os.path.abspath(results_path(results_file).parent) != os.path.abspath(results_dir()):
        return []
    if os.path.islink(runs):
        _said(f"lab: {shown_path(runs)} is a symbolic link: no run folder is read through it (remove the link)")
        return []
    try:
        folders = [only] if only is not None else [Path(entry.path) for entry in os.scandir(runs)
                                                    if entry.is_dir(follow_symlinks=False)]  # fmt: skip
    except OSError:
        return []
    candidates = [folder for folder in folders if _has_a_record(folder) or _has_report(folder)]
    if not candidates:
        return []
    results = _bytes_of(results_path(results_file))
    if results is None:
        return []
    stored = set(_RUN_ID.findall(results))  # one pass, however many runs
    return [run_dir for run_dir in sorted(candidates) if run_dir.name.encode() not in stored]


_RUN_ID = re.compile(rb'"run_id": "([^"\\]*)"')
"""A record's run_id as ``records`` writes every line (json.dumps, sorted keys): no line needs parsing."""


def _record_places(run_dir: Path) -> list[Path]:
    """Where a run's own record is kept: its folder, else its copy off a failed disk."""
    return [run_dir / RECORD_FILENAME, *off_disk_places(run_dir.name)]


def _has_a_record(run_dir: Path) -> bool:
    return any(os.path.lexists(place) for place in _record_places(run_dir))


def _has_report(run_dir: Path) -> bool:
    """A report that is a link or a FIFO, or a linked ``reports``, skips the run in one line: its figures would be
    another file's (a link outside stored peak 99 GiB), or its read would hang."""
    reports = run_dir / "reports"
    try:
        entries = [] if os.path.islink(reports) else [e for e in os.scandir(reports)
                                                       if e.name.startswith("rank") and e.name.endswith(".json")]  # fmt: skip
    except OSError:
        return False
    odd = [e.name for e in entries if not e.is_file(follow_symlinks=False)]
    if os.path.islink(reports) or odd:
        what = "reports is a symbolic link" if not odd else f"reports/{odd[0]} is not a regular file"
        _said(f"lab: run {run_dir.name} not recovered: its {what} (the lab reads a run's files only when they are "
              "regular files inside its folder)")  # fmt: skip
        return False
    return bool(entries)


def _bytes_of(path: Path) -> bytes | None:
    try:
        return read_lab_file(path, max_bytes=MAX_RESULTS_BYTES)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        _said(f"lab: {shown_path(path)}: not read ({exc.strerror}): no finished run is recovered")
        return None


_seen_lines: set[str] = set()


def _said(line: str) -> None:
    """Once per process: recovery runs at every command's start, and a notebook runs many."""
    if line not in _seen_lines:
        _seen_lines.add(line)
        say(line, file=sys.stderr)


def recover_orphans(results_file: Path | None = None, *, once: bool = True) -> list[dict[str, Any]]:
    """Adds to the index what it lacks, oldest run first. Never raises for an earlier run: a start must not fail for
    it. ``once``: each results file once per process (a store passes False: its records come after these)."""
    key = results_path(results_file).absolute()
    if once and key in _checked:
        return []
    _checked.add(key)
    recovered: list[dict[str, Any]] = []
    left: list[str] = []
    for run_dir in _unrecorded(results_file):
        try:
            with holding_run(run_dir, wait=False) as held:
                if not held or not _unrecorded(results_file, only=run_dir):  # live, or recorded meanwhile
                    continue
                records, source = _kept_records(run_dir)
                if source is None:
                    if not _has_report(run_dir):
                        continue  # an empty record.jsonl (a kill mid-write) and no report: nothing to record
                    records = recovered_records(run_dir)
                off_disk = source is not None and source.parent != run_dir
                if source is None or off_disk:  # the run folder first, as the launcher would have
                    with contextlib.suppress(OSError):
                        append_records(records, path=run_dir / RECORD_FILENAME)
                where = append_records(records, path=results_file)
                if off_disk:  # now in its run folder and the index
                    with contextlib.suppress(OSError):
                        source.unlink()
        except Exception as exc:  # noqa: BLE001 -- a full disk (RecordWriteError), a bug: named, never raised
            left.append(f"{run_dir.name} ({getattr(exc, 'strerror', None) or exc})")
            continue
        recovered.extend(records)
        statuses = ", ".join(sorted({str(r["status"]) for r in records}))
        if source is None:
            said = (f"recovered the record of run {run_dir.name} ({statuses}) from its run folder, marked recovered: "
                    f"its launcher ended before storing it; now in {where}")  # fmt: skip
        else:
            said = f"added the record of run {run_dir.name} ({statuses}) from {shown_path(source)} to {where}"
        say(f"lab: {said}", file=sys.stderr)
    if left:
        say(f"lab: {len(left)} finished run(s) have no record in the index yet: {'; '.join(left[:3])}"
            f"{'; ...' if len(left) > 3 else ''}; `{INDEX_COMMAND}` adds them once that is fixed",
            file=sys.stderr)  # fmt: skip
    return recovered


def _kept_records(run_dir: Path) -> tuple[list[dict[str, Any]], Path | None]:
    """The run's own records, from its folder or from its copy off a failed disk; ([], None) where neither holds
    one (the launcher died before storing it). A damaged line (a kill mid-write) is left out in one line."""
    for place in _record_places(run_dir):
        try:
            data = read_lab_file(place, max_bytes=MAX_RESULTS_BYTES, folder=place.parent)
        except FileNotFoundError:
            continue
        except OSError as exc:
            _said(f"lab: run {run_dir.name}: {shown_path(place)} not read ({exc.strerror})")
            continue
        records = []
        for where, record, problem in scan_lines(data):
            if problem is None and record.get("run_id") == run_dir.name:
                records.append(record)
            else:
                _said(f"lab: run {run_dir.name}: {shown_path(place)} {where} left out "
                      f"({problem or 'a record of another run'})")  # fmt: skip
        if records:
            return records, place
    return [], None


def recovered_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's records rebuilt from its folder, as the launcher would have built them, marked ``recovered``."""
    from lab_helpers.record.run_record import records_from

    launch = _launch(run_dir)
    base = dict(launch.get("base") or {})
    base["run_id"] = run_dir.name
    reports = read_reports(run_dir / "reports", folder=run_dir)
    outcome = _outcome(run_dir, reports, base)
    note = (
        f"recovered on {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} from the run folder: the launcher "
        "ended before it stored the record (kill -9, a kernel restart); status from the reports, exit code unknown"
    )
    run = _resolved(base)
    if run is not None:
        ranks = launch.get("ranks") or [None]
        records = records_from(run, base, outcome, run_dir, list(ranks))
    else:
        records = [_bare_record(base, number, report, outcome) for number, report in sorted(reports.items())]
    for record in records:
        record["recovered"] = note
        record["returncode"] = None
        record.setdefault("mode", "full")
    return records


def _launch(run_dir: Path) -> dict[str, Any]:
    """``launch.json``; for a run folder of an older lab (none), what its recipe and reports say."""
    try:
        launch = json.loads(read_lab_file(run_dir / LAUNCH_FILENAME, max_bytes=LAUNCH_MAX_BYTES, folder=run_dir))
        if isinstance(launch, dict) and isinstance(launch.get("base"), dict):
            return launch
    except FileNotFoundError:
        pass
    except OSError as exc:
        _said(f"lab: run {run_dir.name}: {LAUNCH_FILENAME} not read ({exc.strerror}): its record is built from its "
              "reports alone")  # fmt: skip
    except (ValueError, RecursionError):
        pass
    experiment = run_dir.name.split("-", 2)[2].rsplit("-", 1)[0] if run_dir.name.count("-") >= 3 else "unknown"
    return {"base": {"experiment": experiment, "run_id": run_dir.name, "rank": None}, "ranks": None}


def _resolved(base: Mapping[str, Any]):
    """None where the run no longer resolves (a renamed experiment): its records then come from the reports alone."""
    from lab_helpers.config.experiments import resolve

    try:
        overrides = {k: v for k, v in (base.get("overrides") or {}).items() if v != "***"}
        return resolve(str(base["experiment"]), str(base["profile"]), overrides, check_files=False,
                       simulate_world=base.get("simulated_world_size"))  # fmt: skip
    except Exception:  # noqa: BLE001 -- whatever no longer resolves, the reports still make a record
        return None


def _outcome(run_dir: Path, reports: dict[int, dict], base: Mapping[str, Any]) -> ProcessOutcome:
    """What the launcher would have seen, from the files it left: the reports, the log's tail, the timeline."""
    timeline = _timeline(run_dir / "timeline.csv")
    log_path = run_dir / "output.log"
    return ProcessOutcome(
        returncode=None,
        interrupted=False,
        wall_s=timeline.pop("wall_s", None),  # type: ignore[arg-type]
        log_path=log_path,
        timeline=timeline.pop("summary"),
        reports=reports,
        tail=_tail(log_path),
        time_limit_s=base.get("time_limit_s"),
        recovered=True,
    )


def _timeline(path: Path) -> dict[str, Any]:
    """The timeline's peaks and its last t_s, which is close to the run's wall time."""
    summary = TimelineSummary(path=path)
    last_t = None
    try:
        with io.TextIOWrapper(open_lab_file(path, max_bytes=TIMELINE_MAX_BYTES, folder=path.parent), newline="") as fh:
            for row in csv.DictReader(fh):
                summary.samples += 1
                last_t = _number(row.get("t_s")) or last_t
                if (rss := _number(row.get("host_ram_gib"))) is not None and rss > 0:
                    summary.host_rss_peak_gib = max(summary.host_rss_peak_gib or 0.0, rss)
                gpu, mem = row.get("gpu"), _number(row.get("mem_used_gib"))
                if gpu and gpu.isdigit() and mem is not None:
                    summary.gpu_used_peak_gib[int(gpu)] = max(summary.gpu_used_peak_gib.get(int(gpu), 0.0), mem)
    except (OSError, ValueError, csv.Error):
        pass
    summary.visible_order = sorted(summary.gpu_used_peak_gib)
    return {"summary": summary, "wall_s": last_t}


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _tail(log_path: Path, lines: int = 60) -> list[str]:
    try:
        with open_lab_file(log_path, max_bytes=sys.maxsize, folder=log_path.parent) as fh:  # its tail alone is read
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _bare_record(base: Mapping[str, Any], number: int, report: Mapping[str, Any], outcome: ProcessOutcome) -> dict:
    from lab_helpers.config.record_schema import RECORD_FIELD_NAMES, REPORT_STATUSES
    from lab_helpers.record.run_record import last_line, relative_to_results

    reported = report.get("status")
    status = reported if reported in REPORT_STATUSES else "error"
    measured = {key: value for key, value in report.items() if key in RECORD_FIELD_NAMES and key != "status"}
    return {
        **base,
        **measured,
        "rank": report.get("rank", number),
        "status": status,
        "reason": None if status == "ok" else last_line(report.get("error")) or "the run's report gave no status",
        "host_rss_peak_gib": outcome.timeline.host_rss_peak_gib,
        "log_path": relative_to_results(outcome.log_path),
        "timeline_path": relative_to_results(outcome.timeline.path),
    }
