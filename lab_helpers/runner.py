"""Run one training command in its own process group, live, and never leave a process behind.

Why a separate process group: a CUDA OOM or a crash must not take the notebook kernel with it, and an
interrupt (Ctrl-C in a terminal, "interrupt kernel" in Jupyter -- both arrive here as KeyboardInterrupt)
must end every rank and data-loader worker at once. The child's output is shown as it comes, with a progress
bar, and written line by line (secrets masked) to the run's log, so a crash never costs the log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab_helpers.child_report import REPORT_DIR_ENV, read_reports
from lab_helpers.sampler import TimelineSampler, TimelineSummary
from lab_helpers.secrets import redact, secret_values

ITER_PATTERN = re.compile(r"\biter (\d+)\b")
TERMINATE_GRACE_S = 10.0
_TAIL_LINES = 60


@dataclass
class ProcessOutcome:
    """What the launching side saw of a run; the training side's own view is in ``reports``."""

    returncode: int | None
    interrupted: bool
    wall_s: float
    log_path: Path
    timeline: TimelineSummary
    reports: dict[int, dict] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


def _progress_bar(total: int | None, label: str, enabled: bool):
    """A bar in Jupyter or a terminal; none in a piped log (CI), where the printed iter lines are the progress."""
    if not enabled or not (sys.stdout.isatty() or "ipykernel" in sys.modules):
        return None
    from tqdm.auto import tqdm  # a widget in Jupyter, a text bar in a terminal

    return tqdm(total=total, desc=label, unit="iter", leave=True, dynamic_ncols=True, file=sys.stdout)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end_group(proc: subprocess.Popen, pgid: int) -> None:
    """SIGTERM the whole group, give it a moment to write its reports, then SIGKILL whatever is left."""
    _kill_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(pgid, signal.SIGKILL)  # ranks and workers that outlived their parent too
    proc.wait()


def run_command(
    command: Sequence[str],
    *,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    total_iters: int | None = None,
    label: str = "",
    echo: bool = True,
    sample_interval_s: float = 0.15,
) -> ProcessOutcome:
    """Run ``command`` to the end (or to an interrupt) and return what happened; raises nothing for a failed run.

    The caller decides what a non-zero exit means; a KeyboardInterrupt is turned into ``interrupted=True``
    after the whole process group is gone.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    report_dir = run_dir / "reports"
    report_dir.mkdir(exist_ok=True)
    log_path = run_dir / "output.log"
    child_env = {**os.environ, **(env or {}), REPORT_DIR_ENV: str(report_dir), "PYTHONUNBUFFERED": "1"}
    secrets = secret_values(child_env)
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    bar = _progress_bar(total_iters, label, echo)
    interrupted = False
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: we end it as a whole, the terminal's Ctrl-C reaches us
    )
    pgid = proc.pid
    sampler = TimelineSampler(
        run_dir / "timeline.csv",
        root_pid=proc.pid,
        interval_s=sample_interval_s,
        visible_devices=child_env.get("CUDA_VISIBLE_DEVICES"),
    )
    try:
        with sampler, open(log_path, "w", buffering=1, encoding="utf-8") as log:
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    line = redact(raw.decode("utf-8", errors="replace").rstrip("\r\n"), secrets)
                    log.write(line + "\n")
                    tail.append(line)
                    if echo:
                        _show(line, bar)
                    if bar is not None and (match := ITER_PATTERN.search(line)):
                        bar.n = int(match.group(1))
                        bar.refresh()
                proc.wait()
            except KeyboardInterrupt:
                interrupted = True
                log.write("lab: interrupted; ending the whole process group\n")
                _end_group(proc, pgid)
    finally:
        if proc.poll() is None:  # an unexpected error in this process: still leave nothing behind
            _end_group(proc, pgid)
        else:
            _kill_group(pgid, signal.SIGKILL)  # stray grandchildren of a finished run
        if bar is not None:
            bar.close()
    return ProcessOutcome(
        returncode=proc.returncode,
        interrupted=interrupted,
        wall_s=time.perf_counter() - t0,
        log_path=log_path,
        timeline=sampler.summary,
        reports=read_reports(report_dir),
        tail=list(tail),
    )


def _show(line: str, bar) -> None:
    if bar is None:
        print(line, flush=True)
    else:
        bar.write(line, file=sys.stdout)
