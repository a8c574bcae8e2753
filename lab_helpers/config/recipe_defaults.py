"""The defaults a run is launched with, in one place: the command that runs it and the planner that predicts it
both read them here, so a prediction cannot be made with other settings than the run it predicts
(tests/test_settings_drift.py fails if they part).

Bottom layer: imports nothing from the lab.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

LORA_LAYER_KEYS: tuple[str, ...] = ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head")
"""``litgpt finetune_lora``'s switches: which layers get adapters."""

LORA_KEYS: tuple[str, ...] = ("lora_r", "lora_alpha", "lora_dropout", *LORA_LAYER_KEYS)
"""The LoRA settings of ``litgpt finetune_lora`` that change what trains."""


@functools.cache
def lora_defaults() -> Mapping[str, Any]:
    """``litgpt finetune_lora``'s own defaults, read from its ``setup`` signature (r=8 on query and value in
    0.5.13): what trains when a recipe leaves a LoRA key out. Read, not restated, so a litgpt upgrade that
    changes them cannot leave the planner and the FLOP count on the old ones. The lab's recipes set every key
    (LAB.md: r32 on all linear layers)."""
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
    # the levers of an overhead-bound loop, applied by the litgpt child (litgpt-cli only; issue 52):
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
"""Launch settings of an experiment (``options:`` in configs/experiments/*.yaml); all but
``activation_checkpointing``, ``fill_gpu``, ``batch_order`` and the levers (``CHILD_LEVERS``) concern
``lightning-strategy`` experiments only."""

CHILD_LEVERS: tuple[str, ...] = ("compile", "compile_mode", "pad_multiple", "attention_backend")
"""Options only the litgpt child applies (``child_litgpt``): a ``lightning-strategy`` experiment cannot ask for them."""

COMPILE_TARGETS: tuple[str, ...] = ("blocks",)
"""``compile``: what is compiled. ``blocks``: each transformer ``Block`` on its own (regional compilation, as
torchtune does): one block's code is compiled once and reused by every block, so compile time stays short."""

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``compile_mode``: ``torch.compile``'s ``mode``."""

CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
"""Modes that record CUDA graphs: on a CPU the child compiles with ``default`` instead and its record says so."""

ATTENTION_BACKENDS: Mapping[str, str] = MappingProxyType(
    {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
)
"""``attention_backend``: the lab's name -> ``torch.nn.attention.SDPBackend``'s member."""

PAD_TO_MAX = "max"
"""``pad_multiple: max``: every micro-batch at one fixed length, the longest the model takes."""

BATCH_ORDERS: tuple[str, ...] = ("shuffle", "length-grouped")
"""``batch_order``: ``shuffle`` -- samples in random order (quick mode: the lab's fixed shuffle,
``quick_mode.QuickOrderSampler``; a full run: litgpt's own shuffled loader); ``length-grouped`` -- micro-batches of
samples of similar length (``quick_mode.LengthGroupedSampler``), so that less of each is padding."""

FSDP_IMPLS = ("auto", "fsdp1", "fsdp2")
"""``fsdp_impl``: FSDP1 (Lightning's ``FSDPStrategy``, flat parameters), FSDP2 (``ModelParallelStrategy`` +
``fully_shard``, per-parameter DTensors), or auto: whichever this hardware runs."""

OFFLOADING_STRATEGIES = ("deepspeed-zero2", "deepspeed-zero3")
"""Strategies that can move the optimizer to the host (the planner models offload for these only)."""

# DeepSpeed ZeRO buckets, in elements: the lab's DeepSpeed config writes them out (distributed.deepspeed_config)
# and the planner sizes the same buffers from them (planner.analytic), so the run and its prediction cannot part.
DS_REDUCE_BUCKET_NUMEL = 200_000_000
"""``reduce_bucket_size``: gradients leave through it (Lightning's value; DeepSpeed's own default is 5e8)."""
DS_ALLGATHER_BUCKET_NUMEL = 200_000_000
"""ZeRO-2's ``allgather_bucket_size``: updated weights come back through it."""
DS_PREFETCH_BUCKET_NUMEL = 50_000_000
"""ZeRO-3's ``stage3_prefetch_bucket_size`` (DeepSpeed's default, written out for the student)."""


def launch_options(strategy: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """An experiment's ``options`` over ``LAUNCH_OPTION_DEFAULTS``, every default made concrete."""
    merged = {**LAUNCH_OPTION_DEFAULTS, **(options or {})}
    if merged["batch_order"] not in BATCH_ORDERS:
        raise ValueError(f"batch_order {merged['batch_order']!r} is not one of {', '.join(BATCH_ORDERS)}")
    if (problem := lever_problem(merged)) is not None:
        raise ValueError(problem)
    if merged["offload_optimizer"] is None:
        merged["offload_optimizer"] = strategy in OFFLOADING_STRATEGIES
    return merged


def lever_problem(options: Mapping[str, Any]) -> str | None:
    """What is wrong with the levers of ``options`` (``CHILD_LEVERS``), or None: checked before anything starts."""
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
    """The length a micro-batch whose longest sample has ``longest`` tokens is trained at: litgpt's own (``longest``)
    without ``pad_multiple``; rounded up to the multiple; ``limit`` for ``"max"``. Never beyond ``limit``, the
    longest the model takes (litgpt's ``model.max_seq_length``: its rope cache refuses a longer batch)."""
    if pad_multiple is None:
        return longest
    if pad_multiple == PAD_TO_MAX:
        return max(longest, limit)
    return max(longest, min(-(-longest // int(pad_multiple)) * int(pad_multiple), limit))


def lora_settings(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Every LoRA setting the run trains with: the recipe's, else litgpt's default. Empty for a recipe with
    no LoRA key (full fine-tuning)."""
    if not any(str(key).startswith("lora_") for key in recipe):
        return {}
    return {key: recipe.get(key, default) for key, default in lora_defaults().items()}


def resolve_fsdp_impl(requested: str, *, on_cuda: bool) -> str:
    """fsdp1 (``FSDPStrategy``) on CUDA; fsdp2 (``ModelParallelStrategy`` + ``fully_shard``) on a CPU.

    Lightning's ``FSDPStrategy`` refuses a CPU accelerator, so asking for fsdp1 there is an error, not a
    silent switch.
    """
    if requested not in FSDP_IMPLS:
        raise ValueError(f"fsdp_impl {requested!r} is not one of {', '.join(FSDP_IMPLS)}")
    if requested == "auto":
        return "fsdp1" if on_cuda else "fsdp2"
    if requested == "fsdp1" and not on_cuda:
        raise ValueError("fsdp_impl 'fsdp1' needs CUDA (Lightning's FSDPStrategy refuses a CPU); use 'fsdp2' or 'auto'")
    return requested
