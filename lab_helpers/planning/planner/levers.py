"""The levers of an overhead-bound loop as the time model sees them: compiled blocks, CUDA graphs, the attention
backend. Host time is kernels launched x a per-launch cost, so a lever is what it does to launches: the measured
compiled / eager factor (``compile_launches``) applies to the blocks' traced launches only, the rest of the step
stays as traced. CUDA graphs are modelled, not measured: two replays a block (forward, backward). Fusion's saved
memory traffic is not modelled.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from .calibration import traced_ops
from .spec import TrainingSpec

PLAN_BUILDING_BACKENDS: tuple[str | None, ...] = (None, "cudnn")
"""Attention backends that build a cuDNN plan per first-seen length (bf16 on Hopper): torch's own choice (cuDNN
there) and cuDNN asked for; flash, efficient and math attention build none."""


@dataclass(frozen=True)
class CompiledBlock:
    """``source``: where and how they were counted."""

    eager_forward: float
    eager_backward: float
    compiled_forward: float
    compiled_backward: float
    source: str

    @property
    def factor(self) -> float:
        return (self.compiled_forward + self.compiled_backward) / (self.eager_forward + self.eager_backward)

    def describe(self) -> str:
        return (
            f"one block launches {self.eager_forward:.0f} + {self.eager_backward:.0f} kernels eager (forward + "
            f"backward), {self.compiled_forward:.0f} + {self.compiled_backward:.0f} compiled: x {self.factor:.2f}"
        )


@dataclass(frozen=True)
class Levers:
    """What the trace does not show; ``compiled`` None is eager, ``attention_backend`` None is torch's choice."""

    compiled: CompiledBlock | None = None
    cuda_graphs: bool = False
    attention_backend: str | None = None

    @property
    def builds_plans(self) -> bool:
        return self.attention_backend in PLAN_BUILDING_BACKENDS


def block_kernels(spec: TrainingSpec, seq_len: int) -> float:
    """The step traced at two blocks less the step at one: blocks are identical."""

    def with_blocks(n: int) -> TrainingSpec:
        config = copy.deepcopy(spec.model_config)
        config.n_layer = n
        return dataclasses.replace(spec, model_config=config)

    one, two = (traced_ops(with_blocks(n), seq_len).kernels_per_micro_batch() for n in (1, 2))
    return two - one


def launches_saved(spec: TrainingSpec, seq_len: int, levers: Levers) -> tuple[float, str]:
    """(launches per micro-batch taken off the host, a note saying how). A block's launches do not depend on the length,
    so one figure serves every micro-batch."""
    if levers.compiled is None:
        return 0.0, ""
    per_block, blocks = block_kernels(spec, seq_len), spec.model_config.n_layer
    if levers.cuda_graphs:
        saved = blocks * (per_block - 2)
        how = (f"CUDA graphs (a model): each of the {blocks} compiled blocks' {per_block:,.0f} traced launches "
               "become 2 graph replays (its forward and its backward)")  # fmt: skip
    else:
        saved = blocks * per_block * (1 - levers.compiled.factor)
        how = (f"compiled blocks: each of the {blocks} blocks' {per_block:,.0f} traced launches x "
               f"{levers.compiled.factor:.2f} ({levers.compiled.describe()})")  # fmt: skip
    return (
        saved,
        f"{how}: {saved:,.0f} fewer launches per micro-batch; the device's work as traced (fusion not modelled)",
    )
