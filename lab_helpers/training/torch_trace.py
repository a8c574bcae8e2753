"""``--trace-steps N``: a torch.profiler trace of N steady optimizer steps, and what it says in short.

On the H100 the small runs kept the GPU 5-25 % busy; only a trace tells whether the host was launching kernels one by
one, synchronising, or waiting on data. The profiler slows what it watches, so its iterations are left out of every
time figure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab_helpers.config.paths import write_lab_file

STEPS_ENV = "LAB_TRACE_STEPS"
DIR_ENV = "LAB_TRACE_DIR"

TRACE_FILENAME = "trace.json"
SUMMARY_FILENAME = "summary.json"
TOP_OPS = 10

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})  # kineto's names of work on the GPU

COLLECTIVE_KERNEL_MARK = "nccl"
"""NVML counts collectives as busy, so only a trace separates communication from compute."""


def steps_from_env() -> int | None:
    value = os.environ.get(STEPS_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


MAX_TRACE_STEPS = 20
"""A step's trace is tens of MB on a GPU and the summary is per step: more steps add size and time, not knowledge."""


def check_steps(steps: Any) -> int | None:
    """None/0 is off; 10**18 was accepted and recorded, so the count is bounded too."""
    if steps is None or steps == 0:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"trace_steps must be a positive whole number of optimizer steps; got {steps!r}")
    if steps > MAX_TRACE_STEPS:
        raise ValueError(f"trace_steps is at most {MAX_TRACE_STEPS} (each adds a step and tens of MB of trace); "
                         f"got {steps}, e.g. --trace-steps 3")  # fmt: skip
    return steps


