"""What compiling a transformer block does to its kernel launches, measured on this machine: one real litgpt Block,
eager and compiled by inductor on the CPU (``plan --time``'s ``compile`` lever).

Measured because how many launches inductor's fusion removes depends on the block's code, which no table says.
``plan`` measures the ci model of the experiment (the same Block code, at a size a CPU compiles in seconds) and
carries the factor to a GPU's prediction, saying so. Kept on disk (``ops_cache``): compiling takes tens of seconds
on 2 cores.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from pathlib import Path
from typing import Any

from lab_helpers.planning.planner.levers import CompiledBlock
from lab_helpers.planning.planner.spec import TrainingSpec

GENERATED = ("cpp_fused", "triton_")
"""What inductor names the kernels it generates (the CPU's C++, a GPU's Triton): a profile's events of them."""


def compiled_block(spec: TrainingSpec) -> CompiledBlock:
    from lab_helpers.planning.planner import ops_cache

    key = _key(spec)
    kept = ops_cache.load_json(key)
    if kept is not None:
        if isinstance(block := kept_block(kept), CompiledBlock):
            return block
        ops_cache.refused(key, block)  # measured again, and the entry replaced
    found = measure(spec)
    ops_cache.store_json(key, dataclasses.asdict(found))
    return found


def kept_block(data: Any) -> CompiledBlock | str:
    """Every launch count finite and >= 0, with eager launches to divide by; else why not, in a few words."""
    names = [field.name for field in dataclasses.fields(CompiledBlock)]
    if not isinstance(data, dict) or set(data) != set(names) or not isinstance(data["source"], str):
        return "not CompiledBlock's fields"
    counts = [data[name] for name in names if name != "source"]
    if not all(isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) and n >= 0 for n in counts):
        return "a launch count that is no finite number >= 0"
    if data["eager_forward"] + data["eager_backward"] <= 0:
        return "no eager launches"
    return CompiledBlock(**data)


def measure(spec: TrainingSpec) -> CompiledBlock:
    import torch

    block, inputs = _one_block(spec)
    eager_forward, eager_backward = _eager_launches(block, inputs)
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        block.compile()
        _forward_backward(block, inputs)  # compiles the forward, then the backward
        compiled_forward, compiled_backward = _compiled_launches(block, inputs)
    config = spec.model_config
    return CompiledBlock(
        eager_forward,
        eager_backward,
        compiled_forward,
        compiled_backward,
        f"measured on this machine (CPU inductor, torch {torch.__version__}): one {config.name} {spec.method} block, "
        f"micro-batch {spec.micro_batch_size} x {spec.seq_len} tokens",
    )


def _one_block(spec: TrainingSpec) -> tuple[Any, tuple[Any, ...]]:
    """(the first Block of a one-block model, its inputs: activations, RoPE cos and sin)."""
    import copy

    import torch

    from lab_helpers.planning.planner.trace_setup import build_model

    one = dataclasses.replace(spec, model_config=copy.deepcopy(spec.model_config))
    one.model_config.n_layer = 1
    torch.manual_seed(0)
    model = build_model(one, torch.float32)
    model.max_seq_length = spec.seq_len
    length, width = spec.seq_len, spec.model_config.n_embd
    x = torch.randn(spec.micro_batch_size, length, width, requires_grad=True)
    return model.transformer.h[0], (x, model.cos[:length].unsqueeze(0), model.sin[:length].unsqueeze(0))


def _forward_backward(block: Any, inputs: tuple[Any, ...]) -> None:
    _fresh(block, inputs)
    out = block(*inputs)
    out.backward(_ones(out))


def _fresh(block: Any, inputs: tuple[Any, ...]) -> None:
    """No gradients yet (the first micro-batch's backward: nothing accumulated into ``.grad``)."""
    for tensor in [*block.parameters(), inputs[0]]:
        tensor.grad = None


def _ones(out: Any) -> Any:
    import torch

    return torch.ones_like(out)


def _eager_launches(block: Any, inputs: tuple[Any, ...]) -> tuple[float, float]:
    from torch.utils._python_dispatch import TorchDispatchMode

    from lab_helpers.planning.planner.op_costs import op_cost

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            cost = op_cost(func, args, kwargs, out)
            self.kernels += cost.kernels if cost is not None else 0.0
            return out

    _fresh(block, inputs)
    with Count() as forward:
        out = block(*inputs)
    grad = _ones(out)
    with Count() as backward:
        out.backward(grad)
    return forward.kernels, backward.kernels


def _compiled_launches(block: Any, inputs: tuple[Any, ...]) -> tuple[float, float]:
    from torch.profiler import ProfilerActivity, profile

    _fresh(block, inputs)
    with profile(activities=[ProfilerActivity.CPU]) as forward:
        out = block(*inputs)
    grad = _ones(out)
    with profile(activities=[ProfilerActivity.CPU]) as backward:
        out.backward(grad)
    return launched(forward.events()), launched(backward.events())


def launched(events: Any) -> float:
    """Generated kernels and kernel-launching aten ops, counted where no aten op encloses them: an op's inner ops are
    its kernels, not more launches."""
    from lab_helpers.planning.planner.op_costs import launches_kernel

    count = 0
    for event in events:
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is not None:
            continue
        name = event.name
        if any(mark in name for mark in GENERATED):
            count += 1
        elif name.startswith("aten::") and launches_kernel(name.removeprefix("aten::")):
            count += 1
    return float(count)


def _key(spec: TrainingSpec) -> str:
    """Every spec field, this file, the planner's code and torch's version."""
    from lab_helpers.planning.planner import ops_cache

    text = f"compiled-block\0{ops_cache.code_digest()}\0{_this_file()}\0{spec!r}"
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _this_file() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
