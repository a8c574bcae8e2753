"""No stray ranks: rank 0 polls its children, every other rank its parent, and each reports and ends itself when one
dies; otherwise a rank blocked in a collective on a dead peer waits out the collective timeout.

Lightning's own observer SIGKILLs rank 0 before it can report (about one run in six on the CPU), so it is not started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

POLL_S = 0.5
EXIT_CODE_PEER_FAILED = 70
_terminated = threading.Event()


def was_terminated() -> bool:
    """Whatever fails after the runner's SIGTERM is the interrupt, not an error."""
    return _terminated.is_set()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def watch_children(
    procs: Sequence[subprocess.Popen],
    on_failure: Callable[[str], None],
    *,
    on_dead_child: Callable[[int, str], None] | None = None,
    is_interrupt: Callable[[], bool] = lambda: False,
    poll_s: float = POLL_S,
) -> threading.Thread:
    """A child that exits because the run was interrupted is not a failure: ``is_interrupt()`` stops the watcher."""

    def run() -> None:
        while True:
            time.sleep(poll_s)
            codes = [p.poll() for p in procs]
            failed = [(i + 1, p, c) for i, (p, c) in enumerate(zip(procs, codes, strict=True)) if c not in (None, 0)]
            if failed and is_interrupt():
                return
            if failed:
                local_rank, proc, code = failed[0]
                message = f"local rank {local_rank} (pid {proc.pid}) {describe_exit(code)}; stopping every rank"
                if on_dead_child is not None:
                    for dead_rank, dead_proc, dead_code in failed:
                        _end(
                            f"local rank {dead_rank} (pid {dead_proc.pid}) {describe_exit(dead_code)}",
                            lambda text, r=dead_rank: on_dead_child(r, text),
                            quiet=True,
                        )
                _end(message, on_failure)
                for other in procs:
                    if other.poll() is None:
                        other.kill()
                os._exit(EXIT_CODE_PEER_FAILED)
            if all(c == 0 for c in codes):
                return

    thread = threading.Thread(target=run, name="lab-peer-watch", daemon=True)
    thread.start()
    return thread


def without_lightning_observer() -> None:
    from lightning.pytorch.strategies.launchers import subprocess_script

    if hasattr(subprocess_script, "_launch_process_observer"):  # Lightning 2.x; a later one may have none
        subprocess_script._launch_process_observer = lambda child_processes: None  # noqa: ARG005 -- its signature


def dead_children(procs: Sequence[subprocess.Popen], *, wait_s: float = 0.0) -> list[tuple[int, str]]:
    """``wait_s``: after a failed collective, the peer's death may take a moment to show as an exit."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [
            (i + 1, f"local rank {i + 1} (pid {p.pid}) {describe_exit(p.returncode)}")
            for i, p in enumerate(procs)
            if p.poll() not in (None, 0)
        ]
        if dead or time.monotonic() >= deadline or not procs:
            return dead
        time.sleep(0.1)


def let_children_finish(procs: Sequence[subprocess.Popen], *, timeout_s: float = 5.0) -> list[int]:
    """After an interrupt the children are writing their reports, and Lightning SIGKILLs them right after rank 0's
    exception handling. Returns those still blocked in a collective."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    return [i + 1 for i, proc in enumerate(procs) if proc.poll() is None]


def watch_parent(on_failure: Callable[[str], None], *, poll_s: float = POLL_S) -> threading.Thread:
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                _end(f"the launching process (pid {parent}, rank 0 or the node launcher) is gone; stopping", on_failure)
                os._exit(EXIT_CODE_PEER_FAILED)

    thread = threading.Thread(target=run, name="lab-parent-watch", daemon=True)
    thread.start()
    return thread


def _end(message: str, on_failure: Callable[[str], None], *, quiet: bool = False) -> None:
    if not quiet:
        print(f"[lab] {message}", flush=True)
    try:
        on_failure(message)
    except Exception as exc:  # the report is best effort here; exiting is what matters
        print(f"[lab] could not write the report: {exc}", flush=True)


def sigterm_as_interrupt() -> None:
    """Later SIGTERMs are ignored: a rank may get one from the runner and one from a launcher passing it on, and a
    second KeyboardInterrupt would cut the report short."""

    def handler(signum, frame):  # noqa: ARG001
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _terminated.set()
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
