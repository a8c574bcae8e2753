"""No stray ranks: each rank watches the processes it depends on and ends itself when one of them dies.

Lightning's launcher re-runs this module for local ranks 1..N-1 as children of rank 0. It also starts an
observer thread that looks every 5 s and SIGKILLs rank 0 without letting it report (a rank that died just before
its look cost rank 0 its report in about one run in six on the CPU), so rank 0 does not start it
(``without_lightning_observer``). A rank blocked in a collective on a dead peer can also wait up to the
collective timeout. So:

* rank 0 polls its rank children twice a second; when one exits non-zero it writes its own report
  (``error``: which rank died, with which code) and, if the dead rank could not write one (SIGKILL, a
  segfault), that rank's report too; then it kills the other children and exits;
* every other rank polls its parent (rank 0, or the launcher that started it) and exits, after reporting,
  when the parent is gone -- the case where rank 0 itself was killed.

The runner still kills the whole process group on an interrupt; this covers a rank dying on its own.
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
    """True once this process got SIGTERM (an interrupt from the runner): whatever fails next is the interrupt."""
    return _terminated.is_set()


def describe_exit(code: int) -> str:
    """ "exited with code 1" or "was killed by SIGKILL" (Popen reports a signal as a negative code)."""
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
    """Rank 0: when any child rank exits non-zero, report (for it too), kill the rest, exit (from this thread).

    ``on_dead_child(local_rank, message)`` lets the caller write the dead rank's report if it left none.
    A child that exits because the run was interrupted is not a failure: when ``is_interrupt()`` says so,
    the watcher stops and leaves the ending to the interrupt handling.
    """

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
    """Keep Lightning's launcher from starting its child-process observer in this process (rank 0).

    ``watch_children`` does the observer's job (end every rank when one dies) every 0.5 s instead of 5 s, and
    writes the reports first. Ranks started without a watcher still never stray: each watches its parent."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    if hasattr(subprocess_script, "_launch_process_observer"):  # Lightning 2.x; a later one may have none
        subprocess_script._launch_process_observer = lambda child_processes: None  # noqa: ARG005 -- its signature


def dead_children(procs: Sequence[subprocess.Popen], *, wait_s: float = 0.0) -> list[tuple[int, str]]:
    """(local rank, what happened) for each child rank that exited non-zero, waiting up to ``wait_s`` for one.

    Used when a collective has just failed: the peer's death may take a moment to be visible as an exit.
    """
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
    """Wait up to ``timeout_s`` for child ranks to exit on their own (after an interrupt they are writing their
    reports; Lightning SIGKILLs them right after rank 0's exception handling). Returns the local ranks still
    running: those blocked in a collective, which a signal cannot reach until it returns."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    return [i + 1 for i, proc in enumerate(procs) if proc.poll() is None]


def watch_parent(on_failure: Callable[[str], None], *, poll_s: float = POLL_S) -> threading.Thread:
    """Ranks > 0: when the parent that launched this rank is gone, report and exit."""
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
    """Turn the first SIGTERM into KeyboardInterrupt so a terminated rank reports ``interrupted`` and exits.

    Later SIGTERMs are ignored: a rank may get one from the runner (its whole process group) and one from a
    launcher passing it on, and a second KeyboardInterrupt would cut the report-writing short.
    """

    def handler(signum, frame):  # noqa: ARG001
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _terminated.set()
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
