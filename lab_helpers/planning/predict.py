"""The planner asked about a resolved run with exactly the settings it is launched with: ``planner_inputs`` is the one
translation from a ``ResolvedRun`` to the planner's arguments. The planner memoizes its predictions: no cache here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

from lab_helpers.config.experiments import LabConfigError, ResolvedRun, parse_set_args, resolve, runnable_recipe
from lab_helpers.config.recipe_defaults import resolve_fsdp_impl
from lab_helpers.hardware import node

OOM_DEMO_MARGIN = 0.2
"""How far over the GPU's memory a raised OOM demonstration is predicted: the planner can be off by ~10 %, and a
demonstration that fits by accident teaches the opposite."""

COURSE_BATCH_FITS_MARGIN = 0.05
"""A course batch predicted to fit by less than the planner's error is no "fits": a real H100 (79.19 GiB) ran out
of memory at baseline's 32 where a prediction fitted by 0.06 GiB."""


def planner_inputs(run: ResolvedRun, gpu_memory_gib: float | None, *, device: str | None = None) -> dict[str, Any]:
    """``device`` defaults to where the run trains; a CPU run is compared with its live tensor bytes."""
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
        "ddp_gradient_as_bucket_view": bool(options["ddp_bucket_view"]),
        "fsdp_reshard_after_forward": options["sharding"] != "grad-op",  # grad-op: SHARD_GRAD_OP (ZeRO-2)
        "fsdp_impl": fsdp_impl,  # what the training process will resolve "auto" to on this hardware
        "activation_checkpointing": bool(options["activation_checkpointing"]),
        "gpu_memory_gib": gpu_memory_gib,
        "device": device,
    }


def plan_for(run: ResolvedRun, gpu_memory_gib: float | None, *, device: str | None = None):
    from lab_helpers.planning.planner import plan_recipe
    from lab_helpers.planning.planner.errors import UnknownModel

    inputs = planner_inputs(run, gpu_memory_gib, device=device)
    try:
        return plan_recipe(inputs.pop("recipe"), **inputs)
    except UnknownModel as err:  # the ci stand-ins are no litgpt config: their plan needs the built checkpoint
        raise UnknownModel(f"{err}: build it first: python -m lab_helpers prepare --profile {run.profile} "
                           f"(in a notebook: lab.prepare(profile={run.profile!r}))") from None  # fmt: skip


def predict_experiment(
    exp_id: str,
    *,
    profile: str | None = None,
    overrides: Mapping[str, Any] | list[str] | None = None,
    gpu_memory_gib: float | None = None,
    device: str | None = None,
    simulate_world: int | None = None,
):
    """The planner's MemoryPlan as the run would be here (``.summary()`` prints the verdict); the notebooks call it as
    ``lab.predict_experiment``. ``device`` "cuda" asks about a GPU from a machine without one (a node fixture);
    ``simulate_world`` about rank 0 of that many ranks."""
    from lab_helpers.planning.profile_choice import default_profile

    if isinstance(overrides, list):
        overrides = parse_set_args(overrides)
    if gpu_memory_gib is not None and not (
        isinstance(gpu_memory_gib, Real) and not isinstance(gpu_memory_gib, bool) and 0 < gpu_memory_gib < math.inf
    ):  # numpy's numbers too (a table's cell)
        raise LabConfigError(f"gpu_memory_gib is a GPU's size in GiB above 0 (e.g. 80); got {gpu_memory_gib!r}")
    run = resolve(exp_id, profile or default_profile(), overrides, check_files=False, simulate_world=simulate_world)
    gpu_gib = float(gpu_memory_gib) if gpu_memory_gib is not None else node.this_gpu_memory_gib()
    return plan_for(run, gpu_gib, device=device)


