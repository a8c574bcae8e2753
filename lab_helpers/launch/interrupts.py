"""Hold further interrupts while a run is being ended and recorded, so that pressing Ctrl-C again loses nothing.

A second KeyboardInterrupt would leave the runner before the record is appended, and a third before the SIGKILL of a
rank stuck in a collective, which then holds the GPU. So the armed shield counts them; the caller raises once the
record is stored. A handler someone else installed (a test timer's SIGALRM) is left alone.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_NOT_ENDING = ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")  # signal(7)
_LEFT_OUT = ("SIGINT", "SIGKILL", "SIGPIPE", "SIGXFSZ", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")
"""SIGINT is Python's own; SIGKILL cannot be caught; Python ignores SIGPIPE and SIGXFSZ (the write fails instead); a
fault cannot be returned from."""


def _ending_signals() -> tuple[int, ...]:
    """One rule, not a list of names, so that SIGHUP, SIGTRAP and each real-time signal end and record a run as
    SIGTERM does."""
    skipped = {getattr(signal, name) for name in (*_NOT_ENDING, *_LEFT_OUT) if hasattr(signal, name)}
    return tuple(sorted(int(s) for s in signal.valid_signals() if s not in skipped))


ENDING_SIGNALS: tuple[int, ...] = _ending_signals()

HELD_SIGNALS = (signal.SIGINT, *ENDING_SIGNALS)


class SignalInterrupt(KeyboardInterrupt):
    def __init__(self, signum: int) -> None:
        self.signal_name = signal_name(signum)
        super().__init__(f"ended by {self.signal_name}")
        self.signum = signum


def signal_name(signum: int) -> str:
    """A real-time signal by its place, as ``kill -l`` names it (SIGRTMIN+1)."""
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low < signum < high:
        return f"SIGRTMIN+{signum - low}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def raise_signal_interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 -- a handler's signature
    raise SignalInterrupt(signum)


def end_runs_on_signals() -> None:
    for signum in ENDING_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, raise_signal_interrupt)
        except (OSError, ValueError):  # one the platform keeps for itself
            continue


def _would_end_the_run(handler: object) -> bool:
    return handler in (signal.SIG_DFL, signal.default_int_handler, raise_signal_interrupt, None)


class InterruptShield:
    def __init__(self) -> None:
        self.count = 0
        self._saved: dict[int, object] = {}

    @property
    def armed(self) -> bool:
        return bool(self._saved)

    def arm(self) -> None:
        if self.armed or threading.current_thread() is not threading.main_thread():
            return
        for signum in HELD_SIGNALS:
            try:
                previous = signal.getsignal(signum)
                if not _would_end_the_run(previous):
                    continue  # ignored, or someone else's handler
                signal.signal(signum, self._hold)
            except (OSError, ValueError):  # one the platform keeps for itself
                continue
            self._saved[signum] = signal.SIG_DFL if previous is None else previous

    def release(self) -> None:
        saved, self._saved = self._saved, {}
        for signum, handler in saved.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _hold(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002 -- a signal handler's signature
        self.count += 1  # no printing here: a handler that writes to stdout can re-enter a write in progress

    def __enter__(self) -> InterruptShield:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
