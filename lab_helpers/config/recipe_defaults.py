"""The defaults a run is launched with, read by both the command and the planner so a prediction cannot use other
settings than its run (tests/test_settings_drift.py). Imports nothing from the lab.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

LORA_LAYER_KEYS: tuple[str, ...] = ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head")

LORA_KEYS: tuple[str, ...] = ("lora_r", "lora_alpha", "lora_dropout", *LORA_LAYER_KEYS)


@functools.cache
def lora_defaults() -> Mapping[str, Any]:
    """Read from litgpt's ``setup`` signature, not restated, so an upgrade cannot leave the planner on old defaults."""
    from litgpt.finetune import lora  # imported on first use: this module is read by every process

    parameters = inspect.signature(lora.setup).parameters
    return MappingProxyType({key: parameters[key].default for key in LORA_KEYS})


LAUNCH_OPTION_DEFAULTS: Mapping[str, Any] = {
    "wrap": "block",  # FSDP unit: each transformer Block ("none": the whole model)
    "fsdp_impl": "auto",  # fsdp1 | fsdp2 | auto (by hardware)
    "sharding": "full",  # FSDP: full (FULL_SHARD, ZeRO-3) | grad-op (SHARD_GRAD_OP, ZeRO-2)
    "offload_optimizer": None,  # None: True for the DeepSpeed strategies (the lab's offload runs), False elsewhere
    "pin_memory": True,  # DeepSpeed's offloaded optimizer states in pinned host memory
    "activation_checkpointing": False,  # recompute each Block's activations in backward (litgpt-cli: child flag)
    # DDP: gradients as views into the reducer's buckets (one copy); False is torch's and the course's default,
    # where the buckets are a second copy of the gradients (the ddp-course experiment)
    "ddp_bucket_view": True,
    # the largest micro batch `plan --fit` says fits, accumulation keeping the global batch (predict.fill_gpu_for,
    # applied by lab.run_experiment unless a micro batch is given): the fill-gpu experiment
    "fill_gpu": False,
    # the order of the training samples in micro-batches (BATCH_ORDERS): litgpt-cli only; the length-grouped
    # experiment's "length-grouped" (quick_mode.LengthGroupedSampler, applied by the child: --batch-order)
    "batch_order": "shuffle",
    # the levers of an overhead-bound loop, applied by the litgpt child (litgpt-cli only):
    # "blocks": each transformer Block compiled before fit (regional torch.compile; --compile)
    "compile": None,
    # torch.compile's mode (COMPILE_MODES); "reduce-overhead" (CUDA graphs) needs CUDA: plain compile elsewhere
    "compile_mode": "default",
    # each training micro-batch padded to a multiple of this many tokens, or "max": to the longest the model takes
    # (None: litgpt's own padding, to the micro-batch's longest sample; --pad-multiple)
    "pad_multiple": None,
    # scaled-dot-product attention restricted to one backend around fit (ATTENTION_BACKENDS; --attention-backend)
    "attention_backend": None,
}
"""``options:`` in configs/experiments/*.yaml; all but ``activation_checkpointing``, ``fill_gpu``, ``batch_order``
and ``CHILD_LEVERS`` concern ``lightning-strategy`` experiments only."""

CHILD_LEVERS: tuple[str, ...] = ("compile", "compile_mode", "pad_multiple", "attention_backend")

COMPILE_TARGETS: tuple[str, ...] = ("blocks",)
"""``blocks``: each ``Block`` on its own (regional, as torchtune does): compiled once, reused by every block."""

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
"""On a CPU the child compiles these with ``default`` instead, and its record says so."""

ATTENTION_BACKENDS: Mapping[str, str] = MappingProxyType(
    {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
)

PAD_TO_MAX = "max"

BATCH_ORDERS: tuple[str, ...] = ("shuffle", "length-grouped")

FSDP_IMPLS = ("auto", "fsdp1", "fsdp2")

OFFLOADING_STRATEGIES = ("deepspeed-zero2", "deepspeed-zero3")

# DeepSpeed ZeRO buckets, in elements: the lab's DeepSpeed config writes them out (distributed.deepspeed_config)
# and the planner sizes the same buffers from them (planner.analytic), so the run and its prediction cannot part.
DS_REDUCE_BUCKET_NUMEL = 200_000_000
"""``reduce_bucket_size``: Lightning's value; DeepSpeed's own default is 5e8."""
DS_ALLGATHER_BUCKET_NUMEL = 200_000_000  # ZeRO-2's allgather_bucket_size
DS_PREFETCH_BUCKET_NUMEL = 50_000_000  # ZeRO-3's stage3_prefetch_bucket_size (DeepSpeed's default, written out)


def launch_options(strategy: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    merged = {**LAUNCH_OPTION_DEFAULTS, **(options or {})}
    if merged["batch_order"] not in BATCH_ORDERS:
        raise ValueError(f"batch_order {merged['batch_order']!r} is not one of {', '.join(BATCH_ORDERS)}")
    if (problem := lever_problem(merged)) is not None:
        raise ValueError(problem)
    if merged["offload_optimizer"] is None:
        merged["offload_optimizer"] = strategy in OFFLOADING_STRATEGIES
    return merged


def lever_problem(options: Mapping[str, Any]) -> str | None:
    compile_target, mode = options.get("compile"), options.get("compile_mode", "default")
    pad, backend = options.get("pad_multiple"), options.get("attention_backend")
    if compile_target is not None and compile_target not in COMPILE_TARGETS:
        return f"compile {compile_target!r} is not one of {', '.join(COMPILE_TARGETS)} (or null: none)"
    if mode not in COMPILE_MODES:
        return f"compile_mode {mode!r} is not one of {', '.join(COMPILE_MODES)}"
    if pad is not None and pad != PAD_TO_MAX and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 1):
        return f"pad_multiple {pad!r} is not a whole number of tokens >= 1, {PAD_TO_MAX!r} or null"
    if backend is not None and backend not in ATTENTION_BACKENDS:
        return f"attention_backend {backend!r} is not one of {', '.join(ATTENTION_BACKENDS)} (or null: torch's choice)"
    return None


def padded_length(longest: int, pad_multiple: int | str | None, limit: int) -> int:
    """Never beyond ``limit``, litgpt's ``model.max_seq_length``: its rope cache refuses a longer batch."""
    if pad_multiple is None:
        return longest
    if pad_multiple == PAD_TO_MAX:
        return max(longest, limit)
    return max(longest, min(-(-longest // int(pad_multiple)) * int(pad_multiple), limit))


def lora_settings(recipe: Mapping[str, Any]) -> dict[str, Any]:
    if not any(str(key).startswith("lora_") for key in recipe):
        return {}
    return {key: recipe.get(key, default) for key, default in lora_defaults().items()}


def resolve_fsdp_impl(requested: str, *, on_cuda: bool) -> str:
    """Lightning's ``FSDPStrategy`` refuses a CPU, so fsdp1 asked for there is an error, not a silent switch."""
    if requested not in FSDP_IMPLS:
        raise ValueError(f"fsdp_impl {requested!r} is not one of {', '.join(FSDP_IMPLS)}")
    if requested == "auto":
        return "fsdp1" if on_cuda else "fsdp2"
    if requested == "fsdp1" and not on_cuda:
        raise ValueError("fsdp_impl 'fsdp1' needs CUDA (Lightning's FSDPStrategy refuses a CPU); use 'fsdp2' or 'auto'")
    return requested