def prediction_fields(run: ResolvedRun) -> dict[str, Any]:
    """Stored with the run so plots show predicted beside measured."""
    try:
        plan = plan_for(run, node.this_gpu_memory_gib())
    except Exception as exc:  # a prediction is advice: never let it stop a paid-for run
        return {"predicted_peak_alloc_gib": None, "predicted": None, "prediction_error": f"{type(exc).__name__}: {exc}"}
    return {
        "predicted_peak_alloc_gib": plan.peak_alloc_gib,
        "predicted_peak_alloc_whole_run_gib": plan.whole_run_peak_alloc_gib,
        "predicted": plan.to_dict(),
    }


COURSE_GPU_GIB = 80.0
"""An OOM demonstration whose model states alone exceed LAB.md's one 80 GB GPU teaches "no batch size helps"
(full-13b); any other, that activations grow with the batch."""

STATES_SUBSTITUTES = ("bf16-mixed",)
"""For a GPU that holds a states lesson's model states: bf16-mixed keeps fp32 weights, gradients and AdamW moments
(16 B/param against 8)."""


def teaches_model_states(exp_id: str) -> bool:
    """On the real models, whatever profile runs: weights + gradients + optimizer states exceed an 80 GB GPU."""
    from lab_helpers.planning.arithmetic import model_states

    return model_states(exp_id, profile="gpu").gib > COURSE_GPU_GIB


