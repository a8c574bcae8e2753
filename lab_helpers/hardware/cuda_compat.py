"""Can this torch build drive this node's GPUs, and if not, which build can: one sentence and one command.

PyPI's Linux torch wheel needs a CUDA 13 driver (>= 580); on an older one ``torch.cuda.is_available()`` is simply
False, and the lab would train tiny CPU models on a paid GPU node without a word. Pure functions of the node's facts,
so every case is tested on a CPU. Sources: PyTorch's RELEASE.md "PyTorch CUDA Support Matrix", NVIDIA's driver tables.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"
VOLTA_BUILD = "cu126"
"""The one CUDA build of torch >= 2.11 that still has Volta (sm_70) kernels."""
LAST_VOLTA_TORCH = "2.14"
"""PyTorch stops publishing cu126 wheels after 2.14 (announced for 2.15)."""
MIN_DRIVER_FOR_CUDA_MAJOR = {12: "525.60", 13: "580"}
"""The oldest driver that runs a CUDA major version's toolkits (minor-version compatibility)."""
DEEPSPEED_MINOR_MISMATCH_OK = {
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9"),
}
"""DeepSpeed's ``cuda_minor_mismatch_ok`` (op_builder/builder.py): any other nvcc/torch CUDA mismatch stops its build."""


def pinned_torch_version(constraints: Path | None = None, installed: str | None = None) -> str:
    if constraints is None:
        from lab_helpers.config.paths import lab_home

        constraints = lab_home() / "scripts" / "constraints.txt"
    try:
        for line in constraints.read_text().splitlines():
            if match := re.match(r"\s*torch\s*==\s*([\w.]+)", line):
                return match.group(1)
    except OSError:
        pass
    return (installed or "2.13.0").split("+")[0]


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text or "")[:3])


