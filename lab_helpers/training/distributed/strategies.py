"""Which Lightning strategy object runs each of the lab's strategy names on this hardware (some refuse a CPU), and
the ``strategy_used`` words, so that a result says what really ran.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from lab_helpers.config.recipe_defaults import resolve_fsdp_impl  # the one rule, shared with the planner

STRATEGIES = ("single", "ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3")
WRAP_POLICIES = ("block", "none")
# FSDP sharding: full = FULL_SHARD (ZeRO-3: weights freed after each unit's forward, gathered again for backward);
# grad-op = SHARD_GRAD_OP (ZeRO-2: weights kept from forward to backward; FSDP2's reshard_after_forward=False)
SHARDINGS = {"full": "FULL_SHARD", "grad-op": "SHARD_GRAD_OP"}

# How long a rank waits in a collective for a peer before giving up; a dead peer on gloo is usually noticed
# at once (closed socket), this bounds the rest. Override with $LAB_DIST_TIMEOUT_S.
DEFAULT_COLLECTIVE_TIMEOUT_S = 600


@dataclass
class StrategyChoice:
    strategy: Any
    label: str
    fsdp_impl: str | None = None  # "fsdp1" | "fsdp2" for fsdp, else None
    wrap: str | None = None  # "block" | "none" for fsdp
    sharding: str | None = None  # "full" | "grad-op" for fsdp


@dataclass(frozen=True)
class StrategyCall:
    """The arguments that are the lesson, kept apart from the lab's plumbing (backend, timeout), so that
    ``commands.strategy_lines`` prints for the student's script what ``make_strategy`` builds."""

    class_name: str  # in lightning.pytorch.strategies
    kwargs: dict[str, Any]
    # the lab's settings it was chosen from, as the record names them (fsdp: fsdp_impl, wrap, sharding)
    settings: dict[str, Any] = field(default_factory=dict)

    def build(self, **plumbing: Any) -> Any:
        import lightning.pytorch.strategies as strategies

        return getattr(strategies, self.class_name)(**self.kwargs, **plumbing)


def strategy_call(
    name: str,
    *,
    on_cuda: bool,
    world_size: int,
    wrap: str = "block",
    fsdp_impl: str = "auto",
    deepspeed_config: dict[str, Any] | None = None,
    sharding: str = "full",
    ddp_bucket_view: bool = True,
) -> StrategyCall | None:
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} is not one of {', '.join(STRATEGIES)}")
    if name == "single":
        return None
    if name == "ddp":
        # gradients as views into the reducer's buckets: without it DDP keeps a second full copy of them
        # (12.5 GiB for a 7B model in bf16), which is not what the lesson "DDP saves no memory" is about; the
        # course's scripts keep torch's default (False): the ddp-course experiment shows what that costs
        return StrategyCall("DDPStrategy", {"gradient_as_bucket_view": ddp_bucket_view})
    if name == "fsdp":
        if wrap not in WRAP_POLICIES:
            raise ValueError(f"wrap {wrap!r} is not one of {', '.join(WRAP_POLICIES)}")
        if sharding not in SHARDINGS:
            raise ValueError(f"sharding {sharding!r} is not one of {', '.join(SHARDINGS)}")
        impl = resolve_fsdp_impl(fsdp_impl, on_cuda=on_cuda)
        settings = {"fsdp_impl": impl, "wrap": wrap, "sharding": sharding}
        if impl == "fsdp1":
            from litgpt.model import Block

            policy = {Block} if wrap == "block" else None
            return StrategyCall(
                "FSDPStrategy", {"sharding_strategy": SHARDINGS[sharding], "auto_wrap_policy": policy}, settings
            )
        # pure data parallel over every rank; the module's configure_model applies fully_shard (FSDP2)
        kwargs = {"data_parallel_size": world_size, "tensor_parallel_size": 1}
        return StrategyCall("ModelParallelStrategy", kwargs, settings)
    # deepspeed-zero2 | deepspeed-zero3
    if deepspeed_config is None:
        raise ValueError(f"{name} needs the DeepSpeed config (lab_helpers.training.distributed.deepspeed_config)")
    # Lightning sets gradient_accumulation_steps from the Trainer's accumulate_grad_batches and refuses it here
    config = {key: value for key, value in deepspeed_config.items() if key != "gradient_accumulation_steps"}
    return StrategyCall("DeepSpeedStrategy", {"config": config})


def collective_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get("LAB_DIST_TIMEOUT_S", DEFAULT_COLLECTIVE_TIMEOUT_S)))


def make_strategy(name: str, *, on_cuda: bool, simulated: bool = False, **settings: Any) -> StrategyChoice:
    call = strategy_call(name, on_cuda=on_cuda, **settings)
    backend = "fake" if simulated else "nccl" if on_cuda else "gloo"
    where = "CUDA" if on_cuda else "CPU"
    plumbing = {"process_group_backend": backend, "timeout": collective_timeout()}
    if call is None:
        return StrategyChoice("auto", f"single device ({where})")
    if name == "ddp":
        if simulated:
            # the fake group's all-reduce hands back no tensor, which DDP's reducer rejects; torch's noop hook
            # returns the bucket itself, as an in-place NCCL all-reduce does (no extra memory either way)
            from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

            from lab_helpers.training.distributed.simulated import SimulatedDDPStrategy

            strategy = SimulatedDDPStrategy(**call.kwargs, **plumbing, ddp_comm_hook=noop_hook)
        else:
            strategy = call.build(**plumbing)
        views = "" if call.kwargs["gradient_as_bucket_view"] else ", gradient_as_bucket_view=False"
        noop = ", all-reduce hook: noop_hook" if simulated else ""
        return StrategyChoice(strategy, f"ddp (DDPStrategy{views}, {backend}{noop}, {where})")
    if name == "fsdp":
        impl, wrap, sharding = call.settings["fsdp_impl"], call.settings["wrap"], call.settings["sharding"]
        wrap_words = "wrap per transformer block" if wrap == "block" else "one unit, no per-block wrap"
        if impl == "fsdp1":
            shard_words = "full shard" if sharding == "full" else "SHARD_GRAD_OP"
            label = f"fsdp1 (FSDPStrategy, {shard_words}, {wrap_words}, {where})"
        else:
            reshard = "" if sharding == "full" else " reshard_after_forward=False (SHARD_GRAD_OP)"
            label = f"fsdp2 (ModelParallelStrategy, fully_shard{reshard}, {wrap_words}, {where})"
        return StrategyChoice(call.build(**plumbing), label, impl, wrap, sharding)
    zero = call.kwargs["config"].get("zero_optimization", {})
    words = f"deepspeed zero{zero.get('stage', 3)}" + (" + cpu offload" if "offload_optimizer" in zero else "")
    if on_cuda:
        return StrategyChoice(call.build(**plumbing), f"{words} (DeepSpeedStrategy, CUDA)")
    from lab_helpers.training.distributed.deepspeed_cpu import CPUDeepSpeedStrategy

    strategy = CPUDeepSpeedStrategy(**call.kwargs, **plumbing)
    return StrategyChoice(strategy, f"{words} (DeepSpeedStrategy on CPU, DS_ACCELERATOR=cpu, {backend})")
