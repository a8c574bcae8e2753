"""Which sections of the course this node can run, each with the reason in one line: what the doctor and
``00_check_node`` print and what ``run-all`` acts on (``decision.decide`` then decides each experiment).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.hardware.node import NodeFacts, bitsandbytes_install_command
from lab_helpers.planning.decision import FP16_ROUTE, OFFLOAD_EXPERIMENT, SIMULATED_WORLD
from lab_helpers.planning.node_limits import offload_fit
from lab_helpers.planning.profile_choice import torch_problem


def sections_runnable(node: NodeFacts) -> dict[str, tuple[bool, str]]:
    """At full size (``gpu``), in the decision's words. Every experiment also exists in the ``ci`` profile, and the
    reasons say so where that is the way out."""
    gpus = node.get("gpus") or []
    packages = node.get("packages") or {}
    n = len(gpus)
    cuda = n > 0
    result: dict[str, tuple[bool, str]] = {}

    problem = torch_problem(node)
    if cuda and problem:
        result["single"] = (False, problem)
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
                f"{names}: no native bf16 (needs compute capability >= 8.0); the bf16 experiments run in "
                f"{FP16_ROUTE} (fp16 with loss scaling) and bf16-true is skipped",
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
        result["multi"] = (
            False,
            f"{found}: DDP/FSDP need >= 2 GPUs to run for real; here 02 runs them as rank 0 of {SIMULATED_WORLD} "
            f"simulated alone on {'the GPU' if n else 'the CPU (the ci profile)'} (memory real, no communication)",
        )

    result[OFFLOAD_EXPERIMENT] = _offload_section(node)
    result["multi-node"] = (
        False,
        "informational: an extension for a cluster (torchrun / Lightning num_nodes across nodes); "
        "this check sees one node",
    )
    return result


def _offload_section(node: Mapping[str, Any]) -> tuple[bool, str]:
    from lab_helpers.config.experiments import resolve

    packages = node.get("packages") or {}
    fit = offload_fit(resolve(OFFLOAD_EXPERIMENT, "gpu", check_files=False), node)
    it = f"it {fit.words()}"
    if not node.get("gpus"):
        return False, f"no CUDA GPU: ci profile only; on a GPU node {it}"
    if fit.smaller is not None and not fit.fits:
        it += f"; run-all and 02 run the {fit.smaller[0].upper()} instead (~{fit.smaller[2]:.0f} GiB)"
    if not packages.get("deepspeed"):
        return False, f"deepspeed is not installed (pip install deepspeed); {it}"
    if node.get("deepspeed_build_problem"):
        return False, str(node["deepspeed_build_problem"])
    if not fit.fits:
        return False, f"not enough host RAM for the {fit.model}: {it}"
    return True, f"deepspeed {packages['deepspeed']}; {it}"
