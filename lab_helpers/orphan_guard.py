"""End a training process group whose launcher died.

The runner ends its process group on an interrupt, but if the launcher itself is killed (a Jupyter kernel
restarted with SIGKILL, a closed SSH session), nothing would tell the ranks: they would hold the GPU until
someone runs ``pkill``. Each training process starts this guard; when its parent changes (the launcher is
gone) it ends its whole process group.
"""

from __future__ import annotations

import os
import signal
import threading
import time


def start_orphan_guard(poll_s: float = 1.0) -> threading.Thread:
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGTERM)
                time.sleep(5)
                os.killpg(os.getpgrp(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="lab-orphan-guard", daemon=True)
    thread.start()
    return thread