def oom_demo_overrides(
    exp_id: str,
    *,
    profile: str,
    max_doublings: int = 6,
    gpu_memory_gib: float | None = None,
    device: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The course's batch where it is predicted not to fit, or to fit by less than the planner's error. Only where it
    fits does the lab change it, keeping the course's lesson: an activations lesson (baseline) doubles the micro batch
    until ``OOM_DEMO_MARGIN`` over; a model-states lesson (full-13b on a GPU that holds 13B's states) would become an
    activations OOM with a bigger batch, so a precision whose states alone exceed the GPU runs instead."""
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else node.this_gpu_memory_gib()
    if gpu_gib is None:
        return {}, "no GPU here: the experiment runs as defined (an OOM needs a GPU)"

    def ask(overrides: Mapping[str, Any]):
        return plan_for(resolve(exp_id, profile, overrides, check_files=False), gpu_gib, device=device)

    defined = ask({})
    if defined.gpu_used_gib > gpu_gib:
        return {}, f"runs as the course defines it, predicted not to fit this {gpu_gib:.0f} GiB GPU: {defined.summary()}"
    if defined.gpu_used_gib > gpu_gib * (1 - COURSE_BATCH_FITS_MARGIN):
        return {}, (
            f"runs as the course defines it: predicted {defined.gpu_used_gib:.2f} GiB used of this "
            f"{gpu_gib:.2f} GiB GPU, within the planner's {COURSE_BATCH_FITS_MARGIN:.0%} error of its size, "
            "which is no prediction that it fits"
        )
    fits = (
        f"as defined {exp_id} would fit this {gpu_gib:.0f} GiB GPU (predicted {defined.gpu_used_gib:.1f} GiB used; "
        "LAB.md's OOM is for an 80 GB GPU)"
    )
    if teaches_model_states(exp_id):
        return _states_substitute(exp_id, profile, gpu_gib, fits)
    return _raised_batch(exp_id, profile, gpu_gib, max_doublings, ask, fits)


def _states_substitute(exp_id: str, profile: str, gpu_gib: float, fits: str) -> tuple[dict[str, Any], str]:
    from lab_helpers.planning.arithmetic import model_states

    defined = model_states(exp_id, profile="gpu")
    for precision in STATES_SUBSTITUTES:
        states = model_states(exp_id, profile="gpu", overrides={"precision": precision})
        if states.trained.total > defined.trained.total and states.gib > gpu_gib:
            return {"precision": precision}, (
                f"{fits}; a bigger batch would make it an activations OOM, not the course's lesson, so it runs in "
                f"{precision} instead: {states.trained.formula()} × {states.counts.trainable / 1e9:.2f}e9 "
                f"parameters = {states.gib:.0f} GiB of model states alone, more than this GPU holds, so no batch "
                "size helps"
            )
    return {}, (
        f"{fits}; even at 16 B/param its model states fit this GPU, so nothing here shows the course's lesson "
        "(the model states alone exceed the GPU): it runs as defined and fits; "
        "the 80 GB reference results show the OOM"
    )


def _raised_batch(exp_id, profile, gpu_gib, max_doublings, ask, fits) -> tuple[dict[str, Any], str]:
    """The smallest doubling of the recipe's micro batch predicted ``OOM_DEMO_MARGIN`` over: the one above the largest
    that stays under, by the one micro-batch search (``fit.largest_micro_batch``)."""
    from lab_helpers.planning.planner.fit import largest_micro_batch

    train = resolve(exp_id, profile, check_files=False).recipe["train"]
    doublings = [train["micro_batch_size"] * 2**k for k in range(1, max_doublings + 1)]

    def overrides(micro: int) -> dict[str, int]:
        return {"train.micro_batch_size": micro, "train.global_batch_size": max(train["global_batch_size"], micro)}

    needed_gib = gpu_gib * (1 + OOM_DEMO_MARGIN)
    under = largest_micro_batch(lambda b: ask(overrides(b)).gpu_used_gib, math.nextafter(needed_gib, 0.0),
                                candidates=doublings)  # fmt: skip
    if under == doublings[-1]:
        return {}, f"{fits}; the planner predicts it fits even at micro batch {under}: runs as defined"
    micro = doublings[0] if under is None else doublings[doublings.index(under) + 1]
    return overrides(micro), (
        f"{fits}: micro batch raised to {micro} so that it will not fit (at least {OOM_DEMO_MARGIN:.0%} over this "
        f"GPU, beyond the planner's error): {ask(overrides(micro)).summary()}"
    )


def fill_gpu_for(
    run: ResolvedRun, *, gpu_memory_gib: float | None = None, device: str | None = None
) -> tuple[dict[str, Any], str]:
    """A run whose GPU waits on the host (the H100 records' lora-1b was 5-25 % busy) pays that host time per
    micro-batch, so fewer, larger micro-batches spend it less often at the same global batch: the largest divisor of
    the per-device global batch that fits (``fit``'s ``keep_global_batch``). Without a GPU the budget is the host's
    available RAM, against live tensor bytes."""
    from lab_helpers.planning.planner.fit import fit
    from lab_helpers.planning.planner.spec import spec_from_recipe

    exp_id = run.experiment.id
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    memory = gpu_memory_gib if gpu_memory_gib is not None else node.this_gpu_memory_gib() if device == "cuda" else None
    where = "GPU" if device == "cuda" else "memory budget"
    if memory is None and device == "cpu":
        memory, where = (node.describe_node().get("host") or {}).get("ram_available_gib"), "host's available RAM"
    if not memory:
        return {}, f"{exp_id}: no memory size to fill here; runs as defined"
    inputs = planner_inputs(run, memory, device=device)
    spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
    per_device = spec.micro_batch_size * spec.gradient_accumulation_iters
    found = fit(spec, gpu_memory_gib=memory, sequence=False, alternatives=False, keep_global_batch=True)
    micro = found.max_micro_batch_size
    if micro is None:
        return {}, f"{exp_id}: not even micro batch 1 fits this {memory:.3g} GiB {where}; runs as defined"
    return {"train.micro_batch_size": micro}, (
        f"{exp_id}: micro batch {micro} is the largest divisor of the per-device global batch that the planner says "
        f"fits this {memory:.3g} GiB {where} (margin {found.margin:.0%}); micro batch {micro} x {per_device // micro} "
        f"accumulated keeps the global batch of {per_device} per device (was {spec.micro_batch_size} x "
        f"{spec.gradient_accumulation_iters})"
    )
