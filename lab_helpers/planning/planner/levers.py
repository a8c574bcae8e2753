"""The levers of an overhead-bound loop, as the time model sees them: compiled blocks, CUDA graphs, the attention
backend (issue 52). Padding is no lever here: it reaches the model as the micro-batches' padded lengths.

Why only launches: the host's time is kernels launched x a per-launch cost (``timing``), and what compiling a block
does to the launches is measured, never typed: ``CompiledBlock`` holds one block's launches eager and compiled,
counted on a real litgpt Block (``lab_helpers.planning.compile_launches``, given here as an argument: the planner
probes nothing). Its factor, compiled / eager, is applied to the launches the trace counts in the step's blocks
(the step traced at two blocks less the step at one), so the launches outside them (embedding, head, loss, their
backward) stay as traced. With CUDA graphs (``compile_mode: reduce-overhead`` on CUDA) each compiled region
is one graph replay: a block's forward and its backward, two launches a block. That is a model, and says so. The
device's work is left as traced: fusion's saved memory traffic is not modelled.
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
    """One transformer block's kernel launches per micro-batch, eager and compiled, forward and backward, with
    where and how they were counted (``source``)."""

    eager_forward: float
    eager_backward: float
    compiled_forward: float
    compiled_backward: float
    source: str

    @property
    def factor(self) -> float:
        """Compiled launches / eager launches of one block, forward and backward together."""
        return (self.compiled_forward + self.compiled_backward) / (self.eager_forward + self.eager_backward)

    def describe(self) -> str:
        return (
            f"one block launches {self.eager_forward:.0f} + {self.eager_backward:.0f} kernels eager (forward + "
            f"backward), {self.compiled_forward:.0f} + {self.compiled_backward:.0f} compiled: x {self.factor:.2f}"
        )


@dataclass(frozen=True)
class Levers:
    """What an experiment switches on that the trace does not show: ``compiled`` (None: eager), ``cuda_graphs``
    (the compiled blocks replayed as CUDA graphs), ``attention_backend`` (None: torch's choice)."""

    compiled: CompiledBlock | None = None
    cuda_graphs: bool = False
    attention_backend: str | None = None

    @property
    def builds_plans(self) -> bool:
        """Whether the backend builds an attention plan per first-seen length where the GPU would."""
        return self.attention_backend in PLAN_BUILDING_BACKENDS


def block_kernels(spec: TrainingSpec, seq_len: int) -> float:
    """Kernels one block launches per micro-batch (forward and backward), traced: the step traced with two blocks
    less the step with one (blocks are identical; the rest of the step is the same in both)."""

    def with_blocks(n: int) -> TrainingSpec:
        config = copy.deepcopy(spec.model_config)
        config.n_layer = n
        return dataclasses.replace(spec, model_config=config)

    one, two = (traced_ops(with_blocks(n), seq_len).kernels_per_micro_batch() for n in (1, 2))
    return two - one


def launches_saved(spec: TrainingSpec, seq_len: int, levers: Levers) -> tuple[float, str]:
    """(kernel launches per micro-batch the levers take off the host, a note saying how), (0, "") without
    compiled blocks. The blocks' traced launches shrink by the measured factor, or with CUDA graphs to two replays
    a block; the count of blocks' launches does not depend on the length, so one figure serves every micro-batch."""
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
