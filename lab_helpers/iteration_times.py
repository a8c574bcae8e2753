"""A record's timed iterations, and the one-offs among them: the raw samples behind its ``train_s``.

Why: ``train_s`` is the sum of the iterations after warm-up, so one slow iteration (a new kernel shape, the
allocator growing to a new peak, a hiccup of the host) inflates it, and ``tokens_per_s`` and ``mfu`` with it, by
more than one run's steady speed differs from another's. In the first H100 records (reference_results/
h100-80gb.jsonl) the first micro-batch of the longest batch took 1.8 s in bf16-true against a median of 0.24 s:
half of that run's ``train_s``. The record keeps every iteration's time (``per_iteration``), so how much of
``train_s`` such one-offs took can be derived from it, once, here: the comparison table shows it
(``lab_helpers.compare``) and the time model fits to the steady time (``lab_helpers.planner.timing``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

ONE_OFF_FACTOR = 3.0
"""A timed iteration is a one-off when it took over this many times its run's median timed iteration. In the H100
records the steady iterations of each run stay within 1.6x of their median, while the first micro-batch of the
longest batch took 5.9x (full-7b) and 7.6x (bf16-true)."""

MIN_TIMED_FOR_ONE_OFFS = 4
"""Fewer timed iterations than this give no median to judge an iteration against: nothing is said (None)."""


def timed_iterations(record: Mapping[str, Any]) -> list[tuple[int, float]]:
    """(iteration, seconds) of each logged iteration after warm-up (``iter > warmup_iterations``): those
    ``train_s`` adds up."""
    warmup = finite_number(record.get("warmup_iterations")) or 0
    rows = record.get("per_iteration")
    timed = []
    for row in rows if isinstance(rows, Sequence) and not isinstance(rows, str) else []:
        if not isinstance(row, Mapping):
            continue
        iteration, seconds = finite_number(row.get("iter")), finite_number(row.get("iter_time_s"))
        if iteration is not None and seconds is not None and iteration > warmup:
            timed.append((int(iteration), seconds))
    return timed


def one_off_iterations(record: Mapping[str, Any]) -> list[dict[str, float]] | None:
    """The timed iterations of one record (one rank) that took over ONE_OFF_FACTOR x the run's median timed one,
    each with ``excess_s``, its time beyond a median iteration. Warm-up iterations are not judged: ``train_s``
    already leaves them out. None when the record has fewer than MIN_TIMED_FOR_ONE_OFFS timed iterations."""
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
    """Seconds of ``train_s`` that one-off iterations took beyond a median iteration: 0.0 for a steady run, None
    when the record has too few timed iterations to tell."""
    found = one_off_iterations(record)
    return None if found is None else sum(one["excess_s"] for one in found)


def steady_train_s(record: Mapping[str, Any]) -> float | None:
    """``train_s`` as if every one-off iteration had taken a median iteration's time; ``train_s`` itself when the
    record cannot tell (too few timed iterations), None without ``train_s``."""
    train_s = finite_number(record.get("train_s"))
    if train_s is None:
        return None
    excess = one_off_excess_s(record) or 0.0
    return train_s - excess if excess < train_s else train_s


def finite_number(value: Any) -> float | None:
    """A finite float, or None for missing / NaN / non-numeric values (never 0)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
