"""``--trace-steps N`` inside litgpt's loop: where the ``StepTracer``'s window sits.

Quick mode profiles the steps after its timing ends, so that a profiled quick run times the same micro-batches as an
unprofiled one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lab_helpers.training.torch_trace import DIR_ENV, StepTracer


class TraceHook:
    def __init__(self, steps: int | None) -> None:
        self.steps = steps  # --trace-steps N (torch_trace.steps_from_env), None: off
        self.profiler: StepTracer | None = None
        self.fields: dict[str, Any] = {}  # filled by ``finish``

    def start_loop(self, *, accumulation: int, warmup_iterations: int, quick: bool) -> None:
        if not self.steps:
            return
        out_dir = Path(os.environ.get(DIR_ENV) or "profile")
        first_iter = None if quick else warmup_iterations + 1
        self.profiler = StepTracer(self.steps, accumulation=accumulation, first_iter=first_iter, out_dir=out_dir)

    def at_batch(self, iteration: int) -> None:
        if self.profiler is not None:
            self.profiler.at_batch(iteration)

    @property
    def waits_for_timing_end(self) -> bool:
        return self.profiler is not None and self.profiler.first_iter is None

    def profiled_iters(self) -> range:
        """Left out of every time figure, with the micro-batch that stops the profiler."""
        if self.profiler is None or self.profiler.first_iter is None:
            return range(0)
        return range(self.profiler.first_iter, self.profiler.last_iter + 2)

    @property
    def last_iter(self) -> int:
        return self.profiler.last_iter

    def begin_at(self, first_iter: int) -> None:
        self.profiler.begin_at(first_iter)

    def stop_after_window(self) -> None:
        self.profiler.stop_after_window()

    def finish(self) -> None:
        """After the clock stopped: writing the trace is not training time."""
        if self.profiler is not None:
            self.fields = self.profiler.finish()
