"""The DeepSpeed configuration for ZeRO-3 (or ZeRO-2) with the optimizer offloaded to the CPU: one function, so that
the JSON in the run folder, the training process and the tests see the same thing. Bucket sizes are written out so
that the planner and the run use the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.config.experiments import gradient_accumulation_steps  # the one definition (ResolvedRun uses it)

__all__ = ["CPU_ADAM_CLASS", "cpu_adam_kwargs", "deepspeed_config", "gradient_accumulation_steps"]

# DeepSpeed's optimizer for offloaded states; the training script instantiates it (see optimizer_kwargs).
CPU_ADAM_CLASS = "deepspeed.ops.adam.DeepSpeedCPUAdam"
ZERO_STAGES = {"deepspeed-zero2": 2, "deepspeed-zero3": 3}  # the lab's strategy names -> ZeRO stage


def deepspeed_config(
    recipe: Mapping[str, Any],
    *,
    world_size: int,
    offload_optimizer: bool = True,
    pin_memory: bool = True,
    stage: int = 3,
) -> dict[str, Any]:
    """No optimizer in the config: Lightning passes the module's to ``deepspeed.initialize``
    (``zero_allow_untested_optimizer`` lets DeepSpeed accept it)."""
    precision = str(recipe.get("precision") or "32-true")
    train = recipe.get("train") or {}
    if stage not in (2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: the lab runs stage 2 or 3")
    from lab_helpers.config.recipe_defaults import (
        DS_ALLGATHER_BUCKET_NUMEL,
        DS_PREFETCH_BUCKET_NUMEL,
        DS_REDUCE_BUCKET_NUMEL,
    )

    # gradients leave through a reduce bucket of this many elements, allocated at start whatever the model's size
    # (written out, so the planner and the run use the same one: DeepSpeed's own default is 5e8 for stage 3)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": DS_REDUCE_BUCKET_NUMEL,
    }
    if stage == 3:
        # gather / release parameters per module; these are DeepSpeed's defaults written out for the student
        zero.update(
            {"stage3_prefetch_bucket_size": DS_PREFETCH_BUCKET_NUMEL, "stage3_param_persistence_threshold": 100_000}
        )
    else:
        # updated weights come back through all-gather buckets
        zero["allgather_bucket_size"] = DS_ALLGATHER_BUCKET_NUMEL
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": int(train["micro_batch_size"]),
        "gradient_accumulation_steps": gradient_accumulation_steps(recipe, world_size=world_size),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision.startswith("bf16")},
        "fp16": {"enabled": precision.startswith("16")},
        "wall_clock_breakdown": False,
    }
    max_norm = train.get("max_norm")
    if max_norm:
        config["gradient_clipping"] = float(max_norm)
    return config


def optimizer_class_path(recipe: Mapping[str, Any], *, strategy: str, offload_optimizer: bool, on_cuda: bool) -> str:
    """Offloaded states are stepped by DeepSpeed's C++ CPU Adam, several times faster than torch's. Without CUDA the
    recipe's torch optimizer steps them: ``cpu_adam`` costs 3-5 minutes of g++ on 2 cores for a tiny model."""
    if strategy in ZERO_STAGES and offload_optimizer and on_cuda:
        return CPU_ADAM_CLASS
    optimizer = recipe.get("optimizer") or "AdamW"
    path = optimizer if isinstance(optimizer, str) else optimizer.get("class_path", "torch.optim.AdamW")
    return path if "." in path else f"torch.optim.{path}"


def cpu_adam_kwargs(recipe: Mapping[str, Any]) -> dict[str, Any]:
    optimizer = recipe.get("optimizer") or {}
    init_args = dict(optimizer.get("init_args") or {}) if isinstance(optimizer, Mapping) else {}
    kwargs: dict[str, Any] = {"lr": float(init_args.get("lr", 1e-3)), "adamw_mode": True}
    if "betas" in init_args:
        kwargs["betas"] = tuple(float(b) for b in init_args["betas"])
    if "weight_decay" in init_args:
        kwargs["weight_decay"] = float(init_args["weight_decay"])
    if "eps" in init_args:
        kwargs["eps"] = float(init_args["eps"])
    return kwargs
