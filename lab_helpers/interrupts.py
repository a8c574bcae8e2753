"""Hold further interrupts while a run is being ended and recorded, so that pressing Ctrl-C again loses nothing.

Why: the first interrupt (Ctrl-C, Jupyter's "interrupt kernel", or the CLI's SIGTERM) starts ending the run's
process group. A student who presses again while the ranks are being stopped would otherwise raise a second
KeyboardInterrupt out of the runner before the record is appended, and a third before the SIGKILL that ends a
rank stuck in a collective -- which then holds the GPU. Once armed, the shield counts SIGINT and SIGTERM
instead of raising; the caller looks at ``count`` after the record is stored and raises then.

Python delivers signals to the main thread only, so outside it there is nothing to hold and ``arm`` does nothing.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
            previous = signal.getsignal(signum)
            signal.signal(signum, self._hold)
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
