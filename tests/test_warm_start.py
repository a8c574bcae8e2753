"""A run forked by a warm server must be the process a cold ``python -m MODULE`` start would have been.

These servers preload only ``json`` (the lab's preloads torch, Lightning and litgpt: seconds per server), except
the CUDA test, which needs torch to see a CUDA call. The training runs of the slow tests and the notebooks go
through the real server (``warm_start.PRELOAD``) from each launcher's second run on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from lab_helpers.launch import warm_start
from lab_helpers.launch.runner import run_command
from lab_helpers.launch.warm_start import WarmProcess, WarmStarter

REPO = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    import __main__
    what = os.environ.get("LAB_PROBE", "")
    if what == "orphan":
        from lab_helpers.training.orphan_guard import start_orphan_guard
        start_orphan_guard(poll_s=0.2)
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "spec": __main__.__spec__.name,
        "name": __name__, "stdin": sys.stdin.read(), "session": os.getsid(0), "group": os.getpgrp(),
        "pid": os.getpid(), "parent": os.getppid(), "lab": os.environ.get("LAB_PROBE"),
        "other": os.environ.get("OTHER"),
    }), flush=True)
    print("on stderr", file=sys.stderr, flush=True)
    if what == "raise":
        raise RuntimeError("boom")
    if what == "sigkill":
        os.kill(os.getpid(), 9)
    if what in ("sleep", "orphan"):
        print("sleeping", flush=True)
        time.sleep(120)
    sys.exit(int(what) if what.isdigit() else 0)
    """
)


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if k != warm_start.WARM_START_ENV}  # CI may turn it off
    return {**inherited, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **extra}


def _start(starter: WarmStarter, cwd: Path, *args: str, **env: str):
    return starter.popen([sys.executable, "-m", "probe", *args], env=_env(**env), cwd=str(cwd))


def _finish(proc) -> tuple[dict, list[str], int]:
    out = proc.stdout.read().decode().splitlines()
    return json.loads(out[0]), out[1:], proc.wait(timeout=30)


def test_a_forked_run_is_the_process_a_cold_start_would_be(probe_dir: Path):
    starter = WarmStarter(preload=("json",))
    try:
        cold = _start(starter, probe_dir, "a b", "--flag", LAB_PROBE="1")
        assert isinstance(cold, subprocess.Popen) and "first run" in starter.last_cold_reason
        cold_seen, cold_rest, cold_code = _finish(cold)
        warm = _start(starter, probe_dir, "a b", "--flag", LAB_PROBE="2")  # only a LAB_ setting differs
        assert isinstance(warm, WarmProcess) and starter.last_cold_reason is None
        warm_seen, warm_rest, warm_code = _finish(warm)
    finally:
        starter.close()
    for seen in (cold_seen, warm_seen):
        assert seen["argv"] == [str(probe_dir / "probe.py"), "a b", "--flag"]
        assert seen["cwd"] == seen["path0"] == str(probe_dir)
        assert (seen["spec"], seen["name"], seen["stdin"]) == ("probe", "__main__", "")
        assert seen["session"] == seen["group"] == seen["pid"]  # a session of its own: the runner ends its group
    assert (cold_seen["lab"], warm_seen["lab"]) == ("1", "2")  # each run has its own environment
    assert cold_seen["parent"] == os.getpid() and warm_seen["parent"] != os.getpid()  # the warm server's child
    assert cold_rest == warm_rest == ["on stderr"]  # stderr on the same pipe as stdout
    assert (cold_code, warm_code) == (1, 2)


@pytest.mark.parametrize(("what", "code"), [("0", 0), ("3", 3), ("raise", 1), ("sigkill", -signal.SIGKILL)])
def test_a_forked_run_ends_with_the_exit_status_of_a_cold_one(probe_dir: Path, what: str, code: int):
    starter = WarmStarter(preload=("json",))
    try:
        outcomes = []
        for _ in range(2):  # cold, then warm
            proc = _start(starter, probe_dir, LAB_PROBE=what)
            _, rest, returncode = _finish(proc)
            outcomes.append((type(proc).__name__, returncode, rest[-1] if rest else ""))
    finally:
        starter.close()
    assert outcomes[0][:2] == ("Popen", code) and outcomes[1][:2] == ("WarmProcess", code)
    assert outcomes[0][2] == outcomes[1][2]  # the same last line: "RuntimeError: boom" for an exception


def test_a_forked_run_shows_its_own_command_line(probe_dir: Path):
    starter = WarmStarter(preload=("json",))
    try:
        _finish(_start(starter, probe_dir, LAB_PROBE="0"))
        proc = _start(starter, probe_dir, "--x", "1", LAB_PROBE="sleep")
        assert proc.stdout.readline() and proc.stdout.readline().strip() == b"on stderr"
        assert psutil.Process(proc.pid).cmdline() == [sys.executable, "-m", "probe", "--x", "1"]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        starter.close()


