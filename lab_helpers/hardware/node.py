"""What this machine is: GPUs, driver, interconnect, host memory, disk and the versions that matter. Cheap (well
under 2 s) and JSON-able: NVML needs no CUDA context or torch import, and versions come from package metadata. A
missing reading is None, never 0.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from lab_helpers.config.paths import lab_home
from lab_helpers.config.record_schema import GIB

PACKAGES = ("torch", "lightning", "litgpt", "deepspeed", "bitsandbytes")

BF16_MIN_CAPABILITY = (8, 0)
"""bf16 tensor cores arrived with Ampere (sm_80); a V100 (sm_70) only emulates bf16, slowly."""

TOPOLOGY_TIMEOUT_S = 5.0


# ------------------------------------------------------------------------------------------------- types


class GpuFacts(TypedDict):
    index: int
    name: str
    memory_total_gib: float | None  # the one GPU size the lab decides and predicts with (gpu_memory_gib)
    compute_capability: str | None  # "8.0"
    bf16_native: bool | None
    nvlink_links_active: int | None


class HostFacts(TypedDict):
    ram_total_gib: float | None
    ram_available_gib: float | None
    cpu_count: int | None


class NodeFacts(TypedDict):
    """A plain dict, so tests take recorded nodes (tests/node_fixtures.py) and records store it as JSON."""

    hostname: str
    python: str
    packages: dict[str, str | None]
    torch_cuda: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[GpuFacts]
    gpu_count: int
    interconnect: str | None
    topology: str | None
    nvml_error: str | None
    host: HostFacts
    disk_free_gib: float | None
    lab_home: str


class CheckedNodeFacts(NodeFacts, total=False):
    """The node as the doctor checks it: what torch (``cuda_compat.torch_facts``) and the CUDA toolkit say here."""

    torch_version: str | None
    torch_cuda_available: bool
    torch_arch_list: list[str]
    nvcc: str | None
    nvcc_release: str | None
    deepspeed_build_problem: str | None


# ------------------------------------------------------------------------------------------------ public


def describe_node() -> NodeFacts:
    """``torch_cuda``: the CUDA runtime torch was built with; ``cuda_driver_version``: the newest the driver supports."""
    hardware = copy.deepcopy(_hardware())  # NVML and nvidia-smi once per process; callers may change their copy
    home = lab_home()
    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "packages": package_versions(),
        **hardware,
        "host": _host_memory(),  # free memory and disk change between runs: read each time
        "disk_free_gib": _disk_free_gib(home),
        "lab_home": str(home),
    }


@functools.cache
def _hardware() -> dict[str, Any]:
    """Cached: they do not change while a process runs, and NVML's start and ``nvidia-smi topo`` cost time."""
    nvml = _read_nvml()
    gpus = nvml["gpus"]
    torch_cuda = _torch_cuda_version()
    if not gpus and nvml["error"] is not None and torch_cuda:
        gpus = _gpus_from_torch()  # a CUDA torch on a machine whose NVML library is missing or broken
    interconnect = None
    if gpus:
        links = [gpu.get("nvlink_links_active") or 0 for gpu in gpus]
        interconnect = "NVLink" if any(links) else "PCIe"
    return {
        "torch_cuda": torch_cuda,
        "driver_version": nvml["driver_version"],
        "cuda_driver_version": nvml["cuda_driver_version"],
        "gpus": gpus,
        "gpu_count": len(gpus),
        "interconnect": interconnect,
        "topology": _nvidia_smi_topology() if gpus else None,
        "nvml_error": nvml["error"],
    }


