"""The warm server's side of ``warm_start``. It imports as little of the lab as it can: each run imports
``lab_helpers`` afresh.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Mapping, Sequence

from lab_helpers.launch.warm_start import LAUNCHER_PID_ENV, SERVER_MODULE

_MESSAGE_BYTES = 1 << 20  # one request: argv, environment and working directory
_INTERRUPTED = -1  # _become_run's code for an uncaught KeyboardInterrupt


# ----------------------------------------------------------------------------------------- the server's side


def _set_command_line(text: str) -> None:
    """As setproctitle does: the kernel reads /proc/PID/cmdline from the argv area and, when its last byte is not NUL,
    stops at the first NUL; so the text goes there NUL-terminated and the rest stays non-NUL."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room < 2 or not _inside_stack(start, end):  # a write anywhere else would corrupt the process
        return
    data = text.encode("utf-8", errors="replace")[: room - 2] + b"\0"
    data += b" " * (room - len(data))
    ctypes.memmove(start, data, room)


def _inside_stack(start: int, end: int) -> bool:
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if line.rstrip().endswith("[stack]"):
                    low, high = (int(x, 16) for x in line.split()[0].split("-"))
                    return low <= start < end <= high
    except (OSError, ValueError):
        pass
    return False


class _CudaProbes:
    NAMES = ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties")
    C_NAMES = ("_cuda_getDeviceCount", "_cuda_init")  # what those call in a CUDA build of torch

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.calls: list[str] = []
        self._originals: list[tuple[object, str, object]] = []

    def __enter__(self) -> _CudaProbes:
        if not self.enabled:
            return self
        try:
            import torch.cuda
        except ImportError:
            return self
        for owner, names, prefix in ((torch.cuda, self.NAMES, "torch.cuda."), (torch._C, self.C_NAMES, "torch._C.")):
            for name in names:
                original = getattr(owner, name, None)
                if original is None:
                    continue
                self._originals.append((owner, name, original))

                def probe(*args, _original=original, _name=prefix + name, **kwargs):
                    self.calls.append(_name)
                    return _original(*args, **kwargs)

                setattr(owner, name, probe)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for owner, name, original in self._originals:
            setattr(owner, name, original)


def _cuda_driver_loaded() -> bool:
    """Catches any library's first CUDA call (bitsandbytes, DeepSpeed), not only torch's."""
    try:
        with open("/proc/self/maps") as fh:
            return "libcuda.so" in fh.read()
    except OSError:
        return False


def _why_not_fork_safe(probes: list[str]) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised while importing"
    if probes:
        return f"the imports called {probes[0]}"
    if _cuda_driver_loaded():
        return "the imports loaded the CUDA driver (libcuda)"
    if threading.active_count() > 1:
        return f"the imports started threads: {[t.name for t in threading.enumerate()]}"
    return None


def _imported_files() -> dict[str, int]:
    """So that a reinstall or an edit is seen: about 2,800 files, some 30 ms of stat calls per run on 2 busy cores,
    against 6-9 s of cold imports."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            try:
                files[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    return files


def _changed(files: Mapping[str, int]) -> str | None:
    for path, mtime_ns in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime_ns:
                return path
        except OSError:
            return path
    return None


def _serve(ctl: socket.socket, files: Mapping[str, int]) -> None:
    runs: dict[int, socket.socket] = {}
    pidfds: dict[int, int] = {}
    open_ctl = True
    while open_ctl or runs:
        watch = ([ctl] if open_ctl else []) + list(pidfds)
        ready, _, _ = select.select(watch, [], [], None if len(pidfds) == len(runs) else 0.05)
        if open_ctl and ctl in ready:
            message, fds, _, _ = socket.recv_fds(ctl, _MESSAGE_BYTES, 2)
            if not message:  # the launcher closed: no more runs; wait for those still running
                open_ctl = False
                for fd in fds:
                    os.close(fd)
            else:
                out_fd, status_fd = fds
                status = socket.socket(fileno=status_fd)
                if changed := _changed(files):
                    os.close(out_fd)
                    status.send(json.dumps({"reason": f"{changed} changed since the warm server imported it"}).encode())
                    status.close()
                    continue
                others = [ctl, status, *runs.values(), *pidfds]
                pid = _fork_run(json.loads(message), out_fd, close_in_child=others)
                os.close(out_fd)
                status.send(json.dumps({"pid": pid}).encode())
                runs[pid] = status
                try:
                    pidfds[os.pidfd_open(pid)] = pid
                except (AttributeError, OSError):  # no pidfd (old kernel): the loop polls instead
                    pass
        while runs:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            status = runs.pop(pid, None)
            for fd in [fd for fd, owner in pidfds.items() if owner == pid]:
                os.close(fd)
                del pidfds[fd]
            if status is not None:
                try:
                    status.send(json.dumps({"returncode": os.waitstatus_to_exitcode(wait_status)}).encode())
                except OSError:
                    pass
                status.close()


def _fork_run(request: dict, out_fd: int, *, close_in_child: list[socket.socket | int]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    # Python 3.12 warns about fork() with threads; torch's own are fork-safe (its DataLoader forks too)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _become_run(request, out_fd, close_in_child)
        if code == _INTERRUPTED:  # as Python ends on an uncaught KeyboardInterrupt: killed by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 -- the child must never return into the server's loop
        traceback.print_exc()
    finally:
        os._exit(code)


def _become_run(request: dict, out_fd: int, close_in_child: list[socket.socket | int]) -> int:
    os.setsid()
    for item in close_in_child:
        if isinstance(item, int):
            os.close(item)
        else:
            item.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[LAUNCHER_PID_ENV] = str(os.getppid())  # its parent is this server, which dies with the launcher
    argv = request["argv"]
    _set_command_line(" ".join(argv))
    if "numpy" in sys.modules:  # a cold process seeds numpy's global generator from the OS; so does this one
        sys.modules["numpy"].random.seed()
    module, args = argv[2], argv[3:]
    sys.argv = ["-m", *args]
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    sys.modules["__main__"] = types.ModuleType("__main__")  # a fresh namespace, not the server's
    import runpy

    code = 0
    try:
        runpy._run_module_as_main(module, alter_argv=True)  # what `python -m` itself calls
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = _INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 -- printed and exit status 1, as Python does
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # from runpy's frame on
        sys.excepthook(type(exc), exc, tb)
        code = 1
    _shutdown()
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _shutdown() -> None:
    """What the interpreter does at exit; ``os._exit`` in the forked child skips it."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    import atexit as _atexit

    _atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def main(argv: Sequence[str]) -> int:
    ctl = socket.socket(fileno=int(argv[0]))
    from lab_helpers.training.orphan_guard import die_with_parent

    die_with_parent()  # SIGTERM when the launcher dies; exits at once if it is already gone
    _set_command_line(f"{sys.executable} -m {SERVER_MODULE} (warm Python for the lab's runs; importing)")
    preload = [name for name in argv[1].split(",") if name]
    try:
        with _CudaProbes(enabled="torch" in preload) as probes:
            for name in preload:
                importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 -- said to the launcher, which starts its runs cold
        ctl.send(json.dumps({"reason": f"the warm server could not import: {exc!r}"}).encode())
        return 1
    reason = _why_not_fork_safe(probes.calls)
    ctl.send(json.dumps({"reason": reason}).encode())
    if reason is not None:
        return 1
    _set_command_line(f"{sys.executable} -m {SERVER_MODULE} (warm Python for the lab's runs)")
    _serve(ctl, _imported_files())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
