"""A record's time figures, derived from its timed iterations rather than ``train_s`` alone, which one slow
iteration inflates: in the first H100 records (reference_results/h100-80gb.jsonl) the first micro-batch of the
longest batch took 1.8 s against a median of 0.24 s, half of that run's ``train_s``.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
from collections.abc import Mapping, Sequence
from typing import Any

ONE_OFF_FACTOR = 3.0
"""Times the median that makes a one-off: in the H100 records steady iterations stay within 1.6x of their median,
while the first micro-batch of the longest batch took 5.9x and 7.6x."""

MIN_TIMED_FOR_ONE_OFFS = 4


def timed_iterations(record: Mapping[str, Any]) -> list[tuple[int, float]]:
    """The iterations ``train_s`` sums, less those a torch.profiler trace covered: the profiler slows them."""
    warmup = finite_number(record.get("warmup_iterations")) or 0
    profiled = record.get("torch_profile_iters")
    first_profiled, last_profiled = profiled if isinstance(profiled, Sequence) and len(profiled) == 2 else (0, -1)
    rows = record.get("per_iteration")
    timed = []
    for row in rows if isinstance(rows, Sequence) and not isinstance(rows, str) else []:
        if not isinstance(row, Mapping):
            continue
        iteration, seconds = finite_number(row.get("iter")), finite_number(row.get("iter_time_s"))
        if iteration is not None and seconds is not None and iteration > warmup:
            if not first_profiled <= iteration <= last_profiled:
                timed.append((int(iteration), seconds))
    return timed


def one_off_iterations(record: Mapping[str, Any]) -> list[dict[str, float]] | None:
    """None with too few timed iterations to have a median to judge against."""
    timed = timed_iterations(record)
    if len(timed) < MIN_TIMED_FOR_ONE_OFFS:
        return None
    median_s = statistics.median(seconds for _, seconds in timed)
    return [
        {"iter": iteration, "iter_time_s": seconds, "median_s": median_s, "excess_s": seconds - median_s}
        for iteration, seconds in timed
        if seconds > ONE_OFF_FACTOR * median_s
    ]


def one_off_excess_s(record: Mapping[str, Any]) -> float | None:
    found = one_off_iterations(record)
    return None if found is None else sum(one["excess_s"] for one in found)


def steady_train_s(record: Mapping[str, Any]) -> float | None:
    """``train_s`` as if every one-off iteration had taken a median iteration's time."""
    train_s = finite_number(record.get("train_s"))
    if train_s is None:
        return None
    excess = one_off_excess_s(record) or 0.0
    return train_s - excess if excess < train_s else train_s


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# ------------------------------------------------------------------------------------------- steady timing

STEADY_TIMING_FIELDS: tuple[str, ...] = (
    "iter_median_s",
    "iter_iqr_s",
    "iter_count",
    "iter_halves_pct",
    "tokens_per_s",
    "tokens_per_s_padded",
    "padding_pct",
    "flops_per_token",
    "mfu",
)


def iteration_stats(seconds: Sequence[float]) -> dict[str, float | int | None]:
    """``iter_halves_pct``, how far the two halves' medians differ, is quick mode's stopping figure."""
    times = [float(s) for s in seconds]
    if not times:
        return {"iter_median_s": None, "iter_iqr_s": None, "iter_count": 0, "iter_halves_pct": None}
    median_s = statistics.median(times)
    iqr_s = None
    if len(times) >= 2:
        q1, _, q3 = statistics.quantiles(times, n=4)
        iqr_s = q3 - q1
    halves_pct = None
    if len(times) >= 4 and median_s > 0:
        half = len(times) // 2
        first, second = statistics.median(times[:half]), statistics.median(times[half:])
        halves_pct = 100 * abs(first - second) / median_s
    return {"iter_median_s": median_s, "iter_iqr_s": iqr_s, "iter_count": len(times), "iter_halves_pct": halves_pct}


