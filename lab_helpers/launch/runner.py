"""Run one training command in its own process group, live, and never leave a process behind.

Its own group, so that a CUDA OOM or a crash cannot take the notebook kernel with it, and one interrupt ends every
rank and data-loader worker at once. The log is written line by line, so a crash never costs it.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab_helpers.config.paths import open_regular, write_all
from lab_helpers.config.secrets import LineRedactor
from lab_helpers.launch.interrupts import InterruptShield, SignalInterrupt
from lab_helpers.launch.sampler import TimelineSampler, TimelineSummary
from lab_helpers.launch.warm_start import WarmProcess, kill_group, start_process
from lab_helpers.training.child_report import REPORT_DIR_ENV, read_reports
from lab_helpers.training.orphan_guard import LAUNCHER_PID_ENV

ITER_PATTERN = re.compile(r"\biter (\d+)\b")
TERMINATE_GRACE_S = 10.0
EXIT_GRACE_S = 2.0  # after the training process exits, how long what it left behind may still hold its output
_READ_POLL_S = 0.25
_DRAIN_S = 1.0
GRACE_ENV = "LAB_TERMINATE_GRACE_S"
_TAIL_LINES = 60


@dataclass
class ProcessOutcome:
    returncode: int | None
    interrupted: bool
    wall_s: float
    log_path: Path
    timeline: TimelineSummary
    reports: dict[int, dict] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)
    timed_out: bool = False  # the wall-clock limit passed and the group was ended
    time_limit_s: float | None = None
    log_error: str | None = None  # the log could not be written to the end (a full disk); the run went on
    pid: int | None = None  # the launched process, to match against the kernel's OOM-killer lines
    started_monotonic_s: float | None = None  # time.monotonic() at launch (the kernel log's clock)
    process_start: str | None = None  # "warm" (forked by warm_start) or "cold"; None: interrupted before it started
    interrupted_by: str | None = None  # the signal that ended the run ("SIGHUP"); None: Ctrl-C or no interrupt
    exit_cause: str | None = None  # why the process ended, when the launching side knows better (a dead warm server)
    echo_error: str | None = None  # the output went away (a closed pipe, a dropped terminal); the run went on
    recovered: bool = False  # rebuilt from the run folder after the launcher died (recovery): no exit code is known


def _progress_bar(total: int | None, label: str, enabled: bool):
    """None in a piped log (CI), where the printed iter lines are the progress."""
    if not enabled or not (sys.stdout.isatty() or "ipykernel" in sys.modules):
        return None
    from tqdm.auto import tqdm  # a widget in Jupyter, a text bar in a terminal

    return tqdm(total=total, desc=label, unit="iter", leave=True, dynamic_ncols=True, file=sys.stdout)


def terminate_grace_s() -> float:
    try:
        return max(0.0, float(os.environ.get(GRACE_ENV, TERMINATE_GRACE_S)))
    except ValueError:
        return TERMINATE_GRACE_S


def _end_group(proc: subprocess.Popen | WarmProcess, pgid: int) -> None:
    """The grace lets the ranks write their reports; the SIGKILL is in a ``finally`` so that a rank stuck in a
    collective (which ignores SIGTERM) never outlives the run."""
    kill_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=terminate_grace_s())
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_group(pgid, signal.SIGKILL)  # ranks and workers that outlived their parent too
    proc.wait()


class _Deadline:
    def __init__(self, proc: subprocess.Popen | WarmProcess, pgid: int, limit_s: float | None) -> None:
        self.passed = threading.Event()
        self._done = threading.Event()
        self._proc, self._pgid = proc, pgid
        self._thread = None
        if limit_s is not None and limit_s > 0:
            self._thread = threading.Thread(target=self._watch, args=(limit_s,), name="lab-time-limit", daemon=True)
            self._thread.start()

    def _watch(self, limit_s: float) -> None:
        if self._done.wait(limit_s) or self._proc.poll() is not None:
            return
        self.passed.set()
        kill_group(self._pgid, signal.SIGTERM)
        if not self._done.wait(terminate_grace_s()):
            kill_group(self._pgid, signal.SIGKILL)

    def cancel(self) -> None:
        self._done.set()


class _Output:
    """Read with a timeout, not to EOF: a child that outlives the process (a data-loader worker, one that left the
    group with ``setsid``) keeps the pipe open, and a read to EOF would wait for it past the time limit, forever."""

    def __init__(self, proc: subprocess.Popen | WarmProcess) -> None:
        assert proc.stdout is not None
        self._proc = proc
        self._fd = proc.stdout.fileno()
        self.cut_note: str | None = None

    def lines(self) -> Iterator[bytes]:
        lines = _BoundedLines()
        exited_at: float | None = None
        while True:
            ready, _, _ = select.select([self._fd], [], [], _READ_POLL_S)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:  # EOF: every holder of the write end has closed it
                    break
                yield from lines.feed(chunk)
            if exited_at is None and self._proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > EXIT_GRACE_S:
                yield from lines.feed(self._cut())
                break
        yield from lines.end()

    def _cut(self) -> bytes:
        holders = _pipe_writers(self._fd)
        for pid, _ in holders:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_group(self._proc.pid, signal.SIGKILL)
        named = ", ".join(f"{pid} ({command})" for pid, command in holders[:3]) + (", ..." if len(holders) > 3 else "")
        self.cut_note = (
            f"lab: the training process ended, but {len(holders) or 'a'} process(es) it left behind still held its "
            f"output {EXIT_GRACE_S:g} s later and were killed: {named or 'gone by then'}"
        )
        rest, deadline = b"", time.monotonic() + _DRAIN_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._fd, 1 << 16) if ready else b""
            if not chunk:
                break
            rest += chunk
        return rest


MAX_LINE_BYTES = 64 * 1024
"""One 300 MB line must cost the launcher no more than this, in the log, the echo and the error tail alike."""
_CUT_SLACK = 256  # a cut falls on whitespace within this many bytes, or that many bytes earlier: never in a token


class _BoundedLines:
    def __init__(self) -> None:
        self._pending = bytearray()
        self._left_out = 0

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._take(chunk, start, end)
            yield self._line() + b"\n"
            start = end + 1
        self._take(chunk, start, len(chunk))

    def end(self) -> Iterator[bytes]:
        if self._pending or self._left_out:
            yield self._line()

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        room = max(0, MAX_LINE_BYTES - len(self._pending))
        keep = min(room, end - start)
        self._pending += chunk[start : start + keep]
        self._left_out += end - start - keep

    def _line(self) -> bytes:
        line, left_out = bytes(self._pending), self._left_out
        self._pending.clear()
        self._left_out = 0
        if not left_out:
            return line
        space = max(line.rfind(b" ", len(line) - _CUT_SLACK), line.rfind(b"\t", len(line) - _CUT_SLACK))
        cut = space if space > 0 else max(0, len(line) - _CUT_SLACK)
        left_out += len(line) - cut
        return line[:cut] + f" [lab: {left_out} more bytes of this line left out]".encode()


def _pipe_writers(read_fd: int) -> list[tuple[int, str]]:
    try:
        link = f"pipe:[{os.fstat(read_fd).st_ino}]"
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]
    except OSError:
        return []
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == link for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
                found.append((pid, command))
        except OSError:  # gone, or another user's
            continue
    return found


class Echo:
    """When stdout goes away (``| head`` closed, the SSH terminal dropped) the echo stops and the run goes on: losing a
    view must never lose a run."""

    def __init__(self, enabled: bool, bar=None) -> None:
        self.enabled = enabled
        self.bar = bar
        self.error: str | None = None

    def show(self, line: str) -> None:
        if not self.enabled or self.error is not None:
            return
        try:
            _show(line, self.bar)
        except (OSError, ValueError) as exc:  # ValueError: a closed file object
            self.stop(exc)

    def progress(self, n: int) -> None:
        if self.bar is None or self.error is not None:
            return
        try:
            self.bar.n = n
            self.bar.refresh()
        except (OSError, ValueError) as exc:
            self.stop(exc)

    def stop(self, exc: BaseException) -> None:
        self.error = f"the output went away ({getattr(exc, 'strerror', None) or exc}); the run went on"
        self.bar = None
        silence_stdout()


def silence_stdout() -> None:
    """After EPIPE or EIO every later print (the result line, Python's flush at exit) would fail again."""
    try:
        if sys.stdout is not None and sys.stdout.fileno() == 1:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real fd (Jupyter's stream): nothing to redirect
        pass


def say(line: str, *, file=None) -> bool:
    try:
        print(line, file=file or sys.stdout, flush=True)
        return True
    except (OSError, ValueError):
        if file is None or file is sys.stdout:
            silence_stdout()
        return False


LOG_MAX_ENV = "LAB_LOG_MAX_MIB"
LOG_MAX_MIB = 16.0
"""So that a chatty run cannot fill the results disk; the log keeps its first quarter and last three quarters."""


def log_cap_bytes() -> int:
    try:
        mib = float(os.environ.get(LOG_MAX_ENV, LOG_MAX_MIB))
    except ValueError:
        mib = LOG_MAX_MIB
    return int((mib if 0.01 <= mib <= 2**20 else LOG_MAX_MIB) * 2**20)


class _Log:
    """Past the head the file grows to twice the tail before the last tail is moved up, so each byte is moved at
    most once. A write that fails (a full disk) stops the log, never the run."""

    def __init__(self, path: Path, cap_bytes: int | None = None) -> None:
        self.error: str | None = None
        cap = log_cap_bytes() if cap_bytes is None else cap_bytes
        self._head_cap, self._tail_cap = cap // 4, cap - cap // 4
        self._fd: int | None = open_regular(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)  # never through a link
        self._size = 0
        self._head_end: int | None = None  # where the head ends, once it is full
        self._tail_start = 0  # where the kept tail starts (behind the head and the note)
        self._left_out_lines = self._left_out_bytes = 0

    def write(self, line: str) -> None:
        if self._fd is None:
            return
        data = (line + "\n").encode("utf-8", errors="replace")
        try:
            if self._head_end is None and self._size + len(data) > self._head_cap:
                self._head_end = self._tail_start = self._size
            write_all(self._fd, data)
            self._size += len(data)
            if self._head_end is not None and self._size - self._tail_start > 2 * self._tail_cap:
                self._compact()
        except OSError as exc:
            self._stop(f"the log stopped here: {exc.strerror or exc}")

    def _compact(self) -> None:
        assert self._fd is not None and self._head_end is not None
        start = self._size - self._tail_cap
        tail = os.pread(self._fd, self._tail_cap, start)
        first = tail.find(b"\n") + 1  # drop the partial line the cut fell in
        tail = tail[first:]
        for offset in range(self._tail_start, start + first, 1 << 20):  # counted a MiB at a time
            self._left_out_lines += os.pread(self._fd, min(1 << 20, start + first - offset), offset).count(b"\n")
        self._left_out_bytes += start + first - self._tail_start
        note = (f"lab: {self._left_out_lines} lines ({self._left_out_bytes / 2**20:.1f} MiB) of output left out "
                f"here: the log keeps its first {self._head_cap / 2**20:.1f} MiB and its last "
                f"{self._tail_cap / 2**20:.1f} MiB (${LOG_MAX_ENV})\n").encode()  # fmt: skip
        offset = self._head_end
        for piece in (note, tail):
            while piece:
                written = os.pwrite(self._fd, piece, offset)
                piece, offset = piece[written:], offset + written
        os.ftruncate(self._fd, offset)
        os.lseek(self._fd, offset, os.SEEK_SET)
        self._tail_start = self._head_end + len(note)
        self._size = offset

    def close(self) -> None:
        if self._fd is not None:
            try:
                if self._head_end is not None and self._size - self._tail_start > self._tail_cap:
                    self._compact()
            except OSError as exc:
                self.error = self.error or f"the log could not be completed: {exc.strerror or exc}"
            self._stop(None)

    def _stop(self, error: str | None) -> None:
        self.error = self.error or error
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                self.error = self.error or f"the log could not be completed: {exc.strerror or exc}"


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
    time_limit_s: float | None = None,
    shield: InterruptShield | None = None,
) -> ProcessOutcome:
    """Raises nothing for a failed run or an interrupt. ``shield`` is armed from the first interrupt (and once the
    process ended) and left armed, so that the caller can store the record before any further interrupt."""
    own_shield = shield is None
    shield = shield if shield is not None else InterruptShield()
    run_dir.mkdir(parents=True, exist_ok=True)
    report_dir = run_dir / "reports"
    report_dir.mkdir(exist_ok=True)
    log_path = run_dir / "output.log"
    child_env = _child_env(env, report_dir)
    redact_line = LineRedactor(child_env)  # a token split over two lines too (secrets.py)
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    bar = _progress_bar(total_iters, label, echo)
    shown = Echo(echo, bar)
    interrupted = False
    interrupted_by: str | None = None
    t0, t0_monotonic = time.perf_counter(), time.monotonic()
    log = _Log(log_path)
    timeline_path = run_dir / "timeline.csv"
    proc = deadline = sampler = None
    try:
        try:
            # a launcher's second run may first wait seconds for its warm server's imports: inside this `try`,
            # so that an interrupt then is recorded like one during a cold start's imports
            proc = start_process(list(command), env=child_env, cwd=None if cwd is None else str(cwd))
            deadline = _Deadline(proc, proc.pid, time_limit_s)
            sampler = TimelineSampler(
                timeline_path,
                root_pid=proc.pid,
                interval_s=sample_interval_s,
                visible_devices=child_env.get("CUDA_VISIBLE_DEVICES"),
            )
            with sampler:
                output = _Output(proc)
                for raw in output.lines():
                    line = redact_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                    log.write(line)
                    tail.append(line)
                    shown.show(line)
                    if shown.bar is not None and (match := ITER_PATTERN.search(line)):
                        shown.progress(int(match.group(1)))
                if output.cut_note is not None:
                    log.write(output.cut_note)
                    Echo(True, shown.bar).show(output.cut_note)  # said even with --quiet: a process was killed
                proc.wait()
        except KeyboardInterrupt as exc:
            shield.arm()  # from here on a second or third interrupt is counted, not raised
            interrupted = True
            interrupted_by = exc.signal_name if isinstance(exc, SignalInterrupt) else None
            message = (
                "lab: interrupted; ending the whole process group "
                f"(further interrupts are ignored; whatever is left after {terminate_grace_s():.0f} s is killed)"
            )
            log.write(message)
            Echo(True, shown.bar).show(message)  # said even with --quiet, unless the output is gone
            if proc is not None:
                _end_group(proc, proc.pid)
    finally:
        shield.arm()  # the process is over: an interrupt now must not cost the record
        if deadline is not None:
            deadline.cancel()
        if proc is not None:
            if proc.poll() is None:  # an unexpected error in this process: still leave nothing behind
                _end_group(proc, proc.pid)
            else:
                kill_group(proc.pid, signal.SIGKILL)  # stray grandchildren of a finished run
        if proc is not None and proc.stdout is not None:
            try:
                proc.stdout.close()
            except OSError:
                pass
        timed_out = deadline is not None and deadline.passed.is_set()
        if timed_out:
            log.write(f"lab: the time limit of {time_limit_s:.0f} s passed; the whole process group was ended")
        log.close()
        if shown.bar is not None:
            try:
                shown.bar.close()
            except (OSError, ValueError):
                pass
        if own_shield:
            shield.release()
    return ProcessOutcome(
        returncode=None if proc is None else proc.returncode,
        interrupted=interrupted,
        wall_s=time.perf_counter() - t0,
        log_path=log_path,
        timeline=TimelineSummary(path=timeline_path) if sampler is None else sampler.summary,
        reports=read_reports(report_dir),
        tail=list(tail),
        timed_out=timed_out and not interrupted,
        time_limit_s=time_limit_s,
        log_error=log.error,
        pid=None if proc is None else proc.pid,
        started_monotonic_s=t0_monotonic,
        process_start=None if proc is None else "warm" if isinstance(proc, WarmProcess) else "cold",
        interrupted_by=interrupted_by,
        exit_cause=getattr(proc, "exit_cause", None),
        echo_error=shown.error,
    )


def _child_env(env: Mapping[str, str] | None, report_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        **(env or {}),
        REPORT_DIR_ENV: str(report_dir),
        LAUNCHER_PID_ENV: str(os.getpid()),  # the child checks it is still ours (orphan_guard)
        "PYTHONUNBUFFERED": "1",
    }


def _show(line: str, bar) -> None:
    if bar is None:
        print(line, flush=True)
    else:
        bar.write(line, file=sys.stdout)
