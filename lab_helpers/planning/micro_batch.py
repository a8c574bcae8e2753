"""The micro batch a run fits at on this node, and the substitute that keeps an experiment's lesson where its own
model does not fit; ``decision._fit`` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lab_helpers.hardware.node import gpu_memory_gib
from lab_helpers.planning.node_limits import gpu_words, smaller_model_checkpoint

if TYPE_CHECKING:  # annotations only: no import at run time
    from lab_helpers.planning.decision_types import Predict


SMALLER_MODEL_SUBSTITUTES = ("act-ckpt", "adamw-8bit", "full-13b-sgd")
"""Experiments whose lesson is a technique (checkpointing, 8-bit AdamW, SGD), not a model size: where their model
does not fit, the same technique on the largest model that does keeps the lesson."""


def fitted_micro_batch(
    exp_id: str,
    experiment: Any,
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    predict: Predict,
) -> tuple[dict[str, Any] | None, str]:
    """The largest micro batch up to the recipe's that fits, a divisor of the per-rank global batch so that accumulation
    keeps it; one defined without accumulation (small-batch, ``accumulation: 1``) shrinks both, to a divisor of its
    own so that a pair keeping a global batch (grad-accum's 32) can follow."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.arithmetic import model_states
    from lab_helpers.planning.planner.fit import keeping_global_batch, largest_micro_batch

    memory = gpu_memory_gib(node)
    where = f"this {gpu_words(node)}"
    if experiment.strategy in ("single", "ddp"):
        states = model_states(exp_id, profile=profile, overrides=overrides)
        if states.gib > memory:
            return None, f"its model states alone are {states.gib:.1f} GiB, more than {where} holds"
    run = resolve(exp_id, profile, overrides, check_files=False)
    train = dict(run.recipe.get("train") or {})
    first = int(train.get("micro_batch_size") or 1)
    per_rank = experiment.accumulation == 1  # the course's rows: the global batch follows micro batch x ranks
    no_accumulation = per_rank or int(train.get("global_batch_size") or first) == first

    def trial_for(micro: int) -> dict[str, Any]:
        shrink = {"train.micro_batch_size": micro} if micro != first else {}
        if shrink and no_accumulation and not per_rank:
            shrink["train.global_batch_size"] = micro
        return {**overrides, **shrink}

    share = first if no_accumulation else max(1, int(train.get("global_batch_size") or first) // run.world_size)
    candidates = {*keeping_global_batch(share, first), first}
    micro = largest_micro_batch(lambda b: predict(exp_id, trial_for(b)).gpu_used_gib, memory,
                                candidates=candidates, start=first)  # fmt: skip
    if micro is None:
        plan = predict(exp_id, trial_for(1))
        return None, f"does not fit {where} even at micro batch 1 (predicted {plan.gpu_used_gib:.1f} GiB used)"
    trial = trial_for(micro)
    plan = predict(exp_id, trial)
    used = f"predicted {plan.gpu_used_gib:.1f} GiB used"
    if micro == first:
        return trial, f"fits {where} as defined: {used}"
    if no_accumulation:
        batch = "micro batch per GPU" if per_rank else "micro and global batch"
        return trial, (
            f"{batch} {first} -> {micro} so that it fits {where} ({used}), without accumulation, "
            "as the course defines it"
        )
    return trial, (
        f"micro batch {first} -> {micro} so that it fits {where} ({used}); the global batch stays "
        f"{train.get('global_batch_size')}, so the optimizer step is unchanged and gradient accumulation takes "
        "more micro-batches"
    )


def lesson_substitute(
    exp_id: str,
    experiment: Any,
    recipe: Mapping[str, Any],
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    predict: Predict,
) -> tuple[dict[str, Any], str, str] | None:
    """(overrides, what it is, how it fits), or None."""
    candidates: list[tuple[dict[str, Any], str]] = []
    has_bnb = bool((node.get("packages") or {}).get("bitsandbytes"))
    if experiment.method == "lora" and not recipe.get("quantize") and has_bnb and "precision" not in overrides:
        qlora = f"QLoRA-{experiment.model.upper()} (the same LoRA with the frozen weights in 4-bit NF4)"
        candidates.append(({**overrides, "quantize": "bnb.nf4"}, qlora))
    if exp_id in SMALLER_MODEL_SUBSTITUTES:
        for model in reversed(smaller_models(profile, experiment.model)):
            smaller = {**overrides, "checkpoint_dir": smaller_model_checkpoint(profile, model)}
            candidates.append((smaller, f"{exp_id} on the {model.upper()} model, the largest that fits"))
    for trial, what in candidates:
        fitted, how = fitted_micro_batch(exp_id, experiment, profile, node, trial, predict)
        if fitted is not None:
            return fitted, what, how
    return None


def smaller_models(profile: str, model: str) -> list[str]:
    from lab_helpers.config.experiments import check_profile

    models = list(check_profile(profile)["models"])
    return models[: models.index(model)]


def named_elsewhere(experiment: Any) -> str:
    """So that a skipped experiment's sentence names what trains its model here instead."""
    from lab_helpers.config.experiments import load_experiments

    section = load_experiments(experiment.section).items()
    others = [e for e, x in section if x.model == experiment.model and x.method != experiment.method]
    if not others:
        return ""
    return f"the {experiment.model.upper()} model is trained here by {' and '.join(others)} (its substitutes); "
