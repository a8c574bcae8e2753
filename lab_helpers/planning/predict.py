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

from lab_helpers.config.experiments import ResolvedRun, resolve, runnable_recipe
from lab_helpers.config.recipe_defaults import resolve_fsdp_impl

OOM_DEMO_MARGIN = 0.2
"""Where the lab raises an OOM demonstration's batch (only where the course's batch would fit), it raises it until
the prediction is this far over the GPU's memory (20 %): the planner can be off by up to ~10 %, and a
demonstration that fits by accident teaches the opposite of what it should."""

COURSE_BATCH_FITS_MARGIN = 0.05
"""The planner's error (``planner.fit.DEFAULT_MARGIN``): a course batch predicted within it of the GPU's size is
no "fits" (a real H100, 79.19 GiB, ran out of memory at baseline's 32 where a prediction fitted by 0.06 GiB)."""


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
        "ddp_gradient_as_bucket_view": bool(options["ddp_bucket_view"]),
        "fsdp_reshard_after_forward": options["sharding"] != "grad-op",  # grad-op: SHARD_GRAD_OP (ZeRO-2)
        "fsdp_impl": fsdp_impl,  # what the training process will resolve "auto" to on this hardware
        "activation_checkpointing": bool(options["activation_checkpointing"]),
        "gpu_memory_gib": gpu_memory_gib,
        "device": device,
    }


def plan_for(run: ResolvedRun, gpu_memory_gib: float | None, *, device: str | None = None):
    """The planner's MemoryPlan for ``run`` (memoized by the planner: the notebook's second ask costs nothing)."""
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
    profile: str,
    overrides: Mapping[str, Any] | None = None,
    gpu_memory_gib: float | None = None,
    device: str | None = None,
    simulate_world: int | None = None,
):
    """The planner's MemoryPlan for an experiment as it would run here (``.summary()`` prints the verdict);
    ``device`` "cuda" asks about a GPU from a machine without one (a node fixture); ``simulate_world`` about
    rank 0 of that many ranks."""
    run = resolve(exp_id, profile, overrides, check_files=False, simulate_world=simulate_world)
    return plan_for(run, gpu_memory_gib if gpu_memory_gib is not None else _gpu_gib(), device=device)


def _gpu_gib() -> float | None:
    """This GPU's memory in GiB (None without one), the reading the decision uses too; one name, so that a test can
    stand in a GPU's size on a CPU."""
    from lab_helpers.hardware.node import this_gpu_memory_gib

    return this_gpu_memory_gib()


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


COURSE_GPU_GIB = 80.0
"""The GPU LAB.md's expectations are written for (one 80 GB GPU): an OOM demonstration whose model states alone
exceed it teaches "no batch size helps" (full-13b); any other teaches that activations grow with the batch."""

STATES_SUBSTITUTES = ("bf16-mixed",)
"""Precisions that store more bytes per parameter, tried in order where a GPU holds a states lesson's model
states as defined: bf16-mixed keeps fp32 weights, gradients and AdamW moments (16 B/param against 8)."""