def steady_timing(record: Mapping[str, Any], timed: Sequence[tuple[int, float]] | None = None) -> dict[str, Any]:
    """Rates from the median timed iteration, which one slow iteration does not move. MFU counts padded tokens: the
    GPU multiplies the padding too, and ``flops_per_step`` is counted at the mean padded length. A length-grouped
    run's micro-batches differ in length by design, so its rates take the mean micro-batch, the span of its tokens."""
    train_s = finite_number(record.get("train_s"))
    if train_s is None:  # the loop never finished timing (an OOM, a crash in warm-up): no time figures at all
        return {**dict.fromkeys(STEADY_TIMING_FIELDS), "iter_count": 0}
    timed = timed_iterations(record) if timed is None else timed
    stats = iteration_stats([seconds for _, seconds in timed])
    iterations = finite_number(record.get("iterations"))
    median_s = stats["iter_median_s"]
    if median_s is None and train_s and iterations:
        median_s = stats["iter_median_s"] = train_s / iterations  # iter_count 0 says it is no median
    if record.get("batch_order") == "length-grouped" and train_s and iterations:
        median_s = train_s / iterations  # the mean micro-batch: see above
    tokens, padded = finite_number(record.get("tokens")), finite_number(record.get("tokens_padded"))
    flops_per_step, peak = finite_number(record.get("flops_per_step")), finite_number(record.get("gpu_peak_flops"))

    def per_s(count: float | None) -> float | None:
        return count / iterations / median_s if count and iterations and median_s else None

    padded_per_s = per_s(padded)
    flops_per_token = flops_per_step * iterations / padded if flops_per_step and iterations and padded else None
    return {
        **stats,
        "tokens_per_s": per_s(tokens),
        "tokens_per_s_padded": padded_per_s,
        "padding_pct": 100 * (padded - tokens) / padded if padded and tokens is not None else None,
        "flops_per_token": flops_per_token,
        # = tokens_per_s_padded x flops_per_token / peak; written so that it needs no token count
        "mfu": flops_per_step / median_s / peak if flops_per_step and median_s and peak else None,
    }


# ------------------------------------------------------------------------------ steady and first-seen lengths

MIN_STEADY_ITERATIONS = 3

BOOTSTRAP_RESAMPLES = 2000

LENGTH_SPLIT_FIELDS: tuple[str, ...] = (
    "steady_iter_s", "steady_iter_count", "steady_spread_pct", "first_seen_count", "first_seen_extra_s",
    "first_seen_pct", "steady_basis",
)  # fmt: skip


def _centre(values: Sequence[float], *, mean: bool) -> float:
    return statistics.fmean(values) if mean else statistics.median(values)


def interval_95(draws: Sequence[float]) -> tuple[float, float]:
    """The 95 % percentile interval: every bootstrap of the lab cuts its draws here."""
    ordered = sorted(draws)
    return ordered[int(0.025 * len(ordered))], ordered[int(0.975 * len(ordered)) - 1]


def bootstrap_spread_pct(values: Sequence[float], *, mean: bool = False) -> float | None:
    """Half the 95 % bootstrap interval, as % of the median (mean): how far another draw of the same micro-batches
    could move it. Cached, since readers derive it for every record on every load."""
    return _bootstrap_spread_pct(tuple(float(v) for v in values), mean)


@functools.lru_cache(maxsize=4096)
def _bootstrap_spread_pct(values: tuple[float, ...], mean: bool) -> float | None:
    if len(values) < 2:
        return None
    centre = _centre(values, mean=mean)
    if centre <= 0:
        return None
    low, high = interval_95(bootstrap_centres(values, mean=mean))
    return 100 * (high - low) / 2 / centre


