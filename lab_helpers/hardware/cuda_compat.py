"""Can this torch build drive this node's GPUs, and if not, which build can: one sentence and one command.

Why: PyPI's Linux torch wheel is built for the newest CUDA (13.x for torch 2.13), which needs an NVIDIA driver
of the same major version (>= 580). On an older driver ``torch.cuda.is_available()`` is simply False, and a
lab that picks its profile from that would train tiny CPU models on a paid GPU node without a word. Volta
GPUs (V100, sm_70) are common in teaching clusters, and since torch 2.11 only the CUDA 12.6 builds carry
their kernels: any other build fails at the first kernel with "no kernel image is available". DeepSpeed's
CPU Adam (the offload experiment) is compiled on first use by an ``nvcc`` whose CUDA must match torch's.

Every function here is pure: it takes the node's facts (``lab_helpers.hardware.node.describe_node()`` plus what only an
imported torch knows) and returns verdicts, so each hardware case is tested with recorded facts on a CPU.

Facts (from PyTorch's release matrix, RELEASE.md "PyTorch CUDA Support Matrix", and NVIDIA's driver tables):
  * CUDA minor-version compatibility: a driver runs any toolkit of its own CUDA major version, so a wheel
    built for CUDA 12.x needs a driver that supports some 12.y (>= 525.60), one for 13.x a 13.y driver (>= 580).
  * torch 2.12-2.14 ship CUDA 12.6 (legacy: Maxwell to Hopper, the only build with Volta's sm_70), 13.0 (the
    PyPI default: Turing to Blackwell) and 13.2 (experimental) builds; there is no 12.8 build after 2.11.
    PyTorch publishes cu126 wheels up to torch 2.14.
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
"""DeepSpeed's own table (op_builder/builder.py ``cuda_minor_mismatch_ok``): nvcc and torch's CUDA may differ in
the minor version only within these lists; any other difference stops the CPU Adam build."""


def pinned_torch_version(constraints: Path | None = None, installed: str | None = None) -> str:
    """The torch version the lab pins (scripts/constraints.txt), else the installed one, without a local tag."""
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
    """The torch CUDA build for this driver and these GPUs ("cu130" or "cu126"), None when none fits.

    A CUDA 12 driver gets the cu126 build (Maxwell to Hopper); a Blackwell GPU (sm_100 and up) has kernels only
    in the CUDA 13 builds, so it needs a CUDA 13 driver.
    """
    driver = _version_tuple(driver_cuda)
    if not driver or driver[0] < 12:
        return None
    if has_volta(gpus):
        return VOLTA_BUILD
    if driver[0] >= 13:
        return "cu130"
    return None if any(cc >= (10, 0) for cc in _capabilities(gpus)) else "cu126"


def torch_install_command(build: str, torch_version: str) -> str:
    """The exact pip line for a torch build; cu130 is PyPI's default Linux wheel, the others need PyTorch's index."""
    if build == "cu130":
        return f"pip install --force-reinstall torch=={torch_version}"
    return f"pip install --force-reinstall torch=={torch_version} --index-url {TORCH_INDEX.format(tag=build)}"


def torch_gpu_problem(facts: Mapping[str, Any]) -> str | None:
    """Why torch cannot use this node's GPUs, with the fix in one line; None when it can (or there are none).

    ``facts``: ``describe_node()`` plus ``torch_version``, ``torch_cuda_available`` (bool) and, where torch
    could see the GPUs, ``torch_arch_list`` (``torch.cuda.get_arch_list()``).
    """
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
    """Why DeepSpeed cannot compile its CPU Adam here (the offload experiment), with the fix; None when it can.

    On a CPU-only torch DeepSpeed builds the op for the CPU with the C++ compiler alone: no nvcc is needed.
    """
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
    """What only an imported torch knows (1-2 s): version, CUDA availability and the GPU architectures built in."""
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