def teaches_model_states(exp_id: str) -> bool:
    """Whether the course's OOM for ``exp_id`` comes from the model states alone: on the real models (the gpu
    profile, whatever profile runs), weights + gradients + optimizer states exceed the course's 80 GB GPU."""
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
    """Overrides for an OOM demonstration on *this* GPU, and a sentence saying what was chosen and why.

    The course's own batch comes first: where the planner predicts it does not fit, or fits by less than its
    error (``COURSE_BATCH_FITS_MARGIN``), it runs as LAB.md defines it (on an 80 GB GPU: baseline at micro batch
    32, full-13b at 1), whatever the margin. Only where the
    course's batch would fit does the lab change it, and then so that the lesson stays the course's:

    * an activations lesson (baseline): the micro batch doubles until the prediction is ``OOM_DEMO_MARGIN``
      over the GPU -- the margin decides how far, never whether;
    * a model-states lesson (full-13b on a GPU that holds 13B's 8 B/param, e.g. a 141 GB H200): a bigger batch
      would make it an activations OOM, so a precision whose model states alone exceed this GPU runs instead
      (bf16-mixed, 16 B/param), from the arithmetic, which is exact for model states.

    ``device`` is where the run trains (default: "cuda" where torch has it); ``run_all`` and the notebook
    (through ``node_plan.decide``) both use this function.
    """
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else _gpu_gib()
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
    """A states lesson on a GPU that holds its states: the precision whose model states alone exceed it."""
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
    """An activations lesson on a GPU that holds the course's batch: double the micro batch until it is
    predicted ``OOM_DEMO_MARGIN`` over the GPU (beyond the planner's error)."""
    train = dict(resolve(exp_id, profile, check_files=False).recipe["train"])
    needed_gib = gpu_gib * (1 + OOM_DEMO_MARGIN)
    for _ in range(max_doublings):
        train["micro_batch_size"] *= 2
        train["global_batch_size"] = max(train["global_batch_size"], train["micro_batch_size"])
        overrides = {
            "train.micro_batch_size": train["micro_batch_size"],
            "train.global_batch_size": train["global_batch_size"],
        }
        plan = ask(overrides)
        if plan.gpu_used_gib >= needed_gib:
            return overrides, (
                f"{fits}: micro batch raised to {train['micro_batch_size']} so that it will not fit "
                f"(at least {OOM_DEMO_MARGIN:.0%} over this GPU, beyond the planner's error): {plan.summary()}"
            )
    return {}, f"{fits}; the planner predicts it fits even at micro batch {train['micro_batch_size']}: runs as defined"


def fill_gpu_for(
    run: ResolvedRun, *, gpu_memory_gib: float | None = None, device: str | None = None
) -> tuple[dict[str, Any], str]:
    """``fill-gpu`` (an experiment with ``options: {fill_gpu: true}``): the largest micro batch ``plan --fit`` says
    fits this GPU, accumulation keeping the global batch; and a sentence saying what was chosen and why.

    Why: a run whose GPU waits on the host (Python, kernel launches: the H100 records' lora-1b was 5-25 % busy)
    pays that host time per micro-batch, not per sample, so fewer and larger micro-batches spend it less often;
    the global batch, and so the optimisation, stays the same. The micro batch is the largest divisor of the
    per-device global batch at or under what the planner's fit search allows (``planner.fit.fit``: the predicted
    GPU memory used under the GPU's memory less its margin), so that accumulation x micro batch is the global batch
    exactly. Without a GPU (the ci profile) the run's memory is host RAM: the budget is this host's available RAM
    and the planner predicts live tensor bytes, the quantity a CPU run measures.
    """
    from lab_helpers.planning.planner.fit import fit
    from lab_helpers.planning.planner.spec import spec_from_recipe

    exp_id = run.experiment.id
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    memory = gpu_memory_gib if gpu_memory_gib is not None else _gpu_gib() if device == "cuda" else None
    where = "GPU" if device == "cuda" else "memory budget"
    if memory is None and device == "cpu":
        from lab_helpers.hardware.node import describe_node

        memory, where = (describe_node().get("host") or {}).get("ram_available_gib"), "host's available RAM"
    if not memory:
        return {}, f"{exp_id}: no memory size to fill here; runs as defined"
    inputs = planner_inputs(run, memory, device=device)
    spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
    per_device = spec.micro_batch_size * spec.gradient_accumulation_iters
    found = fit(spec, gpu_memory_gib=memory, sequence=False, alternatives=False, max_micro_batch_size=per_device)
    if found.max_micro_batch_size is None:
        return {}, f"{exp_id}: not even micro batch 1 fits this {memory:.3g} GiB {where}; runs as defined"
    micro = max(b for b in range(1, found.max_micro_batch_size + 1) if per_device % b == 0)
    return {"train.micro_batch_size": micro}, (
        f"{exp_id}: plan --fit says micro batch up to {found.max_micro_batch_size} fits this {memory:.3g} GiB "
        f"{where} (margin {found.margin:.0%}); micro batch {micro} x {per_device // micro} accumulated keeps the "
        f"global batch of {per_device} per device (was {spec.micro_batch_size} x {spec.gradient_accumulation_iters})"
    )
