"""One training run at a time on a node: two runs at once share its GPUs and cores, so each record's time, GPU-busy
figure and OOM would be the pair's, silently.

``flock`` is let go by the kernel when its holder dies (``kill -9`` too), so the lock is never stale. One file for
every user of the node, since the GPUs are shared. A lock that cannot be opened must not cost a run: it goes on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lab_helpers.config.config_error import LabConfigError

LOCK_ENV = "LAB_RUN_LOCK"


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or Path(tempfile.gettempdir()) / "lab_helpers-runs.lock")


def _open(path: Path) -> int:
    """Made only where missing: a file another user made in sticky /tmp must be opened, not re-made
    (``fs.protected_regular`` refuses O_CREAT there)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(2):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue  # made by another run meanwhile: open that one
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)  # past the umask
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return fd
    raise OSError(errno.EAGAIN, "made and removed while opening")


def _holder(fd: int) -> str:
    try:
        held = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(held, dict) or not held.get("experiment"):
        return ""
    return f" ({held['experiment']}, pid {held.get('pid')}, started {held.get('started_at')}, in {held.get('where')})"


@contextlib.contextmanager
def one_run_at_a_time(what: str, where: Path) -> Iterator[None]:
    """``what`` and ``where`` are named in another run's refusal, so that the student can find the run in flight."""
    path = lock_path()
    try:
        fd = _open(path)
    except OSError as exc:
        print(f"note: could not check for another run on this node ({path}: {exc.strerror or exc}); running anyway")
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabConfigError(
                f"another lab run is in progress on this node{_holder(fd)}: two runs at once share its GPUs and "
                f"cores, and each record's time and memory would be the pair's; wait for it to end, or stop it"
            ) from None
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        held = {"experiment": what, "pid": os.getpid(), "started_at": now, "where": str(where)}
        with contextlib.suppress(OSError):  # who holds it is for the message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(held).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)
