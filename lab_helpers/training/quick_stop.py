"""Quick mode's stop inside litgpt's loop: at each optimizer step's end after warm-up, whether the loop ends there.

Why its own module: ``quick_mode.stop_reason`` is the rule over a list of iteration times; this part asks it at the
right moments with the loop clock's times (``loop_clock``), says why the timing ended, and, with
``--profile-steps``, lets the profiled steps run after the timing (``profile_hook``) before the loop ends. A
length-grouped run (``--batch-order length-grouped``) is never ``stable`` by the rule: its micro-batches differ in
length by design, so only the rule's caps or the run's end stop it. In full mode it never stops the loop and reports
``quick_stop`` None.
"""

from __future__ import annotations

import time
from typing import Any

from lab_helpers.training.loop_clock import LoopClock
from lab_helpers.training.profile_hook import ProfileHook
from lab_helpers.training.quick_mode import stable_halves_pct, stop_reason


class QuickStop:
    """What ended a quick run's timing (``reason``, ``halves_pct``), decided from the clock's iteration times."""

    def __init__(self, clock: LoopClock, profile: ProfileHook) -> None:
        self.clock, self.profile = clock, profile
        self.quick = False
        self.accumulation = 1
        self.train_args: Any = None  # litgpt's TrainArgs: its max_steps says where the recipe's own steps end
        self.judge_stable = True  # False for a length-grouped run: only the rule's caps or the run's end stop it
        self.reason: str | None = None  # quick_mode.stop_reason's verdict, or "run_end"
        self.halves_pct: float | None = None

    def start_loop(self, *, quick: bool, accumulation: int, train_args: Any, judge_stable: bool = True) -> None:
        """litgpt's loop settings, known once it builds its dataloaders; ``judge_stable`` False for micro-batches
        that differ in length by design (length-grouped)."""
        self.quick, self.accumulation, self.train_args = quick, accumulation, train_args
        self.judge_stable = judge_stable

    def should_stop(self) -> bool:
        """Quick mode, at an optimizer step's end after warm-up: whether the loop ends here. The stopping rule ends
        the timing; with ``--profile-steps`` the profiled steps follow it, left out of every time figure, and the
        loop ends after them."""
        drawn = len(self.clock.batch_starts)
        done = drawn - self.clock.warmup_iterations
        if not self.quick or done <= 0 or done % self.accumulation:
            return False
        if self.reason is not None:  # only profiled steps run after the timing: end after their window
            if self.clock.timing_ended is None or drawn < self.profile.last_iter:
                return False
            self.profile.stop_after_window()
            self.clock.exclude_since_timing_end()
            return True
        times = self.clock.rule_times_s(time.perf_counter(), left_out=self.profile.profiled_iters())
        reason = stop_reason(times, stable_pct=self._stable_pct()) or ("run_end" if self._own_steps_done() else None)
        if reason is None:
            return False
        self._say_stop(reason, times)
        if not self.profile.waits_for_timing_end:
            return True
        self.clock.end_timing()  # the loop window (host_core_pct, gpu_busy_pct) ends with the timing
        self.profile.begin_at(drawn + 1)
        return False

    def _own_steps_done(self) -> bool:
        """A profiled quick run whose rule has not ended the timing: whether the recipe's own steps are done, so that
        the steps the launcher added for the profile (``lab.settled_overrides``: N + 1) are profiled now."""
        if not self.profile.waits_for_timing_end or self.train_args is None:
            return False
        max_steps = getattr(self.train_args, "max_steps", None)
        if not max_steps:
            return False  # a run by epochs ends with its data: no room was made for the profile
        return len(self.clock.batch_starts) >= (max_steps - self.profile.steps - 1) * self.accumulation

    def _stable_pct(self) -> float | None:
        """The rule's ``stable`` agreement; None (never stable) for micro-batches that differ in length by design."""
        return stable_halves_pct() if self.judge_stable else None

    def _say_stop(self, reason: str, times: list[float]) -> None:
        from lab_helpers.config.iteration_times import iteration_stats

        self.reason, self.halves_pct = reason, iteration_stats(times)["iter_halves_pct"]
        halves = "n/a" if self.halves_pct is None else f"{self.halves_pct:.1f}%"
        rule = f"stable within {stable_halves_pct():g}%" if self.judge_stable else "length-grouped: no stable rule"
        print(f"lab: quick mode: timing ends ({reason}) after {len(times)} timed micro-batches, "
              f"{sum(times):.1f} s; medians of the two halves {halves} apart ({rule})", flush=True)  # fmt: skip

    def fields(self) -> dict[str, Any]:
        """``quick_stop`` and ``quick_stop_halves_pct`` for the report: what ended a quick run's timing (None in full
        mode). A run whose own steps or data ended before the rule stopped it is judged once more at its end: the
        rule's verdict on all its timed iterations, else ``run_end``."""
        if not self.quick:
            return {"quick_stop": None, "quick_stop_halves_pct": None}
        if self.reason is None:
            clock = self.clock
            times = clock.rule_times_s(clock.fit_end, left_out=self.profile.profiled_iters()) if clock.steady else []
            self._say_stop(stop_reason(times, stable_pct=self._stable_pct()) or "run_end", times)
        return {"quick_stop": self.reason, "quick_stop_halves_pct": self.halves_pct}
