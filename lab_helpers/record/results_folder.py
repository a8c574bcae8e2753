"""Check, before a run starts, that its record and files can be stored: one line naming the folder and the fix
instead of a traceback after a paid-for run, and nothing created but the results folder.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.paths import describe_os_error, lab_folder, path_problem, results_dir, shown_path
from lab_helpers.record.records import open_results_file

MIN_FREE_BYTES = 64 * 2**20  # a run writes its log, timeline and reports: a few MB on the ci profile
_FIX = "set LAB_RESULTS to a folder you can write, e.g. LAB_RESULTS=$HOME/lab-results"


def check_results_folder(results_file: Path, *, create: bool = True) -> None:
    """``create=False`` creates nothing and probes the nearest folder above: ``run_experiment`` checks so before
    resolving, which imports litgpt, whose dependencies need a temporary directory a full disk does not give."""
    folder = results_file.parent
    if (problem := path_problem(folder)) is not None:  # the rule of every lab folder (paths.lab_folder)
        raise LabConfigError(f"results folder {folder}: {problem}; {_FIX}")
    probed = folder
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        else:
            while not probed.is_dir() and probed != probed.parent:
                if os.path.lexists(probed):  # a file where a folder is needed
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probed))
                probed = probed.parent
    except OSError as exc:
        raise LabConfigError(f"results folder {folder} cannot be created: {describe_os_error(exc)}; {_FIX}") from None
    try:
        free = shutil.disk_usage(probed).free
        _probe_write(probed)
    except OSError as exc:
        raise LabConfigError(f"results folder {folder} cannot be written: {describe_os_error(exc)}; {_FIX}") from None
    if free < MIN_FREE_BYTES:
        raise LabConfigError(
            f"results folder {folder} is full ({free / 2**20:.0f} MiB free, a run needs {MIN_FREE_BYTES // 2**20} MiB); "
            f"free some space or {_FIX}"
        )
    try:  # where make_run_folder will make the run's folder: a real folder, or nothing yet
        lab_folder(results_dir() / "runs", create=False, inside=results_dir())
    except OSError as exc:
        raise LabConfigError(f"runs folder {shown_path(results_dir() / 'runs')}: {describe_os_error(exc)}") from None
    if os.path.lexists(results_file):
        try:
            os.close(open_results_file(results_file))
        except OSError as exc:
            raise LabConfigError(f"results file {results_file} cannot be written: {describe_os_error(exc)}") from None


def make_run_folder(run_id: str) -> Path:
    """``runs/<run_id>`` by the rule of every lab folder, ``runs`` a real folder: a link there sent a run's files
    (its log, its checkpoints) into the link's target, with no word."""
    run_dir = results_dir() / "runs" / run_id
    try:
        return lab_folder(run_dir, inside=results_dir())
    except OSError as exc:
        raise LabConfigError(f"run folder {shown_path(run_dir)}: {describe_os_error(exc)}") from None


def _probe_write(folder: Path) -> None:
    """Write and remove one byte: catches a read-only file system, a full disk and a file-size limit alike."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".lab-write-check-") as fh:
        fh.write(b"x")
        fh.flush()
        os.fsync(fh.fileno())


def remove_if_empty(run_dir: Path) -> None:
    for folder in (run_dir / "reports", run_dir):
        try:
            folder.rmdir()
        except OSError:
            pass
