"""Where the lab keeps its configs, checkpoints, data and results, and the rules by which it reads and writes files
there: one place decides, so notebooks, the CLI and tests agree.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def lab_home() -> Path:
    if env := os.environ.get("LAB_HOME"):
        return Path(env).expanduser().resolve()
    checkout = _PACKAGE_DIR.parent
    if (checkout / "configs").is_dir():
        return checkout
    return Path.cwd()


def configs_dir() -> Path:
    return lab_home() / "configs"


LOCATION_ENV = ("LAB_RESULTS", "LAB_CHECKPOINTS", "LAB_DATA")
LOCATION_DEFAULTS = {"LAB_RESULTS": "results", "LAB_CHECKPOINTS": "checkpoints", "LAB_DATA": "data"}
"""A relative value is read against the reader's working directory, and the training process runs in the lab's
home: the launcher makes each absolute once (``absolute_locations``)."""


def _location(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().absolute() if value else default


def checkpoints_dir() -> Path:
    return _location("LAB_CHECKPOINTS", lab_home() / "checkpoints")


def data_dir() -> Path:
    return _location("LAB_DATA", lab_home() / "data")


def results_dir() -> Path:
    return _location("LAB_RESULTS", lab_home() / "results")


def location_problem(name: str) -> str | None:
    """Only a folder the user set is judged, and nothing is created."""
    if not os.environ.get(name):
        return None
    folder = _location(name, Path())
    try:
        lab_folder(folder, create=False)
    except OSError as exc:
        default = lab_home() / LOCATION_DEFAULTS[name]
        return (f"{name}={shown_path(folder)} (the {LOCATION_DEFAULTS[name]} folder): {exc.strerror}; point {name} "
                f"at a folder you can write, or unset it for {default}")  # fmt: skip
    return None


def check_locations(names: tuple[str, ...] = LOCATION_ENV) -> None:
    from lab_helpers.config.config_error import LabConfigError

    for name in names:
        if (problem := location_problem(name)) is not None:
            raise LabConfigError(problem)


def shown_path(path: Path | str, limit: int = 80) -> str:
    """A path as one line can show it: a byte that is not UTF-8 as an escape, a long one cut in the middle."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")  # a byte that is not UTF-8 shown as \xff
    return text if len(text) <= limit else f"{text[: limit - 20]}...{text[-17:]} ({len(text)} characters)"


def absolute_locations() -> dict[str, str]:
    """For a child started in another working directory, to read the same folders."""
    return {name: str(_location(name, Path())) for name in LOCATION_ENV if os.environ.get(name)}


def regular_file_inside(folder: Path, relative: str | Path) -> Path | None:
    """A record is data anyone can edit: its ``timeline_path`` must never make the lab read (or publish)
    ``/etc/passwd``, a link to a secret, or a FIFO that blocks a read."""
    text = str(relative)
    if not text or Path(text).is_absolute() or ".." in Path(text).parts or "\0" in text:
        return None
    try:
        root = folder.resolve()
        path = (root / text).resolve(strict=True)
        if not path.is_relative_to(root) or not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, an unreadable folder
        return None
    return path


REFERENCE_DIRNAME = "reference_results"


def reference_dir() -> Path:
    return lab_home() / REFERENCE_DIRNAME


# ------------------------------------------------------------------------------------------------ writing

SPECIAL_ROOTS = ("/proc", "/sys", "/dev")
"""File systems that are not storage: a lab folder there would write into the kernel's files or a device."""
NAME_MAX = 255  # bytes in one name of a path (Linux, every common file system)
PATH_MAX = 4095


def describe_os_error(exc: OSError) -> str:
    """An OSError in words a student can act on."""
    if exc.errno == errno.ELOOP:  # the lab's own words (which link) where it gave them
        if exc.strerror and exc.strerror != os.strerror(errno.ELOOP):
            return exc.strerror
        return "it is a symbolic link, and the lab does not write through one (remove the link)"
    if exc.errno == errno.EISDIR:
        return "it is a directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (another user, e.g. a `sudo` run, may own it)"
    if exc.errno == errno.ENAMETOOLONG:
        return f"a name in it is too long (at most {NAME_MAX} bytes a name, {PATH_MAX} in all)"
    return exc.strerror or str(exc)


def _refused(number: int, why: str, path: Path | str) -> OSError:
    return OSError(number, why, str(path))


def path_problem(path: Path) -> str | None:
    """From the text alone. A byte that is not UTF-8 is refused: litgpt reads its paths as UTF-8 and fails late."""
    text = os.fsencode(path)
    if len(text) > PATH_MAX or any(len(part) > NAME_MAX for part in text.split(b"/")):
        return f"a name in it is too long (at most {NAME_MAX} bytes a name, {PATH_MAX} in all)"
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return "it holds a byte that is not UTF-8 text, which the training (litgpt) cannot read (rename the folder)"
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + "/") for root in SPECIAL_ROOTS):
        return f"it is on a special file system ({real}), not storage"
    return None