def _capabilities(gpus: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    found = []
    for gpu in gpus:
        cc = _version_tuple(gpu.get("compute_capability"))
        if len(cc) >= 2:
            found.append((cc[0], cc[1]))
    return found


def has_volta(gpus: Sequence[Mapping[str, Any]]) -> bool:
    return any(cc < (7, 5) for cc in _capabilities(gpus))


def cuda_build_for(driver_cuda: str | None, gpus: Sequence[Mapping[str, Any]]) -> str | None:
    """A Blackwell GPU (sm_100 and up) has kernels only in the CUDA 13 builds, so it needs a CUDA 13 driver."""
    driver = _version_tuple(driver_cuda)
    if not driver or driver[0] < 12:
        return None
    if has_volta(gpus):
        return VOLTA_BUILD
    if driver[0] >= 13:
        return "cu130"
    return None if any(cc >= (10, 0) for cc in _capabilities(gpus)) else "cu126"


def torch_install_command(build: str, torch_version: str) -> str:
    """cu130 is PyPI's default Linux wheel; the others need PyTorch's index."""
    if build == "cu130":
        return f"pip install --force-reinstall torch=={torch_version}"
    return f"pip install --force-reinstall torch=={torch_version} --index-url {TORCH_INDEX.format(tag=build)}"


def torch_gpu_problem(facts: Mapping[str, Any]) -> str | None:
    """``facts``: ``describe_node()`` plus ``torch_facts()``."""
    gpus = facts.get("gpus") or []
    if not gpus:
        return None
    torch_version = (facts.get("torch_version") or "").split("+")[0]
    pinned = pinned_torch_version(installed=torch_version or None)
    torch_cuda = facts.get("torch_cuda")
    driver, driver_cuda = facts.get("driver_version"), facts.get("cuda_driver_version")
    names = ", ".join(sorted({str(gpu.get("name")) for gpu in gpus}))
    build = cuda_build_for(driver_cuda, gpus)
    fix = (
        f"install a matching build: {torch_install_command(build, pinned)}"
        if build
        else f"update the NVIDIA driver to >= {MIN_DRIVER_FOR_CUDA_MAJOR[12]} (CUDA 12) or >= "
        f"{MIN_DRIVER_FOR_CUDA_MAJOR[13]} (CUDA 13), then {torch_install_command('cu130', pinned)}"
    )
    if torch_cuda is None:
        return f"this node has {len(gpus)} GPU(s) ({names}) but torch {torch_version or '?'} is a CPU-only build: {fix}"
    volta = volta_problem(facts)
    if volta:
        return volta
    if facts.get("torch_cuda_available") is False:
        wanted, have = _version_tuple(torch_cuda), _version_tuple(driver_cuda)
        if have and wanted and have[0] < wanted[0]:
            why = (
                f"torch {torch_version} is built for CUDA {torch_cuda}, but NVIDIA driver {driver} supports CUDA "
                f"up to {driver_cuda} (CUDA {wanted[0]} needs a driver >= {MIN_DRIVER_FOR_CUDA_MAJOR.get(wanted[0], '?')})"
            )
        else:
            why = (
                f"torch {torch_version} (CUDA {torch_cuda}) cannot use them (driver {driver or '?'}, "
                f"driver CUDA {driver_cuda or '?'}; check `nvidia-smi` and that the container was started with --gpus)"
            )
        return f"this node has {len(gpus)} GPU(s) ({names}) that torch cannot use: {why}; {fix}"
    return None


def volta_problem(facts: Mapping[str, Any]) -> str | None:
    """A Volta GPU with a torch build that has no sm_70 kernels ("no kernel image is available"), or None."""
    gpus = facts.get("gpus") or []
    if not has_volta(gpus) or facts.get("torch_cuda") is None:
        return None
    arch_list = facts.get("torch_arch_list")
    if arch_list:
        missing = [cc for cc in _capabilities(gpus) if cc < (7, 5) and f"sm_{cc[0]}0" not in arch_list]
        if not missing:
            return None
    else:  # torch could not see the GPUs: judge by the build (torch >= 2.11 has sm_70 in cu126 only)
        torch_version = _version_tuple(facts.get("torch_version"))
        if (torch_version and torch_version < (2, 11)) or _version_tuple(facts.get("torch_cuda"))[:2] == (12, 6):
            return None
    pinned = pinned_torch_version(installed=(facts.get("torch_version") or "").split("+")[0] or None)
    names = ", ".join(sorted({str(g.get("name")) for g in gpus if has_volta([g])}))
    return (
        f"{names} (Volta, sm_70): torch {facts.get('torch_version')} (CUDA {facts.get('torch_cuda')}) has no kernels "
        f"for it and fails with 'no kernel image is available'; install the CUDA 12.6 build, the last with Volta "
        f"(published up to torch {LAST_VOLTA_TORCH}): {torch_install_command(VOLTA_BUILD, pinned)}. Volta has no bf16: "
        f"the bf16 experiments are skipped; use precision=16-mixed"
    )


def nvcc_version(nvcc: str | None = None) -> tuple[str | None, str | None]:
    """(path of nvcc, its CUDA release "12.8") as DeepSpeed finds it (CUDA_HOME, then PATH), or Nones."""
    import os

    candidates = []
    if nvcc:
        candidates.append(nvcc)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    if found := shutil.which("nvcc"):
        candidates.append(found)
    for path in candidates:
        if not Path(path).is_file():
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if match := re.search(r"release (\d+\.\d+)", out):
            return path, match.group(1)
    return None, None


def deepspeed_build_problem(torch_cuda: str | None, nvcc_release: str | None) -> str | None:
    """On a CPU-only torch DeepSpeed builds its CPU Adam with the C++ compiler alone: no nvcc is needed."""
    if torch_cuda is None:
        return None
    wanted = ".".join(torch_cuda.split(".")[:2])
    fix = (
        f"install the CUDA {wanted} toolkit (nvcc) -- e.g. NVIDIA's apt repository: "
        f"apt-get install cuda-toolkit-{wanted.replace('.', '-')}, or conda install -c nvidia cuda-nvcc={wanted} "
        f"cuda-cudart-dev={wanted} -- and set CUDA_HOME; or use the lab's Docker image (provisioning/start-lab.sh), "
        f"which has it"
    )
    if nvcc_release is None:
        return f"no nvcc: DeepSpeed compiles its CPU Adam on first use with nvcc of CUDA {wanted} (torch's); {fix}"
    if nvcc_release == wanted:
        return None
    major = int(wanted.split(".")[0])
    ok = DEEPSPEED_MINOR_MISMATCH_OK.get(major, ())
    if nvcc_release in ok and wanted in ok:
        return None
    return f"nvcc is CUDA {nvcc_release} but torch is built with CUDA {torch_cuda}: DeepSpeed refuses to build; {fix}"


def torch_facts() -> dict[str, Any]:
    """What only an imported torch knows (1-2 s to import)."""
    try:
        import torch
    except ImportError:
        return {"torch_version": None, "torch_cuda_available": False, "torch_arch_list": []}
    available = bool(torch.cuda.is_available())
    try:
        arch_list = list(torch.cuda.get_arch_list()) if available else []
    except Exception:
        arch_list = []
    return {"torch_version": torch.__version__, "torch_cuda_available": available, "torch_arch_list": arch_list}
