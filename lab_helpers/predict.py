"""The planner asked about a resolved run, with exactly the settings the run is launched with.

``planner_inputs`` is the one translation from a ``ResolvedRun`` to the planner's arguments: the world size, the
strategy and the launch options (offload, FSDP wrap policy, sharding and implementation) come from the run
itself (``ResolvedRun.options``, ``recipe_defaults``), the same values the launcher writes into the command.
The planner memoizes its own predictions (``planner.plan.predict``) and hands back a copy: there is no second
cache here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.experiments import ResolvedRun, resolve, runnable_recipe
from lab_helpers.recipe_defaults import resolve_fsdp_impl

OOM_DEMO_MARGIN = 0.2
"""An OOM demonstration must be predicted this far over the GPU's memory (20 %): the planner can be off by
up to ~10 %, and a demonstration that fits by accident teaches the opposite of what it should."""


def planner_inputs(run: ResolvedRun, gpu_memory_gib: float | None, *, device: str | None = None) -> dict[str, Any]:
    """``planner.plan_recipe`` keyword arguments for ``run`` (the recipe under ``recipe``).

    ``device`` defaults to where the run trains: "cuda" where torch has CUDA, else "cpu" (a CPU run is compared
    with its live tensor bytes).
    """
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    options = run.options
    strategy = run.experiment.strategy
    fsdp_impl = resolve_fsdp_impl(options["fsdp_impl"], on_cuda=device == "cuda") if strategy == "fsdp" else None
    return {
        "recipe": runnable_recipe(run.recipe),
        "devices": run.world_size,
        "strategy": strategy,
        "offload_optimizer": bool(options["offload_optimizer"]),
        "fsdp_wrap_blocks": options["wrap"] == "block",
        "fsdp_reshard_after_forward": options["sharding"] != "grad-op",  # grad-op: SHARD_GRAD_OP (ZeRO-2)
        "fsdp_impl": fsdp_impl,  # what the training process will resolve "auto" to on this hardware
        "activation_checkpointing": bool(options["activation_checkpointing"]),
        "gpu_memory_gib": gpu_memory_gib,
        "device": device,
    }


def plan_for(run: ResolvedRun, gpu_memory_gib: float | None):
    """The planner's MemoryPlan for ``run`` (memoized by the planner: the notebook's second ask costs nothing)."""
    from lab_helpers.planner import plan_recipe

    inputs = planner_inputs(run, gpu_memory_gib)
    return plan_recipe(inputs.pop("recipe"), **inputs)


def gpu_memory_gib() -> float | None:
    """This machine's GPU 0 memory in GiB as CUDA reports it; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def predict_experiment(
    exp_id: str,
    *,
    profile: str,
    overrides: Mapping[str, Any] | None = None,
    gpu_memory_gib: float | None = None,
):
    """The planner's MemoryPlan for an experiment as it would run here (``.summary()`` prints the verdict)."""
    run = resolve(exp_id, profile, overrides, check_files=False)
    return plan_for(run, gpu_memory_gib if gpu_memory_gib is not None else _gpu_gib())


def _gpu_gib() -> float | None:
    """This GPU's memory, behind one name the functions below share (their ``gpu_memory_gib`` argument shadows
    the public function), so a test can stand in a GPU's size on a CPU."""
    return gpu_memory_gib()


def prediction_fields(run: ResolvedRun) -> dict[str, Any]:
    """The planner's prediction, stored with the run so plots show predicted beside measured."""
    try:
        plan = plan_for(run, _gpu_gib())
    except Exception as exc:  # a prediction is advice: never let it stop a paid-for run
        return {"predicted_peak_alloc_gib": None, "predicted": None, "prediction_error": f"{type(exc).__name__}: {exc}"}
    return {
        "predicted_peak_alloc_gib": plan.peak_alloc_gib,
        "predicted_peak_alloc_whole_run_gib": plan.whole_run_peak_alloc_gib,
        "predicted": plan.to_dict(),
    }


def oom_demo_overrides(
    exp_id: str, *, profile: str, max_doublings: int = 6, gpu_memory_gib: float | None = None
) -> tuple[dict[str, Any], str]:
    """Overrides that make an OOM demonstration OOM on *this* GPU, and a sentence saying what was chosen.

    LAB.md's OOM experiments assume an 80 GB GPU; on a larger one they would fit and teach nothing. The
    planner is asked, and the micro (and global) batch doubled until the prediction exceeds the GPU's memory
    by at least ``OOM_DEMO_MARGIN``. ``run_all`` and the notebook both use it.
    """
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else _gpu_gib()
    if gpu_gib is None:
        return {}, "no GPU here: the experiment runs as defined (an OOM needs a GPU)"
    run = resolve(exp_id, profile, check_files=False)
    train = dict(run.recipe["train"])
    overrides: dict[str, Any] = {}
    needed_gib = gpu_gib * (1 + OOM_DEMO_MARGIN)
    for _ in range(max_doublings + 1):
        plan = plan_for(resolve(exp_id, profile, overrides, check_files=False), gpu_gib)
        if plan.fits is False and plan.gpu_used_gib >= needed_gib:
            if not overrides:
                return {}, f"as defined: {plan.summary()}"
            return (
                overrides,
                f"micro batch raised to {overrides['train.micro_batch_size']} so that it will not fit "
                f"(at least {OOM_DEMO_MARGIN:.0%} over this GPU, beyond the planner's error): {plan.summary()}",
            )
        train["micro_batch_size"] *= 2
        train["global_batch_size"] = max(train["global_batch_size"], train["micro_batch_size"])
        overrides = {
            "train.micro_batch_size": train["micro_batch_size"],
            "train.global_batch_size": train["global_batch_size"],
        }
    return {}, f"the planner predicts it fits even at micro batch {train['micro_batch_size']}: runs as defined"
