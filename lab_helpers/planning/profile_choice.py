"""Which profile this node runs, and why a profile or its GPUs cannot run here: the first of ``decision``'s
questions, asked by ``default_profile`` (the notebooks' ``lab.default_profile``), the doctor and ``decision.decide``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

MODELS_ENV = "LAB_MODELS"
"""``LAB_MODELS=1b,7b``: the node prepared only these sizes (a GPU slice, a small disk); experiments of another size
are decided ``skipped``, as the notebooks' final checks expect."""


def models_here(profile: str) -> frozenset[str] | None:
    """None: unset, every size; an unknown size is one line."""
    from lab_helpers.config.config_error import LabConfigError
    from lab_helpers.config.experiments import check_profile

    text = os.environ.get(MODELS_ENV, "").strip()
    if not text:
        return None
    keys = frozenset(key.strip() for key in text.split(",") if key.strip())
    known = check_profile(profile)["models"]
    if unknown := sorted(keys - set(known)):
        raise LabConfigError(f"{MODELS_ENV}={text}: unknown model size {', '.join(unknown)}; choose from "
                             f"{', '.join(known)}")  # fmt: skip
    return keys


# -------------------------------------------------------------------------------------------- the profile

PROFILE_ENV = "LAB_PROFILE"


def default_profile(node: Mapping[str, Any] | None = None) -> str:
    """``$LAB_PROFILE``, else what this node runs; ``node``: ``describe_node()`` where the caller has it already."""
    if value := os.environ.get(PROFILE_ENV):
        return value
    from lab_helpers.hardware.node import describe_node

    return default_profile_here(describe_node() if node is None else node)


def default_profile_here(node: Mapping[str, Any]) -> str:
    """LabConfigError where NVML sees GPUs that torch cannot use (a driver older than torch's CUDA build, a CPU-only
    torch, a build without Volta kernels): a paid GPU node must not quietly train tiny CPU models."""
    from lab_helpers.config.config_error import LabConfigError

    if problem := gpu_problem(node):
        raise LabConfigError(f"{problem} (or set LAB_PROFILE=ci to use the CPU profile on purpose)")
    import torch

    return "gpu" if torch.cuda.is_available() else "ci"


def profile_problem(profile: str, node: Mapping[str, Any]) -> str | None:
    from lab_helpers.config.experiments import check_profile

    if not check_profile(profile).get("needs_cuda"):
        return None
    if problem := gpu_problem(node):  # also where CUDA works but the build lacks this GPU's kernels (a V100 on cu130)
        return problem
    import torch

    if not torch.cuda.is_available():
        return (
            f"profile {profile!r} needs a CUDA GPU and torch sees none here: use --profile ci (LAB_PROFILE=ci) on a CPU"
        )
    return None


def gpu_problem(node: Mapping[str, Any]) -> str | None:
    from lab_helpers.hardware.cuda_compat import torch_facts, torch_gpu_problem

    if not node.get("gpus"):
        return None
    return torch_gpu_problem({**node, **torch_facts()})


def torch_problem(node: Mapping[str, Any]) -> str | None:
    """Only where the doctor added torch's own facts to ``node``."""
    if "torch_cuda_available" not in node:
        return None
    from lab_helpers.hardware.cuda_compat import torch_gpu_problem

    return torch_gpu_problem(dict(node))
