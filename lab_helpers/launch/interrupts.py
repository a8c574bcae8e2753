"""Hold further interrupts while a run is being ended and recorded, so that pressing Ctrl-C again loses nothing.

Why: the first interrupt (Ctrl-C, Jupyter's "interrupt kernel", or the CLI's SIGTERM) starts ending the run's
process group. A student who presses again while the ranks are being stopped would otherwise raise a second
KeyboardInterrupt out of the runner before the record is appended, and a third before the SIGKILL that ends a
rank stuck in a collective -- which then holds the GPU. Once armed, the shield counts SIGINT and SIGTERM
instead of raising; the caller looks at ``count`` after the record is stored and raises then.

The shield holds every signal that would end the run: SIGINT, and each signal whose default action ends the
process (SIGHUP from a dropped SSH connection, SIGTERM, SIGQUIT, SIGUSR1, SIGTRAP, the real-time signals, ...) while
it still has that default or the CLI's ``raise_signal_interrupt``. A handler someone else installed (a test timer's
SIGALRM) is left alone.

Python delivers signals to the main thread only, so outside it there is nothing to hold and ``arm`` does nothing.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_NOT_ENDING = ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")
"""signal(7)'s signals whose default action is to ignore or to stop, not to end the process."""
_LEFT_OUT = ("SIGINT", "SIGKILL", "SIGPIPE", "SIGXFSZ", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")
"""Ending signals the CLI does not turn into an interrupt: SIGINT is Python's own (KeyboardInterrupt); SIGKILL cannot
be caught; Python ignores SIGPIPE and SIGXFSZ (a write then fails with an error the lab handles); a fault (SIGSEGV,
SIGBUS, SIGFPE, SIGILL) cannot be returned from."""


def _ending_signals() -> tuple[int, ...]:
    """Every signal whose default action ends the process, bar ``_LEFT_OUT``: one rule, not a list of names, so that
    SIGTRAP, SIGSYS, SIGABRT sent by ``kill`` and each real-time signal (SIGRTMIN..SIGRTMAX, which end a process by
    default) are recorded as SIGTERM is. Signals the C library keeps for itself (32 and 33 under glibc) are not in
    ``signal.valid_signals()`` and are skipped where Python refuses them."""
    skipped = {getattr(signal, name) for name in (*_NOT_ENDING, *_LEFT_OUT) if hasattr(signal, name)}
    return tuple(sorted(int(s) for s in signal.valid_signals() if s not in skipped))


ENDING_SIGNALS: tuple[int, ...] = _ending_signals()
"""Signals whose default action ends the process, SIGINT apart: the CLI turns each into an interrupt, so that a
dropped terminal (SIGHUP), a real-time signal or SIGTRAP ends and records a run as SIGTERM does."""

HELD_SIGNALS = (signal.SIGINT, *ENDING_SIGNALS)


class SignalInterrupt(KeyboardInterrupt):
    """An interrupt that a signal other than SIGINT caused: the record names the signal."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal_name(signum)
        super().__init__(f"ended by {self.signal_name}")
        self.signum = signum


def signal_name(signum: int) -> str:
    """SIGTERM, SIGRTMIN+1 (a real-time signal by its place, as kill -l names it), else "signal N"."""
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low < signum < high:
        return f"SIGRTMIN+{signum - low}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def raise_signal_interrupt(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 -- a handler's signature
    """The CLI's handler for ``ENDING_SIGNALS``: the run in progress is ended and recorded, as for Ctrl-C."""
    raise SignalInterrupt(signum)


def end_runs_on_signals() -> None:
    """Install ``raise_signal_interrupt`` for every ending signal that is not ignored (a background job's)."""
    for signum in ENDING_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, raise_signal_interrupt)
        except (OSError, ValueError):  # one the platform keeps for itself
            continue


def _would_end_the_run(handler: object) -> bool:
    return handler in (signal.SIG_DFL, signal.default_int_handler, raise_signal_interrupt, None)


class InterruptShield:
    """A context manager: interrupts raise as usual until ``arm()``; from then until exit they are counted."""

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
