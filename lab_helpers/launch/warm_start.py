"""Start a launcher's later runs from a warm Python that has already imported torch, Lightning and litgpt.

Each run is a process of its own, and a cold one spends 6-9 s of a 2-core CPU on those imports: most of a ci run.
So from a launcher's second run on, one *warm server* per environment forks a copy of itself for each run. The fork
is the same process to the runner (own session, same pipe, env, argv); its parent, the server, dies with the
launcher (``PR_SET_PDEATHSIG``), so the orphan guard still works. Wherever the warm path is not certainly the same
the run starts cold: imports that touched CUDA (a fork cannot use it then) or started a thread, a server that died.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

WARM_START_ENV = "LAB_WARM_START"  # "0": every run is a cold start
PRELOAD = ("torch", "lightning", "litgpt.finetune.lora", "litgpt.finetune.full")  # what every run imports
LAB_PREFIX = "LAB_"  # the lab's own settings: may differ between runs that share a server
MAX_SERVERS = 2  # environments kept warm at once (the oldest is closed first)
READY_TIMEOUT_S = 600.0  # the server's imports on a cold page cache over a slow disk
LAUNCHER_PID_ENV = "LAB_LAUNCHER_PID"  # orphan_guard's; not imported here, the server imports as little as it can
_TITLE_ROOM = 4096  # bytes of command line a forked run can show (the server starts with that much argv)
SERVER_MODULE = "lab_helpers.launch.warm_server"


# ----------------------------------------------------------------------------------------- the launcher's side


def setting_for(profile: str) -> str:
    """Off on a GPU until a GPU session measures warm and cold runs alike (``benchmarks/warm_start.py --profile gpu``)."""
    return os.environ.get(WARM_START_ENV) or ("1" if profile == "ci" else "0")


class WarmProcess:
    """What the runner uses of ``subprocess.Popen``; the exit status comes from the server (the run's parent)."""

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
    def __init__(self, env: Mapping[str, str], cwd: str, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", SERVER_MODULE, str(theirs.fileno()), ",".join(preload), " " * _TITLE_ROOM]
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, LAUNCHER_PID_ENV: str(os.getpid())},
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # stderr stays the launcher's: a server that fails says why there
            start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only, as it does for runs
        )
        theirs.close()
        self.ctl = ours

    def wait_ready(self, timeout_s: float) -> str | None:
        """None when it can serve, else why it cannot."""
        ready, _, _ = select.select([self.ctl], [], [], timeout_s)
        data = self.ctl.recv(4096) if ready else b""
        answer = json.loads(data) if data else {"reason": "the warm server did not start"}
        return answer.get("reason")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> WarmProcess:
        """An interrupt in here leaves no run behind: once the request may have reached the server, the answer is
        awaited and the run it started is killed."""
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
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class WarmStarter:
    def __init__(self, preload: Sequence[str] = PRELOAD, *, max_servers: int = MAX_SERVERS) -> None:
        self.preload = tuple(preload)
        self.max_servers = max_servers
        self._servers: OrderedDict[tuple, _Server] = OrderedDict()
        self._cold_reason: str | None = None  # a server refused (its imports touched CUDA): cold from then on
        self._starts: Counter[tuple] = Counter()
        self._lock = threading.Lock()
        self.last_cold_reason: str | None = None  # why the last run started cold (None: it was forked)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None):
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
    """Only ``lab_helpers`` reads the ``LAB_*`` settings, and each run imports it afresh."""
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
    global _starter
    if _starter is None:
        _starter = WarmStarter()
        atexit.register(_starter.close)
    return _starter.popen(argv, env=env, cwd=cwd)
