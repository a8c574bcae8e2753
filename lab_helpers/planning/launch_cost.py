"""Measure this node's host cost per kernel launch for the time model (``python -m lab_helpers launch-cost``).

On the lab's GPU records one host core runs flat out while the GPU idles, so a micro-batch takes kernels launched x
a per-launch cost set by the node's CPU, Python and torch build, not its GPU. Measured on the path the model counts:
a tiny litgpt model's whole training step, so small that the device never makes the host wait, its kernels counted
by ``op_costs.op_cost``; the best of ``REPEATS``. A bare ``x.add_(1)`` loop would leave out autograd, module calls and
the allocator and read several times lower. Kept in ``$LAB_RESULTS/launch_cost.json``; where it was not measured,
the planner fits it to the GPU records and says so.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "launch_cost.json"
STEPS = 20  # timed training steps per repeat: ~4,000 launches on the tiny model
REPEATS = 3
WARMUP = 3


@dataclass(frozen=True)
class LaunchCostResult:
    host: str
    device_name: str
    launch_cost_s: float
    kernels_per_step: float
    steps: int
    torch_version: str
    measured_at: str

    def lines(self) -> list[str]:
        return [
            f"per-launch host cost on {self.device_name} ({self.host}, torch {self.torch_version}): "
            f"{self.launch_cost_s * 1e6:.1f} us",
            f"  {self.steps} training steps of a tiny litgpt model, {self.kernels_per_step:.0f} kernels each "
            "(counted as the planner counts them), best of "
            f"{REPEATS}",
            "  plan --time uses it on this node: host time per micro-batch = kernels traced x this cost",
        ]


def _tiny_model(device: Any):
    import torch
    from litgpt import GPT, Config

    config = Config(
        name="launch-cost",
        block_size=64,
        vocab_size=128,
        padded_vocab_size=128,
        n_layer=2,
        n_head=4,
        n_query_groups=4,
        n_embd=64,
        intermediate_size=172,
        mlp_class_name="LLaMAMLP",
        norm_class_name="RMSNorm",
        bias=False,
        parallel_residual=False,
        rotary_percentage=1.0,
    )
    with torch.device(device):
        model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer


def measure(*, device: str | None = None, steps: int = STEPS) -> LaunchCostResult:
    import torch
    from litgpt.utils import chunked_cross_entropy

    from lab_helpers.planning.planner._compat import dispatch_mode_base
    from lab_helpers.planning.planner.op_costs import op_cost

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # tiny tensors: more threads only add their hand-offs (one core runs the host)
    try:
        return _measure(device, steps, chunked_cross_entropy, op_cost, dispatch_mode_base)
    finally:
        torch.set_num_threads(threads)


def _measure(device: str, steps: int, chunked_cross_entropy, op_cost, dispatch_mode_base) -> LaunchCostResult:
    import torch

    model, optimizer = _tiny_model(device)
    tokens = torch.randint(0, 128, (2, 33), device=device)

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = chunked_cross_entropy(logits, tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(WARMUP):
        step()
    sync()
    counted = [0.0]

    class _Count(dispatch_mode_base()):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            cost = op_cost(func, args, kwargs, out)
            if cost is not None:
                counted[0] += cost.kernels
            return out

    with _Count():
        step()
    sync()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        best = min(best, (time.perf_counter() - start) / steps)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return LaunchCostResult(
        host=platform.node(),
        device_name=name,
        launch_cost_s=best / counted[0],
        kernels_per_step=counted[0],
        steps=steps,
        torch_version=torch.__version__,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


# ----------------------------------------------------------------------------------------------- the record


def launch_cost_path() -> Path:
    from lab_helpers.config.paths import results_dir

    return results_dir() / FILE_NAME


def save(result: LaunchCostResult, path: Path | None = None) -> Path:
    """The latest measurement per (host, device), as ``bandwidth`` keeps its own."""
    from lab_helpers.hardware.bandwidth import keep_per_node

    return keep_per_node(result, path or launch_cost_path())


def measured_launch_cost(device_name: str | None, path: Path | None = None) -> tuple[float | None, str | None]:
    """(None, None) where nothing was measured on this host; ``device_name`` None is this node's GPU."""
    from lab_helpers.hardware.bandwidth import this_hosts_entries

    for entry in this_hosts_entries(path or launch_cost_path()):
        same = entry.get("device_name") == device_name if device_name is not None else entry.get("device_name") != "cpu"
        cost = entry.get("launch_cost_s")
        if same and isinstance(cost, (int, float)) and cost > 0:
            return float(
                cost
            ), f"measured on this node {entry.get('measured_at', '')} (python -m lab_helpers launch-cost)"
    return None, None


NOT_MEASURED = (
    "not measured on this node (python -m lab_helpers launch-cost measures it in seconds): plan --time fits it to the "
    "lab's GPU records of this GPU, else of the H100, and says which"
)
