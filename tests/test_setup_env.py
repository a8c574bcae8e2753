"""scripts/setup-env.sh decides, before anything is installed, which Python makes the venv, which extras the
profile needs, and how to install on an offline node over the node's torch.

These run the real script with stand-ins on PATH for what this CPU machine cannot be: an Ubuntu 22.04 box whose
python3 is 3.10, a Python without venv, a node with nvidia-smi, a node whose torch lives outside the venv. The
stand-in pythons only answer the few questions the script asks and record the pip command lines; what pip then
does with those lines is proven for real by benchmarks/wheelhouse_check.py (it downloads, so it is no test here).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "setup-env.sh"
TOOLS = ("bash", "cat", "sha256sum", "cut", "grep", "rm", "touch", "mkdir", "dirname", "cp", "tr", "basename", "head")

# A stand-in CPython: its version comes from $FAKE_VERSION_<name> (dots as _) or $FAKE_VERSION; a venv it makes
# holds a copy of it that keeps the version; `-m pip` is recorded, never run.
FAKE_PYTHON = r"""#!/usr/bin/env bash
me=$(basename "$0"); var="FAKE_VERSION_$(echo "$me" | tr . _)"
here=$(cd "$(dirname "$0")" && pwd)
version=${!var:-${FAKE_VERSION:-3.12}}
[[ -f $here/../fake-version ]] && version=$(cat "$here/../fake-version")
echo "$me $*" >>"$CALL_LOG"
if [[ $1 == -c ]]; then
    case "$2" in
        *version_info*) echo "$version" ;;
        *purelib*) echo "$here/../lib/site-packages" ;;
        "import torch") [[ -n ${FAKE_TORCH_SITE:-} ]] ;;
        *sys.path*) echo "$FAKE_TORCH_SITE" ;;
        *) exit 3 ;;
    esac
elif [[ $* == "-m pip config list" ]]; then
    printf '%b' "${FAKE_PIP_CONFIG:-}"
elif [[ $1 == -m && $2 == venv ]]; then
    [[ -n ${FAKE_NO_VENV:-} ]] && { echo "ensurepip is not available" >&2; mkdir -p "${!#}"; exit 1; }
    mkdir -p "${!#}/bin" && cp "$0" "${!#}/bin/python" && echo "$version" >"${!#}/fake-version"
