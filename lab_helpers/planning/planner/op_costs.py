"""What each traced op costs a GPU: FLOPs, bytes moved and kernels launched, read off its shapes and dtypes.

* kernels: 0 for views, metadata and allocations; a ``_foreach_*`` op or a fused optimizer step as CUDA's
  multi_tensor_apply packs it (``foreach_kernels``); else 1, even where CUDA runs several (split-K, two-pass
  reductions): the fitted per-launch cost absorbs it (``benchmarks/planner_time_check.py`` compares profiles);
* flops: ``torch.utils.flop_counter``'s formulas; attention causal (the kernels skip the masked half): 2 and 5
  matmuls of B x H x T^2 x D forward and backward; elementwise work is bounded by bytes: 0;
* bytes: every tensor read and written (an embedding reads only the rows it gathers: its output, twice).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

_NO_KERNEL = {
    "detach",
    "alias",
    "_unsafe_view",
    "lift_fresh",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "set_",
    "resize_",
    "_reshape_alias",
    "view",
    "_local_scalar_dense",  # .item(): the optimizer's step counts live on the host (not capturable)
}
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "_convolution"}
_ATTENTION_FORWARD = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
_ATTENTION_BACKWARD = {name + "_backward" for name in _ATTENTION_FORWARD}
_FUSED_OPTIMIZER_STEPS = {"_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"}
"""One in-place multi_tensor_apply kernel over params, grads and states (ATen's ``fused_adamw_impl.cu``: depth 4),
launched like a ``_foreach_`` op of that depth."""
FOREACH_MAX_TENSORS = (110, 64, 48, 36, 30)  # ATen MultiTensorApply.cuh: depthToMaxTensors
FOREACH_MAX_BLOCKS = 320  # depthToMaxBlocks
FOREACH_CHUNK = 65536  # kChunkSize
_UNIT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32_matmul"}


@dataclass(frozen=True)
class OpCost:
    """``unit``: the matmul unit its FLOPs run on (None: no FLOPs counted)."""

    name: str
    unit: str | None
    flops: float
    bytes: float
    kernels: float
    # a _foreach_ op: the tensors per list, their 65,536-element chunks and the lists (what its launches follow)
    tensors: float = 0.0
    chunks: float = 0.0
    depth: int = 0


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def foreach_kernels(lists: Sequence[Sequence[torch.Tensor]]) -> int:
    """A launch each time CUDA's multi_tensor_apply fills its packed tensors (by depth, ``len(lists)``) or blocks."""
    if not lists or not lists[0]:
        return 0
    depth = min(len(lists), len(FOREACH_MAX_TENSORS))
    max_tensors = FOREACH_MAX_TENSORS[depth - 1]
    launches = tensors = blocks = 0
    for t in lists[0]:
        tensors += 1
        full, blocks = divmod(blocks + max(1, math.ceil(t.numel() / FOREACH_CHUNK)), FOREACH_MAX_BLOCKS)
        if full:  # launched as the blocks filled; the rest of this tensor goes on into the next launch
            launches += full
            tensors = 1 if blocks else 0
        if tensors == max_tensors:
            launches, tensors, blocks = launches + 1, 0, 0
    return launches + (1 if blocks else 0)


def _attention_flops(args, backward: bool) -> float:
    q = args[1] if backward else args[0]  # backward: (grad_out, query, key, value, ...)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        return 0.0
    b, h, t, d = q.shape
    s = args[2 if backward else 1].shape[-2]
    per_matmul = b * h * t * s * d  # 2 x (multiply-adds) of a full matmul, halved by the causal mask
    return float((5 if backward else 2) * per_matmul)


def launches_kernel(name: str) -> bool:
    """For ops known by name only, as a profiler's events name them."""
    if name in _NO_KERNEL:
        return False
    packet = getattr(torch.ops.aten, name, None)
    return packet is None or not any(getattr(packet, overload).is_view for overload in packet.overloads())


def op_cost(func, args, kwargs, out) -> OpCost | None:
    """None for what launches nothing and moves nothing."""
    if func.namespace != "aten":
        return None
    name = func._overloadpacket.__name__
    if name in _NO_KERNEL or getattr(func, "is_view", False):
        return None
    inputs = _tensors(args) + _tensors(list((kwargs or {}).values()))
    outputs = _tensors(out)
    if name.startswith("_foreach_") or name in _FUSED_OPTIMIZER_STEPS:
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        if name in _FUSED_OPTIMIZER_STEPS:  # CUDA packs the tensor lists; the one-element step counts ride apart
            lists = [a for a in lists if a[0].dim() > 0]
        inplace = name.endswith("_")
        lists = lists + ([] if inplace or not outputs else [outputs])
        kernels = foreach_kernels(lists)
        chunks = sum(max(1, math.ceil(t.numel() / FOREACH_CHUNK)) for t in lists[0]) if lists else 0
        return OpCost(
            name,
            None,
            0.0,
            float(_nbytes(inputs) + _nbytes(outputs)),
            float(kernels),
            tensors=float(len(lists[0]) if lists else 0),
            chunks=float(chunks),
            depth=len(lists),
        )
    flops, unit = 0.0, None
    if name in _MATMUL:
        from torch.utils.flop_counter import flop_registry

        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            flops = float(formula(*args, **(kwargs or {}), out_val=out))
        unit = _UNIT.get(inputs[0].dtype) if inputs else None
    elif name in _ATTENTION_FORWARD or name in _ATTENTION_BACKWARD:
        flops = _attention_flops(args, name in _ATTENTION_BACKWARD)
        unit = _UNIT.get(inputs[0].dtype) if inputs else None
    if name == "embedding":
        moved = 2 * _nbytes(outputs) + _nbytes(inputs[1:])
    else:
        moved = _nbytes(inputs) + _nbytes(outputs)
    return OpCost(name, unit, flops, float(moved), 1.0)


# ------------------------------------------------------------------------------------------------ the multisets

Ops = tuple[tuple[OpCost, float], ...]
"""(op, count) pairs, in trace order where they come straight from a trace (every count 1)."""


@dataclass(frozen=True)
class OpCosts:
    """As (op, count) pairs, so traces at two depths or batch sizes combine like the memory timeline (``combined``)."""

    micro_batch: Ops
    optimizer_step: Ops
    notes: tuple[str, ...] = field(default=())

    def kernels_per_micro_batch(self) -> float:
        return kernels(self.micro_batch)

    def kernels_per_optimizer_step(self) -> float:
        return kernels(self.optimizer_step)


def kernels(ops: Ops) -> float:
    return sum(op.kernels * n for op, n in ops)


def flops(ops: Ops) -> float:
    return sum(op.flops * n for op, n in ops)


def moved_bytes(ops: Ops) -> float:
    return sum(op.bytes * n for op, n in ops)


def device_seconds(
    ops: Ops,
    *,
    peaks: dict[str, float | None],
    bandwidth: float,
    matmul_efficiency: float,
    bandwidth_efficiency: float,
) -> float:
    """One kernel at a time: no overlap. ``peaks`` maps a unit ("bf16", "fp16", "fp32_matmul") to FLOP/s; ``bandwidth``
    is bytes/s."""
    rate = bandwidth * bandwidth_efficiency
    total = 0.0
    for op, n in ops:
        compute = 0.0
        if op.flops:
            peak = peaks.get(op.unit or "fp32_matmul") or peaks.get("fp32_matmul")
            compute = op.flops / (peak * matmul_efficiency) if peak else 0.0
        total += n * max(compute, op.bytes / rate)
    return total


def from_trace(records: Sequence[tuple[str, OpCost]], micro_phases: set[str], step_phases: set[str]) -> OpCosts:
    micro = tuple((op, 1.0) for phase, op in records if phase in micro_phases)
    step = tuple((op, 1.0) for phase, op in records if phase in step_phases)
    return OpCosts(micro, step)


def _aligned(a: Ops, b: Ops) -> bool:
    return len(a) == len(b) and all(
        x.name == y.name and x.unit == y.unit and n == m for (x, n), (y, m) in zip(a, b, strict=True)
    )


def _combine_ops(a: Ops, b: Ops, factor: float) -> tuple[Ops, bool]:
    """Op by op where the two run the same ops in order (another batch size, a bigger optimizer step), else as multisets
    (blocks added); False where a count would go negative, and ``b`` is returned as is."""

    def lerp(x: float, y: float) -> float:
        return x + (y - x) * factor

    if _aligned(a, b):
        out = []
        for (x, n), (y, _) in zip(a, b, strict=True):
            kernels = max(0.0, lerp(x.kernels, y.kernels))
            tensors, chunks = lerp(x.tensors, y.tensors), lerp(x.chunks, y.chunks)
            if x.depth:  # a _foreach_ op's launches follow its tensors and chunks, which are linear: not its launches
                max_tensors = FOREACH_MAX_TENSORS[min(x.depth, len(FOREACH_MAX_TENSORS)) - 1]
                kernels = float(
                    max(math.ceil(tensors / max_tensors - 1e-9), math.ceil(chunks / FOREACH_MAX_BLOCKS - 1e-9))
                )
            cost = OpCost(
                x.name, x.unit, lerp(x.flops, y.flops), lerp(x.bytes, y.bytes), kernels, tensors, chunks, x.depth
            )
            out.append((cost, n))
        return tuple(out), True
    ca, cb = Counter(), Counter()
    for op, n in a:
        ca[op] += n
    for op, n in b:
        cb[op] += n
    combined = {op: lerp(ca.get(op, 0.0), cb.get(op, 0.0)) for op in {*ca, *cb}}
    if any(n < -1e-9 for n in combined.values()):
        return b, False
    return tuple((op, n) for op, n in combined.items() if n > 1e-9), True


def combined(a: OpCosts, b: OpCosts, factor: float, what: str) -> OpCosts:
    micro, ok_micro = _combine_ops(a.micro_batch, b.micro_batch, factor)
    step, ok_step = _combine_ops(a.optimizer_step, b.optimizer_step, factor)
    notes = list(b.notes)
    if not (ok_micro and ok_step):
        notes.append(f"op costs of {what} taken from one trace, not continued (its ops did not line up): approximate")
    return OpCosts(micro, step, tuple(notes))
