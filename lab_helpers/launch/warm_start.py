"""Start a launcher's later runs from a warm Python that has already imported torch, Lightning and litgpt.

Why: every run is a process of its own (a crash or an OOM never takes the notebook with it), and each such
process used to spend 6-9 s of a 2-core CPU importing torch, Lightning and litgpt before its first step: most
of a ci-profile run, and most of the time CI takes. A launcher that starts a second run (a notebook, ``run_all``,
the test suite) is likely to start more, so from its second run on the lab keeps one *warm server* per
environment: a process that imported those packages once and forks a copy of itself for each run. A single
``python -m lab_helpers run`` starts its one run as before (a cold start), with no server.

A forked run is what a cold one is: a process in its own session (its pid is its process group), stdout and
stderr on the runner's pipe, stdin on /dev/null, the run's environment, working directory, argv and ``sys.path``,
and a command line (``ps``, ``psutil``, ``nvidia-smi``) showing its own command. The runner waits for it, ends
its group and samples its tree exactly as before. Only its parent differs: the server, which dies with the
launcher (``PR_SET_PDEATHSIG``), so the run's orphan guard still ends the run when the launcher is gone.

Where it is on: the ``ci`` profile (CPUs, the notebooks under nbval, the test suite). On a GPU it stays off until a
GPU session shows warm and cold runs of one experiment measure the same peak memory and step time
(``benchmarks/warm_start.py --profile gpu``; docs/measuring-on-a-gpu.md): :func:`setting_for` gives the default,
and ``LAB_WARM_START=1`` or ``0`` set by the student wins.

A run starts cold, as before, whenever the warm path is not certainly the same: ``LAB_WARM_START=0``; not Linux;
a command other than ``python -m MODULE``; the server failed to start or died; the server's imports touched
CUDA (a fork after CUDA is initialised leaves the child unable to use it) or started a thread (then every later
run of the launcher starts cold too). The server is shared only by runs whose environment is the same apart
from the lab's own ``LAB_*`` settings, which only ``lab_helpers`` reads, and each run imports ``lab_helpers``
afresh. Each record says how its process started (``process_start``: ``warm`` or ``cold``).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import types
import warnings
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

WARM_START_ENV = "LAB_WARM_START"  # "0": every run is a cold start
PRELOAD = ("torch", "lightning", "litgpt.finetune.lora", "litgpt.finetune.full")  # what every run imports
LAB_PREFIX = "LAB_"  # the lab's own settings: may differ between runs that share a server
MAX_SERVERS = 2  # environments kept warm at once (the oldest is closed first)
READY_TIMEOUT_S = 600.0  # the server's imports on a cold page cache over a slow disk
_LAUNCHER_PID_ENV = "LAB_LAUNCHER_PID"  # orphan_guard's; not imported here, the server imports as little as it can
_TITLE_ROOM = 4096  # bytes of command line a forked run can show (the server starts with that much argv)
_SERVER_MODULE = "lab_helpers.launch.warm_start"
_MESSAGE_BYTES = 1 << 20  # one request: argv, environment and working directory
_INTERRUPTED = -1  # _become_run's code for an uncaught KeyboardInterrupt


# ----------------------------------------------------------------------------------------- the launcher's side


def setting_for(profile: str) -> str:
    """``LAB_WARM_START`` for a run of ``profile``: the student's own setting, else on ("1") for the ``ci`` profile
    only. Off ("0") on a GPU until a GPU session measures warm against cold (issue 26 has not yet)."""
    return os.environ.get(WARM_START_ENV) or ("1" if profile == "ci" else "0")


class WarmProcess:
    """A run forked by a warm server, with what the runner uses of ``subprocess.Popen``.

    ``wait`` and ``poll`` read the exit status the server (the run's parent) sends when it reaps the run: a
    negative number for a signal, as ``Popen`` reports it.
    """

    def __init__(self, args: Sequence[str], pid: int, stdout_fd: int, status: socket.socket) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self.exit_cause: str | None = None  # set when the server died: the run's end is the server's doing
        self.stdout = os.fdopen(stdout_fd, "rb")
        self._status = status
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):  # busy: another thread waits for it
            try:
                self._read_status(0.0)
            except subprocess.TimeoutExpired:
                pass
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                self._read_status(timeout)
        assert self.returncode is not None
        return self.returncode

    def _read_status(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._status], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        data = self._status.recv(4096)
        self._status.close()
        if data:
            self.returncode = int(json.loads(data)["returncode"])
        else:  # the server died without reaping the run: the run got SIGTERM from the kernel (PDEATHSIG)
            self.returncode = -signal.SIGTERM
            self.exit_cause = (
                "the lab's warm server (the run's parent process) died, and the kernel ended the run with SIGTERM"
            )


class _Server:
    """One warm Python for one environment, started by this launcher and ended with it."""

    def __init__(self, env: Mapping[str, str], cwd: str, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", _SERVER_MODULE, str(theirs.fileno()), ",".join(preload), " " * _TITLE_ROOM]
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, _LAUNCHER_PID_ENV: str(os.getpid())},
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # stderr stays the launcher's: a server that fails says why there
            start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only, as it does for runs
        )
        theirs.close()
        self.ctl = ours

    def wait_ready(self, timeout_s: float) -> str | None:
        """Block until the server has imported everything; None when it can serve, else why it cannot."""
        ready, _, _ = select.select([self.ctl], [], [], timeout_s)
        data = self.ctl.recv(4096) if ready else b""
        answer = json.loads(data) if data else {"reason": "the warm server did not start"}
        return answer.get("reason")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> WarmProcess:
        """Fork one run; OSError when the server is gone (the caller then starts the run cold).

        An interrupt at any point in here leaves no run behind: once the request may have reached the server,
        the answer is awaited and the run it started is killed before the interrupt goes on.
        """
        read_fd, write_fd = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
        try:
            try:
                socket.send_fds(self.ctl, [request], [write_fd, theirs.fileno()])
            finally:  # the server holds its own copies now; without them, `ours` reads EOF when it has none
                os.close(write_fd)
                theirs.close()
            data = ours.recv(4096)
        except BaseException:
            answer = json.loads(_recv_within(ours, 5.0) or b"{}")
            if "pid" in answer:
                kill_group(int(answer["pid"]))
            os.close(read_fd)
            ours.close()
            raise
        answer = json.loads(data) if data else {"reason": "the warm server ended before it started the run"}
        if "pid" not in answer:
            os.close(read_fd)
            ours.close()
            raise OSError(answer["reason"])
        return WarmProcess(argv, int(answer["pid"]), read_fd, ours)

    def close(self) -> None:
        """No more runs: the server exits once the runs it forked have ended (at once, between runs)."""
        self.ctl.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a run of it still going: it exits after that run
            pass


def _recv_within(sock: socket.socket, timeout_s: float) -> bytes:
    try:
        ready, _, _ = select.select([sock], [], [], timeout_s)
        return sock.recv(4096) if ready else b""
    except OSError:
        return b""


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group (a run, a forked run, a server that has forked nothing yet) that may be gone already."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class WarmStarter:
    """Starts runs cold or from a warm server, as described in the module docstring."""

    def __init__(self, preload: Sequence[str] = PRELOAD, *, max_servers: int = MAX_SERVERS) -> None:
        self.preload = tuple(preload)
        self.max_servers = max_servers
        self._servers: OrderedDict[tuple, _Server] = OrderedDict()
        self._cold_reason: str | None = None  # a server refused (its imports touched CUDA): cold from then on
        self._starts: Counter[tuple] = Counter()
        self._lock = threading.Lock()
        self.last_cold_reason: str | None = None  # why the last run started cold (None: it was forked)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None):
        """Start ``argv`` as the runner needs it: ``subprocess.Popen`` or a ``WarmProcess`` with the same use."""
        cwd = os.path.abspath(cwd or os.getcwd())
        reason = self._why_cold(argv, env)
        if reason is None:
            key = (threading.get_ident(), *_environment_key(env, cwd))  # a server dies with the thread that started it
            with self._lock:
                self._starts[key] += 1
                if self._starts[key] < 2:
                    reason = "the launcher's first run in this environment"
                else:
                    server = self._server_for(key, env, cwd)
                    reason = self._cold_reason if server is None else None
            if reason is None:
                try:
                    proc = server.spawn(argv, env, cwd)
                    self.last_cold_reason = None
                    return proc
                except OSError as exc:
                    reason = f"the warm server failed: {exc}"
                    with self._lock:
                        self._drop(key)
        self.last_cold_reason = reason
        return _cold(argv, env=env, cwd=cwd)

    def _why_cold(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        if env.get(WARM_START_ENV, "1") == "0":
            return f"{WARM_START_ENV}=0"
        if not sys.platform.startswith("linux"):
            return "not Linux"
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            return "not a `python -m MODULE` command"
        return None

    def _server_for(self, key: tuple, env: Mapping[str, str], cwd: str) -> _Server | None:
        if self._cold_reason is not None:
            return None
        server = self._servers.get(key)
        if server is not None and not server.alive():
            self._drop(key)
            server = None
        if server is None:
            while len(self._servers) >= self.max_servers:
                self._drop(next(iter(self._servers)))
            try:
                server = _Server(env, cwd, self.preload)
            except OSError as exc:
                self._cold_reason = f"the warm server could not start: {exc}"
                return None
            try:
                refused = server.wait_ready(READY_TIMEOUT_S)
            except BaseException:  # an interrupt while it imports: nothing has started yet
                _stop(server)
                raise
            if refused is not None:
                self._cold_reason = refused
                _stop(server)
                return None
            self._servers[key] = server
        self._servers.move_to_end(key)
        return server

    def _drop(self, key: tuple) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.close()

    def close(self) -> None:
        with self._lock:
            for key in list(self._servers):
                self._drop(key)


def _stop(server: _Server) -> None:
    server.close()
    kill_group(server.proc.pid)  # it has forked nothing yet
    server.proc.wait()


def _environment_key(env: Mapping[str, str], cwd: str) -> tuple:
    """What a server's imports may have read: the whole environment but the lab's own settings, and the cwd."""
    return (cwd, tuple(sorted((k, v) for k, v in env.items() if not k.startswith(LAB_PREFIX))))


def _cold(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None) -> subprocess.Popen:
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the runner ends it as a whole
    )


_starter: WarmStarter | None = None


def start_process(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None):
    """The runner's way to start a training process (this launcher's shared ``WarmStarter``)."""
    global _starter
    if _starter is None:
        _starter = WarmStarter()
        atexit.register(_starter.close)
    return _starter.popen(argv, env=env, cwd=cwd)


# ----------------------------------------------------------------------------------------- the server's side


def _set_command_line(text: str) -> None:
    """Show ``text`` as this process's command line, in the room its argv had (as setproctitle does).

    The kernel reads /proc/PID/cmdline from the argv area; when its last byte is not NUL it stops at the first
    NUL, so the text goes there NUL-terminated and the rest stays non-NUL.
    """
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
    """The argv area lies at the top of the main thread's stack mapping; check that before writing to it."""
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
    """Record every call that may initialise CUDA while the server imports (torch is imported first for it)."""

    NAMES = ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties")
    C_NAMES = ("_cuda_getDeviceCount", "_cuda_init")  # what those call in a CUDA build of torch

    def __init__(self, *, enabled: bool) -> None:
        """``enabled``: torch is among the preloads (without it nothing of CUDA can be touched by them)."""
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
    """libcuda is loaded on the first CUDA call of any library (torch, bitsandbytes, DeepSpeed), never before."""
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
    """Every file the server has imported, and its mtime: a reinstall or an edit of any of them (torch, litgpt,
    the lab's own modules, what those import from elsewhere) changes one. With torch, Lightning and litgpt
    imported that is about 2,800 files: some 30 ms of stat calls per run on 2 busy cores, against 6-9 s of cold
    imports."""
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
    """Fork one run per request; send each run's pid, then its exit status once reaped.

    A run is not forked once a file the server imported has changed on disk (a package upgraded or edited
    since): the launcher is told, drops this server and starts the run cold, then a fresh server."""
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
    """In the forked child: become the process ``python -m MODULE ARGS`` would have started, then run it."""
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
    os.environ[_LAUNCHER_PID_ENV] = str(os.getppid())  # its parent is this server, which dies with the launcher
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
    """What the interpreter does at exit before it is gone: join non-daemon threads, run atexit, flush."""
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
    """``python -m lab_helpers.launch.warm_start CTL_FD PRELOAD,... PADDING``: started by ``_Server`` only."""
    ctl = socket.socket(fileno=int(argv[0]))
    from lab_helpers.training.orphan_guard import die_with_parent

    die_with_parent()  # SIGTERM when the launcher dies; exits at once if it is already gone
    _set_command_line(f"{sys.executable} -m {_SERVER_MODULE} (warm Python for the lab's runs; importing)")
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
    _set_command_line(f"{sys.executable} -m {_SERVER_MODULE} (warm Python for the lab's runs)")
    _serve(ctl, _imported_files())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
