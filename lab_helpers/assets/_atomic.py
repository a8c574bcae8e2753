"""Build-then-rename helpers, so an interrupted build never leaves something that looks finished: a killed build
leaves only a hidden sibling, which no cache check looks at and the next build removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab_helpers.config.paths import fsync_dir

_HOST = socket.gethostname().replace("-", "_").replace(".", "_") or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _temp_name(dest: Path, kind: str) -> Path:
    return dest.parent / f".{dest.name}.{kind}-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"


def temp_siblings(dest: Path) -> list[Path]:
    if not dest.parent.is_dir():
        return []
    return sorted(p for kind in ("partial", "old") for p in dest.parent.glob(f".{dest.name}.{kind}-*"))


def remove_stale_temps(dest: Path) -> list[Path]:
    """Only this host's, of processes that are gone: a live build's or another host's are not ours to judge."""
    removed = []
    for p in temp_siblings(dest):
        try:
            _, host, pid, _ = p.name.rsplit("-", 3)
            pid_int = int(pid)
        except ValueError:
            continue
        if host == _HOST and not _pid_alive(pid_int):
            _remove(p)
            removed.append(p)
    return removed


@contextlib.contextmanager
def build_lock(dest: Path) -> Iterator[None]:
    """Parallel test sessions or two notebooks may ask for one asset at once: callers check without the lock, then
    again under it, so it is built once and no folder is swapped out from under a reader."""
    import fcntl

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "a+b") as fp:
        fcntl.flock(fp.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fp.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """``dest`` is moved aside before the swap, so it never holds a mix of old and new files."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(dest)
    tmp = _temp_name(dest, "partial")
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if dest.exists() or dest.is_symlink():
            old = _temp_name(dest, "old")
            os.rename(dest, old)
        os.rename(tmp, dest)
        if old is not None:
            _remove(old)
        _fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see either the old content or the whole new content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = _temp_name(path, "partial")
    try:
        with open(tmp, "wb") as fp:
            fp.write(data)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_json(path: Path, obj: Any, *, atomic: bool = True) -> None:
    data = (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode("utf-8")
    if atomic:
        write_bytes_atomic(path, data)
    else:
        Path(path).write_bytes(data)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None if it is missing or not valid JSON (a cache check treats both as 'not built')."""
    try:
        with open(path, encoding="utf-8") as fp:
            return json.load(fp)
    except (OSError, ValueError):
        return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for chunk in iter(lambda: fp.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with contextlib.suppress(OSError), open(p, "rb") as fp:
                os.fsync(fp.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # a folder that cannot be synced (some network file systems) fails no asset
        fsync_dir(path)
