"""Measure one training step's memory over time: the step the planner traces (``tracer.trace_training``), run for
real, to show beside the planner's prediction.

In its own process, so that the notebook's kernel keeps no CUDA context and cached blocks beside the runs that follow.
The CUDA path needs a GPU: the lab's CPU-only CI cannot run it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

CUDA_HISTORY_ENTRIES = 2_000_000  # allocator events kept (a 7B step makes ~10^5)


@dataclass(frozen=True)
class MeasuredTimeline:
    """``total_bytes[i]``: bytes live after event ``i``; ``phases``: (name, kind, first event, last event)."""

    device: str  # "cuda" or "cpu"
    quantity: str  # what the curve counts, in words for the figure
    total_bytes: list[int]
    phases: list[tuple[str, str, int, int]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MeasuredTimeline:
        data = json.loads(text)
        return cls(
            device=data["device"],
            quantity=data["quantity"],
            total_bytes=[int(v) for v in data["total_bytes"]],
            phases=[(str(n), str(k), int(a), int(b)) for n, k, a, b in data["phases"]],
        )


def refusal(spec: Any) -> str | None:
    if spec.method != "full":
        return f"the step is measured for full fine-tuning (this run is {spec.method})"
    if not spec.precision.endswith("-true"):
        return f"the step is measured in a -true precision (this run is {spec.precision})"
    if spec.optimizer not in ("AdamW", "Adam", "SGD"):
        return f"the step is measured with a torch optimizer (this run uses {spec.optimizer})"
    if spec.strategy != "single":
        return f"the step is measured on one device (this run is {spec.strategy})"
    return None


class _Phases:
    def __init__(self, length) -> None:
        self._length = length
        self.opened: list[tuple[str, str, int]] = []

    @contextlib.contextmanager
    def phase(self, name: str, kind: str):
        self.opened.append((name, kind, self._length()))
        yield

    def spans(self, total: int) -> list[tuple[str, str, int, int]]:
        ends = [start - 1 for _, _, start in self.opened[1:]] + [total - 1]
        return [(name, kind, start, end) for (name, kind, start), end in zip(self.opened, ends, strict=True)]


def _run_step(spec: Any, device: str, phases: _Phases, counter: Any = None) -> None:
    import torch
    from litgpt.model import GPT
    from litgpt.utils import chunked_cross_entropy

    from lab_helpers.training.activation_checkpointing import checkpoint_blocks

    dtype = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(spec.precision, torch.float32)
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = GPT(spec.model_config)
    finally:
        torch.set_default_dtype(previous)
    if spec.activation_checkpointing:
        checkpoint_blocks(model)
    with torch.device(device):
        model.max_seq_length = spec.seq_len  # outside the dtype: the RoPE cache in fp32, as litgpt's fit has it
    options = dict(spec.optimizer_kwargs)  # foreach / fused as the recipe gives them; else torch's default here
    if isinstance(options.get("betas"), list):
        options["betas"] = tuple(options["betas"])
    optimizer = getattr(torch.optim, spec.optimizer)(model.parameters(), **options)
    vocab, batch, seq = spec.model_config.padded_vocab_size, spec.micro_batch_size, spec.seq_len
    accumulation = spec.gradient_accumulation_iters
    if counter is not None:
        counter.seed([*model.parameters(), *model.buffers()])
    logits = None
    with counter if counter is not None else contextlib.nullcontext():
        for window in range(2):
            for micro in range(1 if window == 0 else min(accumulation, 2)):
                with phases.phase(f"w{window}m{micro}-forward", "fwd"):
                    ids = torch.randint(0, vocab, (batch, seq), device=device)
                    targets = torch.randint(0, vocab, (batch, seq), device=device)
                    logits = model(ids).float()  # Fabric's output conversion; kept until the next forward
                    loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                with phases.phase(f"w{window}m{micro}-backward", "bwd"):
                    (loss / accumulation).backward()
                    loss = None
            with phases.phase(f"w{window}-step", "step"):
                optimizer.step()
                optimizer.zero_grad()
    del logits


def _measure_cpu(spec: Any) -> MeasuredTimeline:
    from lab_helpers.training.tensor_peak import LiveTensorPeak

    curve: list[int] = []

    class _Curve(LiveTensorPeak):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            curve.append(self.current_bytes)
            return out

    phases = _Phases(lambda: len(curve))
    _run_step(spec, "cpu", phases, _Curve())
    return MeasuredTimeline("cpu", "live tensor bytes after each op (CPU)", curve, phases.spans(len(curve)))


def _measure_cuda(spec: Any) -> MeasuredTimeline:
    import torch

    marks: list[int] = []  # wall clock (us) at each phase start, matched to the history's time_us
    phases = _Phases(lambda: marks.append(time.time_ns() // 1000) or len(marks) - 1)
    torch.cuda.memory._record_memory_history(max_entries=CUDA_HISTORY_ENTRIES)
    try:
        _run_step(spec, "cuda", phases)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    entries = [e for e in snapshot["device_traces"][torch.cuda.current_device()] if e["action"] in ("alloc", "free_completed")]
    curve, live = [], 0
    for entry in entries:
        live += entry["size"] if entry["action"] == "alloc" else -entry["size"]
        curve.append(live)
    starts = [next((i for i, e in enumerate(entries) if e.get("time_us", 0) >= mark), len(entries) - 1) for mark in marks]
    opened = [(name, kind, start) for (name, kind, _), start in zip(phases.opened, starts, strict=True)]
    phases.opened = opened
    quantity = "allocated bytes after each allocator event (torch.cuda.memory._record_memory_history)"
    return MeasuredTimeline("cuda", quantity, curve, phases.spans(len(curve)))


def measure_step(spec: Any) -> MeasuredTimeline:
    import torch

    reason = refusal(spec)
    if reason:
        raise ValueError(reason)
    if torch.cuda.is_available():
        return _measure_cuda(spec)
    return _measure_cpu(spec)


def spec_for_experiment(exp_id: str, profile: str, overrides: dict[str, Any] | None = None):
    import torch

    from lab_helpers.planning.activations_by_hand import experiment_spec

    return experiment_spec(exp_id, profile, overrides, device="cuda" if torch.cuda.is_available() else "cpu")


def main(argv: list[str]) -> int:
    exp_id, profile = argv[0], argv[1]
    overrides = json.loads(argv[2]) if len(argv) > 2 else None
    print(measure_step(spec_for_experiment(exp_id, profile, overrides)).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
