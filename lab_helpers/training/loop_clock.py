"""The training loop's clock: seconds inside litgpt's ``fit`` minus validation, with warm-up timed apart.

Warm-up (kernel selection, allocator growth, optimizer states being created) is the first optimizer step. The clock
is told of each batch as litgpt draws it, so it needs nothing else from litgpt's loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any


class LoopClock:
    """``process_time`` at each mark counts every thread, the autograd engine's included (``host_core_pct``)."""

    def __init__(self) -> None:
        self.fit_start: float | None = None
        self.fit_end: float | None = None
        self.excluded: list[tuple[float, float]] = []  # (perf_counter start, end) of validation and the like
        self.excluded_cpu_s: list[tuple[float, float]] = []  # (perf_counter start, process seconds) of the same
        self.batch_starts: list[float] = []  # when each trained batch was asked for
        self.seq_lens: list[int] = []  # each trained batch's padded length: which met a length first (length_split)
        self.warmup_iterations = 0  # micro-batches of the warm-up steps, from the recipe
        self.warmup_tokens = [0, 0]  # (tokens, padded tokens) of the warm-up batches
        self.cpu_s: dict[str, float] = {}  # process_time at each mark
        self.monotonic_s: dict[str, float] = {}  # time.monotonic at each mark
        self.token_counts: dict[str, Any] = {}  # what litgpt's fit returned
        # quick mode with --trace-steps: (perf_counter, process_time) when the timing ended and the profiled steps
        # began, and the tokens and padded tokens of those steps (left out of the timed part like warm-up's)
        self.timing_ended: tuple[float, float] | None = None
        self.after_timing_tokens = [0, 0]

    def start_loop(self, *, warmup_iterations: int) -> None:
        self.warmup_iterations = warmup_iterations

    def start_fit(self) -> None:
        self._mark("fit_start")
        self.fit_start = time.perf_counter()
        self.excluded.clear()

    def end_fit(self, result: Mapping[str, Any] | None) -> None:
        self._mark("end")
        self.fit_end = time.perf_counter()
        self.token_counts = dict(result or {})

    def wrap_excluded(self, function: Callable) -> Callable:

        def timed(*args, **kwargs):
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self._exclude_since(start, cpu_start)

        return timed

    def start_batch(self) -> int:
        self.batch_starts.append(time.perf_counter())
        if len(self.batch_starts) == self.warmup_iterations + 1:
            self._mark("steady_start")
        return len(self.batch_starts)

    def count_untimed_tokens(self, batch: Mapping[str, Any]) -> None:
        """The length is kept for warm-up's batches too: a length met in warm-up is no longer new."""
        self.seq_lens.append(int(batch["input_ids"].shape[-1]))
        untimed = self.warmup_tokens if len(self.batch_starts) <= self.warmup_iterations else None
        if self.timing_ended is not None:  # quick mode's profiled steps after its timing ended
            untimed = self.after_timing_tokens
        if untimed is not None:  # the batch is still on the host: no device sync
            untimed[0] += int(batch["token_counts"]["raw_plus_prompt_template"].sum().item())
            untimed[1] += int(batch["input_ids"].numel())

    def end_timing(self) -> None:
        self._mark("timing_end")
        self.timing_ended = (time.perf_counter(), time.process_time())

    def exclude_since_timing_end(self) -> None:
        began, cpu_began = self.timing_ended
        self._exclude_since(began, cpu_began)

    def _exclude_since(self, began: float, cpu_began: float) -> None:
        self.excluded.append((began, time.perf_counter()))
        self.excluded_cpu_s.append((began, time.process_time() - cpu_began))

    def excluded_between(self, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.excluded)

    def _mark(self, name: str) -> None:
        self.cpu_s[name], self.monotonic_s[name] = time.process_time(), time.monotonic()

    def rule_times_s(self, now: float, *, left_out: range = range(0)) -> list[float]:
        starts = [*self.batch_starts[self.warmup_iterations :], now]
        return [
            b - a - self.excluded_between(a, b)
            for number, (a, b) in enumerate(zip(starts, starts[1:], strict=False), start=self.warmup_iterations + 1)
            if number not in left_out
        ]

    @property
    def steady(self) -> bool:
        return self.fit_end is not None and len(self.batch_starts) > self.warmup_iterations > 0


def host_fields(clock: LoopClock) -> dict[str, Any]:
    start = "steady_start" if clock.steady and "steady_start" in clock.cpu_s else "fit_start"
    end = "timing_end" if "timing_end" in clock.cpu_s else "end"  # quick mode's profiled steps come after it
    if start not in clock.cpu_s or "end" not in clock.cpu_s or clock.fit_start is None:
        return {"host_core_pct": None, "loop_monotonic_s": None}
    start_perf = clock.batch_starts[clock.warmup_iterations] if start == "steady_start" else clock.fit_start
    end_perf = clock.timing_ended[0] if clock.timing_ended is not None else clock.fit_end
    wall_s = clock.monotonic_s[end] - clock.monotonic_s[start] - clock.excluded_between(start_perf, end_perf)
    cpu_s = clock.cpu_s[end] - clock.cpu_s[start]
    cpu_s -= sum(spent for began, spent in clock.excluded_cpu_s if start_perf <= began < end_perf)
    return {
        "host_core_pct": 100 * cpu_s / wall_s if wall_s > 0 else None,
        "loop_monotonic_s": [clock.monotonic_s[start], clock.monotonic_s[end]],
    }


def timings(clock: LoopClock) -> dict[str, Any]:
    tokens = clock.token_counts.get("raw_tokens_plus_prompt_template")
    padded = clock.token_counts.get("raw_tokens_plus_prompt_template_and_padding")
    if clock.fit_end is None or clock.fit_start is None:
        return {"train_s": None, "tokens": tokens, "tokens_padded": padded, "seq_lens": clock.seq_lens or None}
    if not clock.steady:
        return {
            "train_s": clock.fit_end - clock.fit_start - clock.excluded_between(clock.fit_start, clock.fit_end),
            "warmup_iterations": 0,
            "iterations": len(clock.batch_starts) or None,
            "tokens": tokens,
            "tokens_padded": padded,
            "seq_lens": clock.seq_lens or None,
        }
    first, steady_start = clock.batch_starts[0], clock.batch_starts[clock.warmup_iterations]
    profiled_after = 0  # quick mode's profiled micro-batches after the timing (their time is excluded already)
    if clock.timing_ended is not None:
        profiled_after = sum(1 for start in clock.batch_starts if start >= clock.timing_ended[0])
    untimed = [w + a for w, a in zip(clock.warmup_tokens, clock.after_timing_tokens, strict=True)]
    end = clock.timing_ended[0] if clock.timing_ended is not None else clock.fit_end
    return {
        "train_s": end - steady_start - clock.excluded_between(steady_start, end),
        "warmup_s": steady_start - first - clock.excluded_between(first, steady_start),
        "warmup_iterations": clock.warmup_iterations,
        "iterations": len(clock.batch_starts) - clock.warmup_iterations - profiled_after,
        "tokens": None if tokens is None else tokens - untimed[0],
        "tokens_padded": None if padded is None else padded - untimed[1],
        "seq_lens": clock.seq_lens or None,
    }
