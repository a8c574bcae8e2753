"""End a training process group whose launcher died (a kernel restarted with SIGKILL, a closed SSH session):
nothing else would tell the ranks, and they would hold the GPU.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

LAUNCHER_PID_ENV = "LAB_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_EXIT_ORPHANED = 128 + signal.SIGTERM  # as if the launcher's SIGTERM had reached us
_launcher_pid: int | None = None  # set by the first die_with_parent(): later calls must not take init for it


def die_with_parent() -> int:
    """Call it before any heavy import: a launcher killed during torch's import would otherwise leave the run going,
    its guard taking init for the launcher. ``$LAB_LAUNCHER_PID`` catches a launcher that died before even this."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the pid check and the polling guard still apply
            pass
    global _launcher_pid
    expected = os.environ.pop(LAUNCHER_PID_ENV, "")
    parent = os.getppid()
    if expected.isdigit() and int(expected) != parent:
        print(f"lab: the launcher (pid {expected}) is gone before this run started; exiting", file=sys.stderr)
        os._exit(_EXIT_ORPHANED)  # nothing started yet: nothing to report, nothing to clean up
    if expected.isdigit():  # a new process told who its launcher is (a forked run is told again by its server)
        _launcher_pid = int(expected)
    elif _launcher_pid is None:  # started without the variable: the parent is the launcher
        _launcher_pid = parent
    # else a later call: keep the launcher found first, or a launcher that died in between would hand us init
    return _launcher_pid


def start_orphan_guard(poll_s: float = 1.0) -> threading.Thread:
    parent = die_with_parent()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGTERM)
                time.sleep(5)
                os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="lab-orphan-guard", daemon=True)
    thread.start()
    return thread
