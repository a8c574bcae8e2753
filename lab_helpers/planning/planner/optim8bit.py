"""A memory stand-in for bitsandbytes' 8-bit AdamW: bitsandbytes needs CUDA, so the tracer cannot step it.

Layout from ``Optimizer2State.init_state`` (bitsandbytes 0.4x): a parameter of >= 4096 elements keeps two uint8
moments of its shape plus one fp32 absmax per 256 values each; a smaller one two fp32 moments. The paged variant
puts moments of >= 1e5 elements in CUDA managed memory (outside ``max_memory_allocated``). ``step`` makes the same
allocations once and does no arithmetic.
"""

from __future__ import annotations

import math

import torch

MIN_8BIT_SIZE = 4096  # bnb: parameters smaller than this keep 32-bit states
BLOCKWISE_BLOCK = 256  # bnb: one fp32 absmax per 256 quantized values (block-wise quantization)
PAGED_MIN_NUMEL = 100_000  # bnb get_state_buffer: tensors below 1e5 elements are never paged


def state_bytes(numel: int) -> int:
    if numel < MIN_8BIT_SIZE:
        return 2 * 4 * numel
    return 2 * numel + 2 * 4 * math.ceil(numel / BLOCKWISE_BLOCK)


def bytes_per_param() -> float:
    """Optimizer-state bytes per parameter for a large parameter: 2 x (1 B + 4 B / 256) = 2.03125."""
    return 2 * (1 + 4 / BLOCKWISE_BLOCK)


class AdamW8bitStandIn(torch.optim.Optimizer):
    def __init__(self, params, *, paged: bool = False) -> None:
        super().__init__(params, {})
        self.paged = paged
        self.paged_bytes = 0

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D401 - memory only, no math
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.state[p]:
                    continue
                state = self.state[p]
                state["step"] = 0
                if p.numel() < MIN_8BIT_SIZE:
                    state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                    state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                    continue
                if self.paged and p.numel() >= PAGED_MIN_NUMEL:
                    self.paged_bytes += 2 * p.numel()  # two uint8 moments in managed memory
                else:
                    state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                    state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                blocks = math.ceil(p.numel() / BLOCKWISE_BLOCK)
                state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
