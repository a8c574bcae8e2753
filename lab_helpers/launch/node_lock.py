"""One training run at a time on a node: a second run is refused with one line while another is in flight.

Why: two runs at once (01 in one tab and 02 in another, or a terminal's ``run`` beside a notebook) share the
node's GPUs and CPU cores. Each record's time would be the pair's, NVML's GPU-busy figure would count both, and an
OOM could be the other run's memory: wrong results that say nothing of it. So every run holds one lock file per
node (``flock``, which the kernel lets go of when its holder dies, ``kill -9`` included, so it is never stale)
from before its training starts until its record is stored, and writes who holds it there for the one line.

``$LAB_RUN_LOCK``: the lock file (default ``<tmp>/lab_helpers-runs.lock``, one for every user of the node: the GPUs
are shared). Where the file cannot be opened at all (a link planted there, a read-only /tmp), the run goes on and
says it could not check: a lock that fails must not cost a run.
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
    """The node's run lock: ``$LAB_RUN_LOCK``, else one file in the system's temporary folder."""
    return Path(os.environ.get(LOCK_ENV) or Path(tempfile.gettempdir()) / "lab_helpers-runs.lock")


def _open(path: Path) -> int:
    """The lock file opened for reading and writing, never through a link; made (0666: every user's runs share
    the node) only where it is missing, so that a file another user made in sticky /tmp is opened, not re-made
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
    """Who holds the lock, as its holder wrote it; empty where it has not written yet."""
    try:
        held = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(held, dict) or not held.get("experiment"):
        return ""
    return f" ({held['experiment']}, pid {held.get('pid')}, started {held.get('started_at')}, in {held.get('where')})"


@contextlib.contextmanager
def one_run_at_a_time(what: str, where: Path) -> Iterator[None]:
    """Hold this node's run lock for the block: LabConfigError at once where another run holds it. ``what`` (the
    experiment, or a measurement such as ``launch-cost``) and ``where`` (its results folder) are named in a refusal,
    so that the student can find the run in flight."""
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