def test_only_the_labs_own_settings_may_differ_between_runs_of_one_server(probe_dir: Path):
    starter = WarmStarter(preload=("json",))
    try:
        parents = []
        for env in ({"LAB_PROBE": "0"}, {"LAB_PROBE": "0"}, {"LAB_PROBE": "0", "OTHER": "x"}, {"OTHER": "x"}):
            proc = _start(starter, probe_dir, **env)
            seen, _, _ = _finish(proc)
            parents.append(seen["parent"])
    finally:
        starter.close()
    me = os.getpid()
    # the first run in an environment is cold; OTHER (any variable an import may read) gets a server of its own
    assert parents[0] == me and parents[1] != me and parents[2] == me and parents[3] not in (me, parents[1])


def test_a_server_whose_imported_files_changed_is_replaced(probe_dir: Path):
    """An upgraded or edited package (a student hacking litgpt's scripts) must not run from the server's stale copy."""
    dependency = probe_dir / "probe_dep.py"
    dependency.write_text("VERSION = 1\n")
    starter = WarmStarter(preload=("json", "probe_dep"))
    try:
        kinds = []
        for step in range(4):
            if step == 2:
                dependency.write_text("VERSION = 2\n")
                os.utime(dependency, ns=(time.time_ns(), time.time_ns() + 10**9))
            proc = _start(starter, probe_dir, LAB_PROBE="0")
            _finish(proc)
            kinds.append((type(proc).__name__, starter.last_cold_reason))
    finally:
        starter.close()
    assert [kind for kind, _ in kinds] == ["Popen", "WarmProcess", "Popen", "WarmProcess"]
    assert "probe_dep.py changed since the warm server imported it" in kinds[2][1]


def test_a_change_to_any_module_the_server_imported_replaces_it(probe_dir: Path):
    """Not only the preloaded packages: a module they import from elsewhere (as the server imports the lab's own
    modules) is stale too once edited."""
    (probe_dir / "probe_outer.py").write_text("import probe_inner\n")
    inner = probe_dir / "probe_inner.py"
    inner.write_text("VERSION = 1\n")
    starter = WarmStarter(preload=("json", "probe_outer"))
    try:
        kinds = []
        for step in range(3):
            if step == 2:
                inner.write_text("VERSION = 2\n")
                os.utime(inner, ns=(time.time_ns(), time.time_ns() + 10**9))
            _finish(_start(starter, probe_dir, LAB_PROBE="0"))
            kinds.append(starter.last_cold_reason)
    finally:
        starter.close()
    assert kinds[1] is None  # the second run was forked
    assert kinds[2] and "probe_inner.py changed since the warm server imported it" in kinds[2]


def test_lab_warm_start_0_and_other_commands_start_cold(probe_dir: Path):
    starter = WarmStarter(preload=("json",))
    try:
        for _ in range(2):
            proc = _start(starter, probe_dir, LAB_WARM_START="0")
            assert isinstance(proc, subprocess.Popen) and starter.last_cold_reason == "LAB_WARM_START=0"
            _finish(proc)
        for _ in range(2):
            proc = starter.popen([sys.executable, "-c", "print(1)"], env=_env(), cwd=str(probe_dir))
            assert isinstance(proc, subprocess.Popen) and "python -m MODULE" in starter.last_cold_reason
            proc.communicate()
    finally:
        starter.close()


def test_a_server_whose_imports_touch_cuda_is_not_used(probe_dir: Path):
    """A fork after CUDA is initialised breaks CUDA in the child: such imports make every run start cold.

    On this CPU, ``torch.cuda.is_available()`` initialises nothing; the server refuses on the call itself."""
    (probe_dir / "touches_cuda.py").write_text("import torch\ntorch.cuda.is_available()\n")
    starter = WarmStarter(preload=("torch", "touches_cuda"))
    try:
        for _ in range(3):
            proc = _start(starter, probe_dir, LAB_PROBE="0")
            _finish(proc)
            assert isinstance(proc, subprocess.Popen)
        assert "the imports called torch.cuda.is_available" in starter.last_cold_reason
    finally:
        starter.close()


