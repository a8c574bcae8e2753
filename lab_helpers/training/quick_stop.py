"""Quick mode's stop inside litgpt's loop: asks ``quick_mode.stop_reason`` at each optimizer step's end, and lets
the profiled steps (``--trace-steps``) run after the timing before the loop ends.
"""

from __future__ import annotations

import time
from typing import Any

from lab_helpers.training.loop_clock import LoopClock
from lab_helpers.training.quick_mode import stable_halves_pct, stop_reason
from lab_helpers.training.trace_hook import TraceHook


class QuickStop:
    def __init__(self, clock: LoopClock, trace: TraceHook) -> None:
        self.clock, self.trace = clock, trace
        self.quick = False
        self.accumulation = 1
        self.train_args: Any = None  # litgpt's TrainArgs: its max_steps says where the recipe's own steps end
        self.judge_stable = True  # False for a length-grouped run: only the rule's caps or the run's end stop it
        self.reason: str | None = None  # quick_mode.stop_reason's verdict, or "run_end"
        self.halves_pct: float | None = None

    def start_loop(self, *, quick: bool, accumulation: int, train_args: Any, judge_stable: bool = True) -> None:
        self.quick, self.accumulation, self.train_args = quick, accumulation, train_args
        self.judge_stable = judge_stable

    def should_stop(self) -> bool:
        drawn = len(self.clock.batch_starts)
        done = drawn - self.clock.warmup_iterations
        if not self.quick or done <= 0 or done % self.accumulation:
            return False
        if self.reason is not None:  # only profiled steps run after the timing: end after their window
            if self.clock.timing_ended is None or drawn < self.trace.last_iter:
                return False
            self.trace.stop_after_window()
            self.clock.exclude_since_timing_end()
            return True
        times = self.clock.rule_times_s(time.perf_counter(), left_out=self.trace.profiled_iters())
        reason = stop_reason(times, stable_pct=self._stable_pct()) or ("run_end" if self._own_steps_done() else None)
        if reason is None:
            return False
        self._say_stop(reason, times)
        if not self.trace.waits_for_timing_end:
            return True
        self.clock.end_timing()  # the loop window (host_core_pct, gpu_busy_pct) ends with the timing
        self.trace.begin_at(drawn + 1)
        return False

    def _own_steps_done(self) -> bool:
        """So that the steps the launcher added for the profile (``lab.settled_overrides``: N + 1) are profiled now."""
        if not self.trace.waits_for_timing_end or self.train_args is None:
            return False
        max_steps = getattr(self.train_args, "max_steps", None)
        if not max_steps:
            return False  # a run by epochs ends with its data: no room was made for the profile
        return len(self.clock.batch_starts) >= (max_steps - self.trace.steps - 1) * self.accumulation

    def _stable_pct(self) -> float | None:
        return stable_halves_pct() if self.judge_stable else None

    def _say_stop(self, reason: str, times: list[float]) -> None:
        from lab_helpers.config.iteration_times import iteration_stats

        self.reason, self.halves_pct = reason, iteration_stats(times)["iter_halves_pct"]
        halves = "n/a" if self.halves_pct is None else f"{self.halves_pct:.1f}%"
        rule = f"stable within {stable_halves_pct():g}%" if self.judge_stable else "length-grouped: no stable rule"
        print(f"lab: quick mode: timing ends ({reason}) after {len(times)} timed micro-batches, "
              f"{sum(times):.1f} s; medians of the two halves {halves} apart ({rule})", flush=True)  # fmt: skip

    def fields(self) -> dict[str, Any]:
        """A run whose steps or data ended before the rule stopped it is judged once more on all its timed iterations."""
        if not self.quick:
            return {"quick_stop": None, "quick_stop_halves_pct": None}
        if self.reason is None:
            clock = self.clock
            times = clock.rule_times_s(clock.fit_end, left_out=self.trace.profiled_iters()) if clock.steady else []
            self._say_stop(stop_reason(times, stable_pct=self._stable_pct()) or "run_end", times)
        return {"quick_stop": self.reason, "quick_stop_halves_pct": self.halves_pct}