def environment_summary(node: dict[str, Any] | None = None) -> dict[str, Any]:
    """The part of :func:`describe_node` stored in every run record: enough to trace a number to its setup."""
    node = node if node is not None else describe_node()
    packages = node.get("packages") or {}
    return {
        "gpu_names": [gpu["name"] for gpu in node.get("gpus") or []],
        "driver_version": node.get("driver_version"),
        "cuda": node.get("torch_cuda"),
        "cuda_driver_version": node.get("cuda_driver_version"),
        **{name: packages.get(name) for name in PACKAGES},
        "python": node.get("python"),
        "hostname": node.get("hostname"),
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpu_memory_gib(node: Mapping[str, Any]) -> float | None:
    """The smallest GPU's: the one size the lab decides and predicts with."""
    sizes = [g.get("memory_total_gib") for g in node.get("gpus") or []]
    return min(sizes) if sizes and all(isinstance(s, (int, float)) for s in sizes) else None


def this_gpu_memory_gib() -> float | None:
    return gpu_memory_gib(describe_node())


def bitsandbytes_requirement() -> str:
    """pyproject's ``qlora`` extra: one source for every message."""
    import tomllib

    try:
        project = tomllib.loads((lab_home() / "pyproject.toml").read_text())["project"]
        for requirement in project["optional-dependencies"]["qlora"]:
            if requirement.replace(" ", "").lower().startswith("bitsandbytes"):
                return requirement.split(";")[0].strip()
    except (OSError, KeyError, ValueError):
        pass
    return "bitsandbytes"


def bitsandbytes_install_command() -> str:
    return f"pip install '{bitsandbytes_requirement()}'"


# ------------------------------------------------------------------------------------------------ NVML


def _text(value: Any) -> str:
    """pynvml returns bytes in old releases and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_nvml() -> dict[str, Any]:
    empty: dict[str, Any] = {"gpus": [], "driver_version": None, "cuda_driver_version": None, "error": None}
    try:
        import pynvml
    except ImportError:
        return {**empty, "error": "pynvml is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : no usable GPU driver
        return {**empty, "error": f"NVML unavailable: {exc}"}
    try:
        driver = _try(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cuda_int = _try(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}" if isinstance(cuda_int, int) else None
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = _try(lambda h=handle: pynvml.nvmlDeviceGetMemoryInfo(h))
            capability = _try(lambda h=handle: pynvml.nvmlDeviceGetCudaComputeCapability(h))
            gpus.append(
                _gpu_entry(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=getattr(memory, "total", None),
                    capability=tuple(capability) if capability else None,
                    nvlink_links_active=_nvlink_links_active(pynvml, handle),
                )
            )
        return {"gpus": gpus, "driver_version": driver, "cuda_driver_version": cuda_driver, "error": None}
    except Exception as exc:
        return {**empty, "error": f"NVML query failed: {exc}"}
    finally:
        _try(pynvml.nvmlShutdown)


def _nvlink_links_active(pynvml: Any, handle: Any) -> int | None:
    """Number of active NVLink links of one GPU; 0 on a PCIe-only GPU, None when NVML cannot say."""
    active = 0
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as exc:
            not_supported = getattr(pynvml, "NVMLError_NotSupported", ())
            invalid = getattr(pynvml, "NVMLError_InvalidArgument", ())
            if isinstance(exc, (not_supported, invalid)):
                break  # past the last link this GPU has, or no NVLink at all
            return None if link == 0 else active
        if state == getattr(pynvml, "NVML_FEATURE_ENABLED", 1):
            active += 1
    return active


def _gpu_entry(
    *,
    index: int,
    name: str,
    memory_total_bytes: int | None,
    capability: tuple[int, int] | None,
    nvlink_links_active: int | None,
) -> GpuFacts:
    return {
        "index": index,
        "name": name,
        "memory_total_gib": round(memory_total_bytes / GIB, 2) if memory_total_bytes else None,
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        "bf16_native": (tuple(capability) >= BF16_MIN_CAPABILITY) if capability else None,
        "nvlink_links_active": nvlink_links_active,
    }


def _gpus_from_torch() -> list[GpuFacts]:
    """Fallback when NVML is unusable but torch has CUDA (slow: imports torch; only reached on GPU nodes)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                _gpu_entry(
                    index=index,
                    name=props.name,
                    memory_total_bytes=props.total_memory,
                    capability=(props.major, props.minor),
                    nvlink_links_active=None,
                )
            )
        return gpus
    except Exception:
        return []


def _torch_cuda_version() -> str | None:
    """``torch.version.cuda`` without importing torch (1.5 s): read torch/version.py on its own."""
    torch_module = sys.modules.get("torch")
    if torch_module is not None:
        return getattr(getattr(torch_module, "version", None), "cuda", None)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    namespace: dict[str, Any] = {}
    try:
        exec(compile(version_file.read_text(), str(version_file), "exec"), namespace)  # noqa: S102 - torch's own file
    except Exception:
        return None
    return namespace.get("cuda")


def _nvidia_smi_topology() -> str | None:
    """``nvidia-smi topo -m``: which GPU pairs talk over NVLink (NV#) and which over PCIe (PIX/PHB/SYS)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "topo", "-m"], capture_output=True, text=True, timeout=TOPOLOGY_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# ------------------------------------------------------------------------------------------------ host


CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
"""A container's memory limit (cgroup v2): what the host can give this lab when it is lower than the RAM."""


def host_memory_bytes() -> tuple[int | None, int | None]:
    """A container's limit counted: the one reading of host RAM the doctor, the decision and the exit cause use."""
    try:
        import psutil

        memory = psutil.virtual_memory()
        total, available = memory.total, memory.available
    except Exception:
        return None, None
    try:
        text = CGROUP_MEMORY_MAX.read_text().strip()
    except OSError:
        text = ""
    if text.isdigit():
        total, available = min(total, int(text)), min(available, int(text))
    return total, available


def _host_memory() -> HostFacts:
    total, available = host_memory_bytes()
    return {
        "ram_total_gib": round(total / GIB, 1) if total else None,
        "ram_available_gib": round(available / GIB, 1) if available else None,
        "cpu_count": os.cpu_count(),
    }


def _disk_free_gib(path: Path) -> float | None:
    """Free space where checkpoints and results go (the nearest existing folder at or above the lab home)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return round(shutil.disk_usage(candidate).free / GIB, 1)
            except OSError:
                return None
    return None


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