def test_a_killed_launcher_takes_its_warm_run_with_it(probe_dir: Path):
    """The launcher is SIGKILLed during a forked run: the server dies with it, and the run's guard ends the run."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from lab_helpers.launch.warm_start import WarmStarter
        starter = WarmStarter(preload=("json",))
        env = {{**os.environ, "PYTHONUNBUFFERED": "1", "LAB_LAUNCHER_PID": str(os.getpid()), "LAB_WARM_START": "1"}}
        argv = [sys.executable, "-m", "probe"]
        starter.popen(argv, env={{**env, "LAB_PROBE": "0"}}, cwd={str(probe_dir)!r}).wait()
        run = starter.popen(argv, env={{**env, "LAB_PROBE": "orphan"}}, cwd={str(probe_dir)!r})
        print(run.pid, type(run).__name__, flush=True)
        run.stdout.readline(), run.stdout.readline(), run.stdout.readline()
        print("running", flush=True)
        sys.stdin.read()
        """
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=_env(), cwd=REPO,
    )  # fmt: skip
    try:
        pid, kind = launcher.stdout.readline().split()
        assert kind == "WarmProcess" and launcher.stdout.readline().strip() == "running"
        run = psutil.Process(int(pid))
        launcher.kill()
        launcher.wait()
        gone, alive = psutil.wait_procs([run], timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        launcher.kill()


def test_an_interrupt_during_a_forked_run_ends_its_group_and_is_recorded(probe_dir: Path, monkeypatch, tmp_path):
    monkeypatch.setattr(warm_start, "_starter", WarmStarter(preload=("json",)))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv(warm_start.WARM_START_ENV, raising=False)
    command = [sys.executable, "-m", "probe"]
    first = run_command(command, run_dir=tmp_path / "first", env={"LAB_PROBE": "0"}, cwd=probe_dir, echo=False)
    assert first.returncode == 0 and "on stderr" in first.log_path.read_text()

    log = tmp_path / "second" / "output.log"

    def interrupt_when_sleeping() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and "sleeping" in log.read_text()):
            time.sleep(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # as Ctrl-C or "interrupt kernel"

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with it ignored
    try:
        threading.Thread(target=interrupt_when_sleeping, daemon=True).start()
        second = run_command(
            command, run_dir=tmp_path / "second", env={"LAB_PROBE": "sleep"}, cwd=probe_dir, echo=False
        )
    finally:
        signal.signal(signal.SIGINT, previous)
        warm_start._starter.close()
    assert warm_start._starter.last_cold_reason is None  # the second run was forked
    assert second.interrupted and second.returncode == -signal.SIGTERM
    assert not psutil.pid_exists(second.pid) or psutil.Process(second.pid).status() == psutil.STATUS_ZOMBIE


def test_an_interrupt_while_the_fork_is_answered_leaves_no_run_behind(probe_dir: Path, monkeypatch):
    """The request reached the server, the interrupt came before its answer: the run it forked is killed."""
    starter = WarmStarter(preload=("json",))
    try:
        for _ in range(2):  # cold, then warm: the server is up
            _finish(_start(starter, probe_dir, LAB_PROBE="0"))
        [server] = starter._servers.values()
        original = socket.socket.recv
        calls = []

        def interrupted_once(self, *args):
            if not calls:
                calls.append(1)
                time.sleep(0.5)  # the server has forked by now
                raise KeyboardInterrupt
            return original(self, *args)

        monkeypatch.setattr(socket.socket, "recv", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            _start(starter, probe_dir, LAB_PROBE="sleep")
        monkeypatch.undo()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _live_children(server.proc.pid):
            time.sleep(0.1)
        assert calls and not _live_children(server.proc.pid)
    finally:
        starter.close()


def _live_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE]


def test_warm_starts_are_for_the_ci_profile_until_a_gpu_measures_them(monkeypatch, results):
    """Warm_start stays on where it was checked (CPUs); on a GPU it is off until a GPU session shows that
    warm and cold runs measure the same. The student's own LAB_WARM_START wins either way."""
    monkeypatch.delenv(warm_start.WARM_START_ENV, raising=False)
    assert (warm_start.setting_for("ci"), warm_start.setting_for("gpu")) == ("1", "0")
    monkeypatch.setenv(warm_start.WARM_START_ENV, "1")
    assert warm_start.setting_for("gpu") == "1"
    monkeypatch.setenv(warm_start.WARM_START_ENV, "0")
    assert warm_start.setting_for("ci") == "0"
    # and a run is started with it: the training process's environment carries the setting for its profile
    from lab_helpers import lab

    seen = {}

    def no_run(command, **kwargs):
        seen.update(kwargs["env"])
        raise OSError("stopped by the test")

    monkeypatch.delenv(warm_start.WARM_START_ENV, raising=False)
    monkeypatch.setattr(lab, "run_command", no_run)
    with pytest.raises(lab.LabConfigError, match="stopped by the test"):
        lab.run_experiment("small-batch", profile="ci", echo=False, summary=False)
    assert seen[warm_start.WARM_START_ENV] == "1"
