"""What this machine is: GPUs, driver, interconnect, host memory, disk and the versions that matter.

Why a module of its own: the same facts answer three questions. The ``doctor`` command tells a student, before
a lease starts burning, which lab sections this node can run; every run record carries the environment so a
number can be traced to the hardware and software that produced it; and the MFU needs the GPU's exact name.

Everything here is cheap (well under 2 s) and JSON-able: NVML (``pynvml``) is the source of GPU facts because
it needs no CUDA context and no torch import; package versions come from ``importlib.metadata`` so nothing
heavy is imported. On a machine without a GPU the GPU list is empty and every GPU field is ``None``: a missing
reading is never reported as 0.
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
from typing import Any

from lab_helpers.paths import lab_home
from lab_helpers.record_schema import GIB

PACKAGES = ("torch", "lightning", "litgpt", "deepspeed", "bitsandbytes")
"""The packages whose versions go into every record (None when not installed)."""

BF16_MIN_CAPABILITY = (8, 0)
"""bf16 tensor cores arrived with Ampere (sm_80); a V100 (sm_70) only emulates bf16, slowly."""

DEEPSPEED_OFFLOAD_PARAMS = 13e9
"""The deepspeed-offload experiment fine-tunes the 13B model (LAB.md, multiple GPUs)."""

TOPOLOGY_TIMEOUT_S = 5.0


# ------------------------------------------------------------------------------------------------ public


def describe_node() -> dict[str, Any]:
    """All the facts about this node that the lab uses, as one JSON-able dict.

    Keys: ``hostname``, ``python``, ``packages`` (name -> version or None), ``torch_cuda`` (the CUDA runtime
    torch was built with), ``driver_version``, ``cuda_driver_version`` (the newest CUDA the driver supports),
    ``gpus`` (list of dicts: index, name, memory_total_gib, compute_capability "8.0", bf16_native,
    nvlink_links_active), ``gpu_count``, ``interconnect`` ("NVLink", "PCIe" or None without GPUs),
    ``topology`` (``nvidia-smi topo -m`` output or None), ``nvml_error`` (why NVML gave nothing, or None),
    ``host`` (ram_total_gib, ram_available_gib, cpu_count), ``disk_free_gib`` and ``lab_home``.
    """
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
    """The GPUs, driver and interconnect: they do not change while a process runs, and reading them costs NVML
    initialisation and an ``nvidia-smi topo`` call. ``_hardware.cache_clear()`` reads them again."""
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
    """Installed versions of the lab's heavy packages, read from metadata (nothing is imported)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpu_memory_gib(node: Mapping[str, Any]) -> float | None:
    """The smallest GPU's memory (GiB); None without GPUs or when NVML could not read it."""
    sizes = [g.get("memory_total_gib") for g in node.get("gpus") or []]
    return min(sizes) if sizes and all(isinstance(s, (int, float)) for s in sizes) else None


def this_gpu_memory_gib() -> float | None:
    """``gpu_memory_gib`` of this node (NVML, read once per process by ``describe_node``)."""
    return gpu_memory_gib(describe_node())


def offload_host_ram_needed_gib(params: float = DEEPSPEED_OFFLOAD_PARAMS, devices: int = 1) -> float:
    """Host RAM of the ZeRO-3 optimizer-offload run, in GiB: the planner's own number (fp32 master weights,
    Adam moments and fp32 gradient partitions, 16 bytes per parameter, plus each rank's process)."""
    from lab_helpers.planner.analytic import offload_host_bytes

    return offload_host_bytes(int(params), int(params), max(1, devices)) / GIB


def bitsandbytes_requirement() -> str:
    """The bitsandbytes requirement the lab installs (pyproject's ``qlora`` extra): one source for every message."""
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