def _union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Overlapping work (threads, streams) counted once."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def summarize(
    trace_events: Sequence[Mapping[str, Any]], *, wall_s: float, steps: int, top_ops: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``ts``/``dur`` are in microseconds; ``wall_s`` is measured around the profiler, not read from the trace."""
    if steps < 1 or wall_s <= 0:
        raise ValueError(f"need steps >= 1 and wall_s > 0; got {steps}, {wall_s}")
    complete = [e for e in trace_events if e.get("ph") == "X" and "ts" in e and "dur" in e]

    def spans(categories: Iterable[str]) -> list[tuple[float, float]]:
        wanted = set(categories)
        return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in complete if e.get("cat") in wanted]

    device_spans = spans(DEVICE_CATEGORIES)
    host_s = _union_s(spans({"cpu_op"})) / 1e6
    kernels = sum(1 for e in complete if e.get("cat") == "kernel")
    ops = sum(1 for e in complete if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::"))
    device_s = _union_s(device_spans) / 1e6 if device_spans else None
    collectives = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in complete
        if e.get("cat") == "kernel" and COLLECTIVE_KERNEL_MARK in str(e.get("name", "")).lower()
    ]  # fmt: skip
    collective_s = _union_s(collectives) / 1e6 if device_spans else None
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall_s / steps,
        "host_op_ms_per_step": 1e3 * host_s / steps,
        "device_busy_ms_per_step": None if device_s is None else 1e3 * device_s / steps,
        "device_idle_pct": None if device_s is None else max(0.0, 100 * (1 - device_s / wall_s)),
        "collective_ms_per_step": None if collective_s is None else 1e3 * collective_s / steps,
        # the share of the device's busy time spent in collective kernels (time_bound: ``communication``)
        "collective_pct": 100 * collective_s / device_s if collective_s is not None and device_s else None,
        "aten_ops_per_step": ops / steps,
        "kernels_per_step": kernels / steps if device_spans else None,
        "top_ops_by": "device time" if device_spans else "CPU time (no GPU: the host's ops are the computation)",
        "top_ops": list(top_ops),
    }


def top_ops_from(key_averages: Iterable[Any], *, steps: int, by_device: bool, limit: int = TOP_OPS) -> list[dict]:
    """From ``key_averages()``: torch attributes each kernel to the op that launched it."""
    rows = []
    for event in key_averages:
        device_us = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
        cpu_us = float(getattr(event, "self_cpu_time_total", 0.0) or 0.0)
        rows.append({
            "name": str(event.key),
            "calls_per_step": event.count / steps,
            "self_device_ms_per_step": device_us / 1e3 / steps if by_device else None,
            "self_cpu_ms_per_step": cpu_us / 1e3 / steps,
        })  # fmt: skip
    key = "self_device_ms_per_step" if by_device else "self_cpu_ms_per_step"
    rows.sort(key=lambda row: row[key] or 0.0, reverse=True)
    return [row for row in rows if (row[key] or 0.0) > 0][:limit]


def summary_lines(summary: Mapping[str, Any]) -> list[str]:

    def ms(value: Any) -> str:
        return "n/a" if value is None else f"{value:.1f} ms"

    idle = summary.get("device_idle_pct")
    kernels = summary.get("kernels_per_step")
    lines = [
        f"per optimizer step ({summary['steps']} profiled): wall {ms(summary['wall_ms_per_step'])}, host inside "
        f"PyTorch ops {ms(summary['host_op_ms_per_step'])}, device busy {ms(summary['device_busy_ms_per_step'])}"
        + ("" if idle is None else f" (device idle {idle:.0f} %)"),
        f"ops per step {summary['aten_ops_per_step']:.0f} (aten), kernels launched per step "
        + ("n/a (no GPU)" if kernels is None else f"{kernels:.0f}"),
        f"top ops by {summary['top_ops_by']}:",
    ]
    device = summary["top_ops_by"] == "device time"
    for op in summary.get("top_ops", []):
        value = op["self_device_ms_per_step"] if device else op["self_cpu_ms_per_step"]
        lines.append(f"  {value:9.2f} ms  {op['calls_per_step']:7.1f} calls  {op['name']}")
    return lines


class StepTracer:
    """The micro-batch that stops the profiler pays for stopping it, so it is reported as profiled too. Writing the
    trace waits for ``finish``, after the loop's clock has stopped."""

    def __init__(self, steps: int, *, accumulation: int, first_iter: int | None, out_dir: Path) -> None:
        self.steps, self.accumulation, self.out_dir = steps, accumulation, out_dir
        self.first_iter: int | None = None
        self._last_iter = 0
        self._profiler = None
        self._t0 = self._t1 = None
        self._stopped_at: int | None = None
        self._last_seen = 0  # the last micro-batch the loop drew
        if first_iter is not None:
            self.begin_at(first_iter)

    def begin_at(self, first_iter: int) -> None:
        self.first_iter, self._last_iter = first_iter, first_iter + self.steps * self.accumulation - 1

    @property
    def last_iter(self) -> int:
        return self._last_iter

    def stop_after_window(self) -> None:
        self._stop(self._last_iter + 1)

    def at_batch(self, iteration: int) -> None:
        self._last_seen = iteration
        if self.first_iter is None:
            return
        if iteration == self.first_iter and self._profiler is None:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(activities=activities, record_shapes=False, with_stack=False)
            self._profiler.__enter__()
            self._t0 = time.perf_counter()
        elif iteration == self._last_iter + 1 and self._stopped_at is None:
            self._stop(iteration)

    def _stop(self, iteration: int | None) -> None:
        if self._profiler is None or self._stopped_at is not None:
            return
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the window ends when the device's work of the profiled steps has
        self._t1 = time.perf_counter()
        self._profiler.__exit__(None, None, None)
        # the loop ended (iteration None): the window ends after the last micro-batch it drew
        self._stopped_at = iteration if iteration is not None else min(self._last_seen, self._last_iter) + 1

    def finish(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"torch_profile_steps": self.steps}
        if self._profiler is None:
            where = "its timing did" if self.first_iter is None else f"micro-batch {self.first_iter}"
            print(f"lab: --trace-steps {self.steps}: the loop ended before {where}; no trace", flush=True)
            return fields
        self._stop(None)
        captured_steps = max(1, (min(self._stopped_at, self._last_iter + 1) - self.first_iter) // self.accumulation)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace_path = self.out_dir / TRACE_FILENAME
        self._profiler.export_chrome_trace(str(trace_path))
        events = json.loads(trace_path.read_text()).get("traceEvents", [])
        on_device = any(e.get("cat") in DEVICE_CATEGORIES for e in events)
        top = top_ops_from(self._profiler.key_averages(), steps=captured_steps, by_device=on_device)
        summary = summarize(events, wall_s=self._t1 - self._t0, steps=captured_steps, top_ops=top)
        write_lab_file(self.out_dir / SUMMARY_FILENAME, json.dumps(summary, indent=1).encode())
        print(f"lab: torch.profiler trace of {captured_steps} steady optimizer step(s): {trace_path}", flush=True)
        for line in summary_lines(summary):
            print(f"lab: {line}", flush=True)
        return {
            **fields,
            "torch_profile_iters": [self.first_iter, self._stopped_at],
            "torch_profile_trace_path": str(trace_path),
            "torch_profile_summary": summary,
        }