fi
"""


@pytest.fixture()
def node(tmp_path: Path):
    """A PATH of stand-ins (and the few real tools the script uses), a venv path and a call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))

    def add(name: str, text: str = FAKE_PYTHON) -> None:
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)

    log = tmp_path / "calls.log"
    log.touch()
    env = {"PATH": str(bin_dir), "CALL_LOG": str(log), "LAB_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path)}

    def run(**extra: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [shutil.which("bash"), "-c", f"source {SCRIPT} && echo PATH=$PATH"],
            env={**env, **extra}, capture_output=True, text=True, timeout=60,
        )
        result.calls = log.read_text().splitlines()
        return result

    run.add = add
    run.tmp = tmp_path
    return run


def pip_installs(calls: list[str]) -> list[str]:
    """pip's installs of the lab (not of pip itself, nor of uv)."""
    return [c for c in calls if " -m pip install " in f" {c} " and "--upgrade pip" not in c and not c.endswith(" uv")]


# A stand-in uv: records its command line; $FAKE_UV_FAILS makes it fail like an unreachable index.
FAKE_UV = """#!/usr/bin/env bash
echo "uv $*" >>"$CALL_LOG"
[[ -z ${FAKE_UV_FAILS:-} ]] || { echo "error: Failed to fetch" >&2; exit 2; }
"""


def test_ubuntu_2204_python310_says_what_to_install(node) -> None:
    node.add("python3")
    result = node(FAKE_VERSION="3.10")
    assert result.returncode == 1
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "python3 here is 3.10" in message
    assert "python3.11 python3.11-venv" in message and "deadsnakes" in message and "environment.yml" in message
    assert not (node.tmp / "venv").exists()


def test_a_newer_python_beside_python310_is_found(node) -> None:
    node.add("python3")
    node.add("python3.11")
    result = node(FAKE_VERSION_python3="3.10", FAKE_VERSION_python3_11="3.11")
    assert result.returncode == 0, result.stderr
    assert "python3.11 -m venv " + str(node.tmp / "venv") in result.calls


def test_missing_venv_module_names_the_package(node) -> None:
    node.add("python3")
    result = node(FAKE_VERSION="3.12", FAKE_NO_VENV="1")
    assert result.returncode == 1
    assert "sudo apt-get install python3.12-venv" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (node.tmp / "venv").exists()  # no half-made venv left to be taken for a good one next time


def test_gpu_node_gets_the_gpu_extras_and_a_cpu_machine_dev(node) -> None:
    node.add("python3")
    cpu = node()
    assert cpu.returncode == 0, cpu.stderr
    assert pip_installs(cpu.calls)[-1].endswith(f"-c {REPO}/scripts/constraints.txt -e {REPO}[dev]")

    # nvidia-smi -L lists a GPU (a recorded line from an H100 node): datasets, deepspeed and bitsandbytes.
    node.add("nvidia-smi", "#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1b)'\n")
    gpu = node()
    assert pip_installs(gpu.calls)[-1].endswith(f"-e {REPO}[gpu,notebooks]")  # JupyterLab too: start-notebooks.sh
    assert node(LAB_PROFILE="ci").returncode == 0
    assert pip_installs(node.tmp.joinpath("calls.log").read_text().splitlines())[-1].endswith("[dev]")


def test_second_run_installs_nothing(node) -> None:
    node.add("python3")
    node()
    again = node()
    assert "is up to date" in again.stdout
    assert len(pip_installs(again.calls)) == 1


def wheelhouse(tmp: Path) -> Path:
    folder = tmp / "wheels"
    folder.mkdir()
    (folder / "lab-extras.txt").write_text("data,multi\n")
    (folder / "manifest.json").write_text('{\n "python": "3.12",\n "glibc": "2.28"\n}\n')
    for name in ("hjson-3.1.0-py3-none-any.whl", "litgpt-0.5.13-py3-none-any.whl"):
        (folder / name).write_bytes(b"")
    return folder


def test_offline_node_installs_from_the_wheelhouse_over_the_nodes_torch(node) -> None:
    node.add("python3")
    torch_site = node.tmp / "node-site-packages"
    folder = wheelhouse(node.tmp)
    result = node(LAB_WHEELHOUSE=str(folder), FAKE_TORCH_SITE=str(torch_site))
    assert result.returncode == 0, result.stderr
    # The resolved set as it is (no resolving, so the node's torch is never re-checked), then the lab; no pip
    # upgrade: there is no index.
    wheels, lab = [c for c in result.calls if " -m pip " in c]
    assert wheels == (f"python -m pip install --quiet --no-index --no-deps {folder}/hjson-3.1.0-py3-none-any.whl "
                      f"{folder}/litgpt-0.5.13-py3-none-any.whl")
    assert lab == f"python -m pip install --quiet --no-index --find-links {folder} --no-deps -e {REPO}"
    pth = node.tmp / "venv" / "lib" / "site-packages" / "lab-system-torch.pth"
    assert pth.read_text().strip() == str(torch_site)


def test_a_wheelhouse_for_another_python_is_refused(node) -> None:
    node.add("python3")
    result = node(LAB_WHEELHOUSE=str(wheelhouse(node.tmp)), FAKE_TORCH_SITE="/x", FAKE_VERSION="3.11")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("is Python 3.11; build it with --python 3.11")
    assert not [c for c in result.calls if " -m pip " in c]


def test_system_torch_without_torch_says_which_python(node) -> None:
    node.add("python3")
    result = node(LAB_WHEELHOUSE=str(wheelhouse(node.tmp)))
    assert result.returncode == 1
    assert "cannot import torch; set LAB_BASE_PYTHON" in result.stderr


def test_system_torch_online_drops_only_the_torch_pin(node) -> None:
    node.add("python3")
    result = node(LAB_SYSTEM_TORCH="1", FAKE_TORCH_SITE=str(node.tmp / "site"))
    assert result.returncode == 0, result.stderr
    constraints = node.tmp / "venv" / "lab-constraints.txt"
    assert pip_installs(result.calls)[-1].endswith(f"-c {constraints} -e {REPO}[dev]")
    pins = [line for line in constraints.read_text().splitlines() if "==" in line and not line.startswith("#")]
    assert pins and not any(line.startswith("torch==") for line in pins)
    assert "litgpt==0.5.13" in pins


def test_a_failed_install_is_not_stamped_done(node) -> None:
    """Sourced as `source setup-env.sh && ...`, bash turns errexit off inside: a failed pip must still stop."""
    node.add("python3")
    node.add("python3", FAKE_PYTHON.replace('echo "$me $*" >>"$CALL_LOG"', 'echo "$me $*" >>"$CALL_LOG"; [[ $* == *"-e "* ]] && exit 1'))
    result = node()
    assert result.returncode == 1 and "PATH=" not in result.stdout
    assert not list((node.tmp / "venv").glob(".lab-installed-*"))


def test_not_a_wheelhouse_is_one_line(node) -> None:
    node.add("python3")
    result = node(LAB_WHEELHOUSE=str(node.tmp))
    assert result.returncode == 1
    assert "is no finished wheelhouse" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_run_lab_leaves_extras_to_setup_env() -> None:
    """run-lab.sh used to force EXTRAS=dev, so a GPU node got no datasets, deepspeed or bitsandbytes."""
    text = (REPO / "scripts" / "run-lab.sh").read_text()
    assert "EXTRAS=" not in text.replace("EXTRAS, ", "")
    assert "source scripts/setup-env.sh" in text


def test_uv_installs_the_same_pins_from_where_pip_would(node) -> None:
    """uv reads neither pip.conf nor PIP_*: the index, extra indexes, find-links and global constraints that pip
    would use go with it (a file:// index that is not there is left out, as pip only warns about it)."""
    node.add("python3")
    node.add("uv", FAKE_UV)
    config = (
        "global.constraint='/etc/xdg/pip/constraints.txt'\n"
        f"global.extra-index-url='file:///nonexistent/simple file://{node.tmp}'\n"
        f"global.find-links='{node.tmp}'\n"
        ":env:.index-url='https://mirror.example/simple'\n"
        ":env:.default-timeout='180'\n"
    )
    result = node(FAKE_PIP_CONFIG=config)
    assert result.returncode == 0, result.stderr
    (uv,) = [c for c in result.calls if c.startswith("uv ")]
    assert uv == (
        f"uv pip install --quiet --python {node.tmp}/venv/bin/python --index-strategy unsafe-best-match "
        "-c /etc/xdg/pip/constraints.txt "
        f"--extra-index-url file://{node.tmp} --find-links {node.tmp} --index-url https://mirror.example/simple "
        f"-c {REPO}/scripts/constraints.txt -e {REPO}[dev]"
    )
    assert not pip_installs(result.calls)


def test_a_failing_uv_falls_back_to_pip_and_pip_alone_when_asked(node) -> None:
    node.add("python3")
    node.add("uv", FAKE_UV)
    failed = node(FAKE_UV_FAILS="1")
    assert failed.returncode == 0, failed.stderr
    assert "uv could not install the lab; trying pip" in failed.stderr
    assert pip_installs(failed.calls)[-1].endswith(f"--quiet -c {REPO}/scripts/constraints.txt -e {REPO}[dev]")

    for stamp in (node.tmp / "venv").glob(".lab-installed-*"):
        stamp.unlink()
    asked = node(LAB_INSTALLER="pip")
    assert not [c for c in asked.calls[len(failed.calls):] if c.startswith("uv ")]
    assert pip_installs(asked.calls[len(failed.calls):])


def test_uv_is_not_used_over_the_nodes_torch(node) -> None:
    """uv counts only the venv's own packages as installed: over a node's torch it would install a second one."""
    node.add("python3")
    node.add("uv", FAKE_UV)
    result = node(LAB_SYSTEM_TORCH="1", FAKE_TORCH_SITE=str(node.tmp / "site"))
    assert result.returncode == 0, result.stderr
    assert not [c for c in result.calls if c.startswith("uv ")]
    assert pip_installs(result.calls)


def test_uv_compiles_bytecode_only_where_python_will_not_write_it(node) -> None:
    """With PYTHONDONTWRITEBYTECODE set, nothing would ever write the .pyc: every import would compile torch again."""
    node.add("python3")
    node.add("uv", FAKE_UV)
    result = node(PYTHONDONTWRITEBYTECODE="1")
    (uv,) = [c for c in result.calls if c.startswith("uv ")]
    assert uv.endswith(f"--compile-bytecode -c {REPO}/scripts/constraints.txt -e {REPO}[dev]")
    for stamp in (node.tmp / "venv").glob(".lab-installed-*"):
        stamp.unlink()
    assert "--compile-bytecode" not in [c for c in node().calls if c.startswith("uv ")][-1]