def sections_runnable(node: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    """Which parts of the lab this node can run at full size (``gpu`` profile), and why not.

    Every experiment also exists in the ``ci`` profile, which runs on any CPU; the reasons say so where
    that is the way out.
    """
    gpus = node.get("gpus") or []
    packages = node.get("packages") or {}
    host = node.get("host") or {}
    n = len(gpus)
    cuda = n > 0
    result: dict[str, tuple[bool, str]] = {}

    torch_problem = _torch_problem(node)
    if cuda and torch_problem:
        result["single"] = (False, torch_problem)
    elif cuda:
        result["single"] = (True, f"{n} CUDA GPU(s): {gpus[0]['name']}")
    else:
        result["single"] = (False, "no CUDA GPU: ci profile only (LAB_PROFILE=ci runs small models on the CPU)")

    if not cuda:
        result["single bf16"] = (False, "no CUDA GPU: bf16 experiments run on the CPU in the ci profile only")
    else:
        old = [gpu for gpu in gpus if not gpu.get("bf16_native")]
        if old:
            names = ", ".join(sorted({f"{g['name']} (sm {g.get('compute_capability')})" for g in old}))
            result["single bf16"] = (
                False,
                f"{names}: no native bf16 (needs compute capability >= 8.0); the bf16 experiments are skipped",
            )
        else:
            result["single bf16"] = (True, "native bf16 tensor cores (compute capability >= 8.0)")

    if not cuda:
        result["qlora"] = (False, "no CUDA GPU: bitsandbytes 4-bit kernels need CUDA")
    elif not packages.get("bitsandbytes"):
        result["qlora"] = (False, f"bitsandbytes is not installed: {bitsandbytes_install_command()}")
    else:
        result["qlora"] = (True, f"bitsandbytes {packages['bitsandbytes']}")

    if n >= 2:
        result["multi"] = (True, f"{n} GPUs over {node.get('interconnect') or 'unknown interconnect'}")
    else:
        found = "one GPU" if n == 1 else "no GPU"
        result["multi"] = (False, f"{found}: DDP/FSDP need >= 2 GPUs; the ci profile runs them on 2 CPU processes")

    needed_gib = offload_host_ram_needed_gib(devices=max(1, n))
    ram_gib = host.get("ram_total_gib")
    ram_text = f"{ram_gib:.0f} GiB" if isinstance(ram_gib, (int, float)) else "unknown"
    need_text = (
        f"needs ~{needed_gib:.0f} GiB host RAM (the planner: 16 bytes x "
        f"{DEEPSPEED_OFFLOAD_PARAMS / 1e9:.0f}e9 params of fp32 master weights, Adam moments and gradients, "
        f"plus {max(1, n)} rank process(es)); this node has {ram_text}"
    )
    nvcc_problem = node.get("deepspeed_build_problem")
    if not cuda:
        result["deepspeed-offload"] = (False, f"no CUDA GPU: ci profile only; on a GPU node it {need_text}")
    elif not packages.get("deepspeed"):
        result["deepspeed-offload"] = (False, f"deepspeed is not installed (pip install deepspeed); it {need_text}")
    elif nvcc_problem:
        result["deepspeed-offload"] = (False, nvcc_problem)
    elif not isinstance(ram_gib, (int, float)) or ram_gib < needed_gib:
        result["deepspeed-offload"] = (False, f"not enough host RAM: it {need_text}")
    else:
        result["deepspeed-offload"] = (True, f"deepspeed {packages['deepspeed']}; it {need_text}")

    result["multi-node"] = (
        False,
        "informational: an extension for a cluster (torchrun / Lightning num_nodes across nodes); "
        "this check sees one node",
    )
    return result


def _torch_problem(node: dict[str, Any]) -> str | None:
    """Why torch cannot drive these GPUs (driver too old, CPU build, Volta without kernels), when the doctor
    added torch's own facts to ``node``; None otherwise."""
    if "torch_cuda_available" not in node:
        return None
    from lab_helpers.cuda_compat import torch_gpu_problem

    return torch_gpu_problem(node)


# ------------------------------------------------------------------------------------------------ NVML


def _text(value: Any) -> str:
    """pynvml returns bytes in old releases and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_nvml() -> dict[str, Any]:
    """GPU facts from NVML; an empty GPU list and the reason when NVML is absent (any CPU machine)."""
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
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "memory_total_gib": round(memory_total_bytes / GIB, 2) if memory_total_bytes else None,
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        "bf16_native": (tuple(capability) >= BF16_MIN_CAPABILITY) if capability else None,
        "nvlink_links_active": nvlink_links_active,
    }


def _gpus_from_torch() -> list[dict[str, Any]]:
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


def _host_memory() -> dict[str, Any]:
    try:
        import psutil

        memory = psutil.virtual_memory()
        total, available = memory.total, memory.available
    except Exception:
        total = available = None
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