def bootstrap_centres(values: Sequence[float], *, mean: bool) -> list[float]:
    """Bit for bit what ``random.Random(0).choices`` and ``statistics`` give, at numpy's speed (the Python loop took
    ~10 ms a record, on every load): numpy's MT19937 in ``Random(0)``'s state draws the same words and doubles."""
    import numpy as np

    data = np.asarray(values, dtype=np.float64)
    n = len(data)
    draw = _random0()
    centres: list[float] = []
    rows = max(1, min(BOOTSTRAP_RESAMPLES, (1 << 20) // n))  # resamples at a time: a few MB whatever n is
    for done in range(0, BOOTSTRAP_RESAMPLES, rows):
        block = min(rows, BOOTSTRAP_RESAMPLES - done)
        resamples = data[np.floor(draw.random_sample(block * n).reshape(block, n) * float(n)).astype(np.intp)]
        if mean:
            centres += [total / n for total in map(math.fsum, resamples.tolist())]
            continue
        resamples.sort(axis=1)
        middle = resamples[:, n // 2] if n % 2 else (resamples[:, n // 2 - 1] + resamples[:, n // 2]) / 2
        centres += middle.tolist()
    return centres


def _random0():
    """A numpy RandomState in the state of ``random.Random(0)``: the same MT19937 words from here on. One object per
    thread, set back to that state on each call (making one seeds it from the OS first: 0.1 ms, once per record)."""
    import random

    import numpy as np

    state = getattr(_RANDOM0, "state", None)
    if state is None:
        _, words, _ = random.Random(0).getstate()
        state = _RANDOM0.state = np.random.RandomState()
        _RANDOM0.start = ("MT19937", np.array(words[:-1], dtype=np.uint32), words[-1])
    state.set_state(_RANDOM0.start)
    return state


_RANDOM0 = threading.local()


def first_seen_iterations(lengths: Sequence[Any]) -> set[int]:
    """The iterations (1-based, as ``per_iteration``'s) whose micro-batch had a length no earlier one had."""
    seen: set[Any] = set()
    first: set[int] = set()
    for iteration, length in enumerate(lengths, start=1):
        if length not in seen:
            first.add(iteration)
        seen.add(length)
    return first


def length_split(record: Mapping[str, Any], timed: Sequence[tuple[int, float]] | None = None) -> dict[str, Any]:
    """Steady time apart from first-seen lengths: a new length can cost a plan build (cuDNN attention, bf16, Hopper:
    100-150 ms) or a recompile, and on the H200 took 2-3x a repeated one, so a short run's median followed its share
    of them. ``steady_basis`` says what the steady time is of, or why there is none: never a silent fallback."""
    timed = timed_iterations(record) if timed is None else timed
    none = dict.fromkeys(LENGTH_SPLIT_FIELDS)
    if not timed:
        return {**none, "steady_basis": "no timed micro-batch"}
    lengths = record.get("seq_lens")
    if not isinstance(lengths, Sequence) or isinstance(lengths, str) or not lengths:
        return {**none, "steady_basis": "lengths not recorded (a record from before seq_lens)"}
    if len(lengths) < max(iteration for iteration, _ in timed):
        return {**none, "steady_basis": f"seq_lens holds {len(lengths)} micro-batches, fewer than the log's"}
    first_seen_at = first_seen_iterations(lengths)
    repeated = [seconds for iteration, seconds in timed if iteration not in first_seen_at]
    new = [seconds for iteration, seconds in timed if iteration in first_seen_at]
    split = {**none, "steady_iter_count": len(repeated), "first_seen_count": len(new)}
    if len(repeated) < MIN_STEADY_ITERATIONS:
        split["steady_basis"] = (
            f"only {len(repeated)} of {len(timed)} timed micro-batches of a length seen before (fewer than "
            f"{MIN_STEADY_ITERATIONS}): no steady time"
        )
        return split
    mean = record.get("batch_order") == "length-grouped"
    steady_s = _centre(repeated, mean=mean)
    extra_s = statistics.median(new) - steady_s if new else 0.0
    timed_s = sum(seconds for _, seconds in timed)
    return {
        **split,
        "steady_iter_s": steady_s,
        "steady_spread_pct": bootstrap_spread_pct(repeated, mean=mean),
        "first_seen_extra_s": extra_s,
        "first_seen_pct": 100 * sum(max(0.0, s - steady_s) for s in new) / timed_s if timed_s > 0 else None,
        "steady_basis": f"{len(repeated)} timed micro-batches of lengths seen before",
    }
