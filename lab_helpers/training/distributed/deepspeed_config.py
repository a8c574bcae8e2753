"""The DeepSpeed configuration the lab generates for ZeRO-3 (or ZeRO-2) with the optimizer offloaded to the CPU.

One function builds it from the recipe, so the JSON a student can read in the run folder, the object the
training process hands to Lightning's ``DeepSpeedStrategy`` and the unit tests all see the same thing.
Why these settings: stage 3 shards parameters, gradients and optimizer states across ranks; offloading the
optimizer moves the 12 bytes/param of fp32 master weights and Adam moments to host RAM, where
``DeepSpeedCPUAdam`` (a vectorised C++ Adam) steps them while the GPU waits: the idle gap in the timeline
(without CUDA, torch's AdamW steps them: see ``optimizer_class_path``).
Stage 2 (the ``deepspeed-zero2`` strategy, the 8B blog run's setup) shards only gradients and optimizer
states: every GPU keeps all the weights, so forward and backward gather nothing; its bucket sizes are written
out so that the planner (``planner.analytic.deepspeed_zero2``) and the run use the same ones.
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
    """ZeRO-``stage`` config for ``recipe`` on ``world_size`` ranks (JSON-ready; ``DeepSpeedStrategy(config=...)``).

    The optimizer itself is not in the config: Lightning passes the ``DeepSpeedCPUAdam`` built by the
    module's ``configure_optimizers`` to ``deepspeed.initialize`` (``zero_allow_untested_optimizer`` lets
    DeepSpeed accept it); ``optimizer_class_path`` says which optimizer goes with the config.
    """
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
    """The optimizer class the training process builds: DeepSpeedCPUAdam whenever the optimizer is offloaded.

    A torch optimizer steps the states ZeRO keeps in host memory several times slower than DeepSpeed's
    vectorised C++ Adam, so on a GPU DeepSpeed requires its CPU Adam there. Without CUDA (the ci profile's
    tiny models) the recipe's torch optimizer steps them instead: DeepSpeed's ``cpu_adam`` op is compiled with
    g++ on first use, 3-5 minutes of a 2-core machine for a few thousand parameters, and the rest of ZeRO's
    offload (fp32 partitions in host memory, gradients copied out, weights copied back) runs the same.
    ``CPUDeepSpeedStrategy`` sets ``zero_force_ds_cpu_optimizer: false`` so DeepSpeed accepts it.
    Otherwise the recipe's own optimizer (``torch.optim.AdamW`` in the lab's recipes).
    """
    if strategy in ZERO_STAGES and offload_optimizer and on_cuda:
        return CPU_ADAM_CLASS
    optimizer = recipe.get("optimizer") or "AdamW"
    path = optimizer if isinstance(optimizer, str) else optimizer.get("class_path", "torch.optim.AdamW")
    return path if "." in path else f"torch.optim.{path}"


def cpu_adam_kwargs(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSpeedCPUAdam arguments taken from the recipe's AdamW (lr, betas, weight decay); AdamW mode kept."""
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
