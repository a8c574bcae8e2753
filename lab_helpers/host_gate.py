"""Before an optimizer-offload run starts: will this node's RAM hold it, and if not, which model would.

Why: DeepSpeed's CPU offload keeps fp32 master weights, Adam moments and gradient partitions in host memory
(16 bytes per parameter: ~194 GiB for the 13B model). On a 128 GiB node the run would load for minutes and then
be killed by the kernel's OOM killer, or swap the node to a standstill. The planner already predicts the host
memory of the run (``host_gib``); this gate compares it with the node's RAM before anything starts, records the
run as ``skipped`` with that number, and names the largest model of the profile that the same planner formula
says fits, with the ``--set`` that runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from lab_helpers.exit_cause import host_memory_gib
from lab_helpers.record_schema import GIB


def host_ram_skip_reason(
    run: Any, predicted: Mapping[str, Any] | None, *, ram_total_gib: float | None = None
) -> str | None:
    """Why an offload run cannot start on this node's RAM (with the model that would fit), or None.

    ``run`` is the ResolvedRun, ``predicted`` the planner's plan as stored in the record. Only runs that put
    the optimizer in host memory are gated: for the others host memory is the process and a mapped checkpoint.
    """
    if not run.experiment.options.get("offload_optimizer") or not predicted or predicted.get("host_gib") is None:
        return None
    ram_gib = host_memory_gib() if ram_total_gib is None else ram_total_gib  # a container's limit counts
    needed_gib = float(predicted["host_gib"])
    if needed_gib <= ram_gib:
        return None
    reason = (
        f"needs ~{needed_gib:.0f} GiB of host RAM (the planner: fp32 master weights, Adam moments and gradients "
        f"in host memory, 16 bytes per parameter) and this node has {ram_gib:.0f} GiB"
    )
    smaller = largest_model_that_fits(run, ram_gib)
    if smaller is None:
        return f"{reason}; no model of profile {run.profile!r} fits"
    model_key, checkpoint_dir, gib = smaller
    return f"{reason}; the {model_key} model fits (~{gib:.0f} GiB): --set checkpoint_dir={checkpoint_dir}"


def largest_model_that_fits(run: Any, ram_gib: float) -> tuple[str, str, float] | None:
    """(model key, checkpoint_dir, host GiB) of the profile's largest model whose offload run fits ``ram_gib``."""
    from lab_helpers.arithmetic import count_params
    from lab_helpers.experiments import check_profile, recipe_path_for, resolve_path
    from lab_helpers.planner.analytic import offload_host_bytes

    profile = check_profile(run.profile)
    devices = run.devices * run.experiment.num_nodes
    best: tuple[int, str, str, float] | None = None
    for model_key in profile["models"]:
        recipe_path = recipe_path_for(dataclasses.replace(run.experiment, model=model_key), run.profile)
        checkpoint_dir = yaml.safe_load(recipe_path.read_text())["checkpoint_dir"]
        params = count_params(str(resolve_path(checkpoint_dir))).total
        gib = offload_host_bytes(params, params, devices) / GIB
        if gib <= ram_gib and (best is None or params > best[0]):
            best = (params, model_key, checkpoint_dir, gib)
    return None if best is None else best[1:]
