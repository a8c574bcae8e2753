"""Recorded nodes for the node-plan tests: what ``lab_helpers.hardware.node.describe_node()`` returns on each kind of node.

A CPU cannot produce an NVML reading, so these are fixtures: GPU names, memory totals and compute capabilities
as NVML reports them for these models (nvidia-smi's totals: H100 80GB HBM3 81559 MiB, H200 143771 MiB, A10G
23028 MiB, A100-SXM4-40GB 40960 MiB, A100-SXM4-80GB 81920 MiB, L40S 46068 MiB, V100-SXM2-32GB 32510 MiB; capabilities from NVIDIA's CUDA GPU table), host RAM and
packages as on typical cloud nodes of each kind. Every key of ``lab_helpers.hardware.node.NodeFacts`` is there
(tests/test_node.py checks it), the ones the lab does not decide with as a plain value.
"""

from __future__ import annotations

import copy
from typing import Any

from lab_helpers.config.record_schema import GIB

MIB = 2**20

PACKAGES = {"torch": "2.8.0", "lightning": "2.6.6", "litgpt": "0.5.13", "deepspeed": "0.19.8", "bitsandbytes": "0.48.1"}


def _gpu(index: int, name: str, memory_mib: int, capability: str, nvlink: int) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "memory_total_gib": round(memory_mib * MIB / GIB, 2),
        "compute_capability": capability,
        "bf16_native": tuple(int(x) for x in capability.split(".")) >= (8, 0),
        "nvlink_links_active": nvlink,
    }


def _node(gpus: list[dict[str, Any]], ram_gib: float, packages: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "hostname": "fixture",
        "python": "3.12.3",
        "packages": dict(PACKAGES if packages is None else packages),
        "torch_cuda": "12.8" if gpus else None,
        "driver_version": "570.133.20" if gpus else None,
        "cuda_driver_version": "12.8" if gpus else None,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "interconnect": None if not gpus else ("NVLink" if any(g["nvlink_links_active"] for g in gpus) else "PCIe"),
        "topology": None,
        "nvml_error": None if gpus else "NVML unavailable: NVML Shared Library Not Found",
        "host": {"ram_total_gib": ram_gib, "ram_available_gib": ram_gib * 0.9, "cpu_count": 16},
        "disk_free_gib": 500.0,
        "lab_home": "/home/student/lab",
    }


NODES: dict[str, dict[str, Any]] = {
    "H100-80GB": _node([_gpu(0, "NVIDIA H100 80GB HBM3", 81559, "9.0", 0)], ram_gib=128.0),
    "H200-141GB": _node([_gpu(0, "NVIDIA H200", 143771, "9.0", 0)], ram_gib=251.0),
    "A100-40GB": _node([_gpu(0, "NVIDIA A100-SXM4-40GB", 40960, "8.0", 0)], ram_gib=85.0),
    "A10G-24GB": _node([_gpu(0, "NVIDIA A10G", 23028, "8.6", 0)], ram_gib=62.0),
    "L40S-48GB": _node([_gpu(0, "NVIDIA L40S", 46068, "8.9", 0)], ram_gib=124.0),
    "V100-32GB": _node([_gpu(0, "Tesla V100-SXM2-32GB", 32510, "7.0", 0)], ram_gib=60.0),
    "4xH100": _node([_gpu(i, "NVIDIA H100 80GB HBM3", 81559, "9.0", 18) for i in range(4)], ram_gib=1007.0),
    "4xA100-80GB": _node([_gpu(i, "NVIDIA A100-SXM4-80GB", 81920, "8.0", 12) for i in range(4)], ram_gib=503.0),
    "none": _node([], ram_gib=24.0, packages={**PACKAGES, "bitsandbytes": None}),
}


def node(name: str) -> dict[str, Any]:
    """A fresh copy of a recorded node (tests may change it)."""
    return copy.deepcopy(NODES[name])