def lab_folder(folder: Path, *, create: bool = True, inside: Path | None = None) -> Path:
    """A link the user made to a bigger disk is fine; /proc, /sys and /dev are not storage. Below ``inside`` (the
    results folder's ``runs/``, ``figures/``) every folder is a real one: a link there sent writes to its target."""
    if (problem := path_problem(folder)) is not None:
        raise _refused(errno.EINVAL, problem, folder)
    if os.path.islink(folder) and not os.path.exists(folder):
        raise _refused(errno.ENOENT, "it is a symbolic link to nothing (a dangling link)", folder)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise _refused(errno.ENOTDIR, "it is not a folder (a file is there)", folder)
    for above in Path(os.path.abspath(folder)).parents:  # a file where a folder above it is needed
        if os.path.lexists(above) and not os.path.isdir(above):
            raise _refused(errno.ENOTDIR, f"{above} is not a folder (a file is there)", folder)
        if os.path.isdir(above):
            break
    _no_link_below(inside, folder)
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _refused(exc.errno or errno.EIO, describe_os_error(exc), folder) from None
        _no_link_below(inside, folder)  # again: a link planted between the check and the mkdir
    return folder


def _no_link_below(inside: Path | None, folder: Path) -> None:
    if inside is None:
        return
    below = Path(os.path.abspath(inside))
    for part in Path(os.path.abspath(folder)).relative_to(below).parts:
        below = below / part
        if os.path.islink(below):
            raise _refused(errno.ELOOP, f"{shown_path(below)} is a symbolic link, and the lab keeps its files there "
                           "only in a real folder (remove the link)", folder)  # fmt: skip


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """The rule of every file the lab appends to: no link followed, and a regular file only (a FIFO would block)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_lab_file(path: Path, data: bytes | Callable[[BinaryIO], None]) -> Path:
    """The rule of every whole file the lab writes: never through a link or into a hard link's shared file, never
    left half-written (a new file beside it, then one rename); on failure the old file is as it was."""
    path = Path(path)
    lab_folder(path.parent)
    if path.name in ("", ".", "..") or len(os.fsencode(path.name)) > NAME_MAX - 20:
        raise _refused(errno.EINVAL, "not a file name the lab writes", path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        number = errno.ELOOP if stat.S_ISLNK(info.st_mode) else errno.EISDIR if stat.S_ISDIR(info.st_mode) else 0
        words = describe_os_error(OSError(number, os.strerror(number) if number else "not a regular file"))
        raise _refused(number or errno.EINVAL, words, path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes | bytearray | memoryview):
                fh.write(data)
            else:
                data(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` may take part of a buffer (a signal, a pipe, a disk's last blocks): the rest goes after it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(folder: Path) -> None:
    """A new or renamed file is durable only once its folder is synced too."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ reading


def open_lab_file(path: Path, *, max_bytes: int, folder: Path | None = None) -> BinaryIO:
    """The rule of every file the lab reads, as anyone may have planted it: a regular file (a FIFO's read would hang,
    ``/dev/zero`` never ends), no link followed, at most ``max_bytes``; with ``folder``, no link on the way."""
    path = Path(path)
    if folder is None:
        folder, parts = path.parent, (path.name,)
    else:
        try:
            parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(folder)).parts
        except ValueError:
            parts = ()
        if not parts or ".." in parts:
            raise _refused(errno.EXDEV, f"not inside {shown_path(folder)}, where the lab reads it", path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(folder, flags & ~os.O_NOFOLLOW | os.O_DIRECTORY)  # the folder itself may be a link the user made
    try:
        for part in parts[:-1]:
            below = _open_below(fd, part, flags | os.O_DIRECTORY, path)
            os.close(fd)
            fd = below
        file_fd = _open_below(fd, parts[-1], flags | os.O_NONBLOCK, path)
    finally:
        os.close(fd)
    try:
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused(errno.EINVAL, f"not a regular file ({_kind(info.st_mode)})", path)
        if info.st_size > max_bytes:
            raise _refused(errno.EFBIG, f"{info.st_size:,} bytes, more than the {max_bytes:,} it may hold", path)
        os.set_blocking(file_fd, True)
        return os.fdopen(file_fd, "rb")
    except BaseException:
        os.close(file_fd)
        raise


def read_lab_file(path: Path, *, max_bytes: int, folder: Path | None = None) -> bytes:
    """A file that grows while read is cut at ``max_bytes`` and refused."""
    with open_lab_file(path, max_bytes=max_bytes, folder=folder) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _refused(errno.EFBIG, f"more than the {max_bytes:,} bytes it may hold", path)
    return data


def _open_below(dir_fd: int, name: str, flags: int, path: Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(errno.ELOOP, "a symbolic link, which the lab does not read through", path) from None
        if exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise _refused(errno.ELOOP, f"{name} on its way is a symbolic link, which the lab does not read through",
                           path) from None  # fmt: skip
        raise


def _kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISDIR: "a directory", stat.S_ISCHR: "a device", stat.S_ISBLK: "a device",
             stat.S_ISSOCK: "a socket"}  # fmt: skip
    return next((word for test, word in kinds.items() if test(mode)), "not a file")
