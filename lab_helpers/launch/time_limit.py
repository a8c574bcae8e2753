"""Each run's wall-clock limit, so that a run hung outside a collective (a dead data loader, a stuck file system)
cannot block ``run-all`` forever.

The planner predicts step time (``plan --time``), but the limit is a generous allowance per micro-batch from the
recipe instead: a slow run must never be cut. 0 means no limit.
"""

from __future__ import annotations

import os
import threading

TIME_LIMIT_ENV = "LAB_TIME_LIMIT_S"
STARTUP_ALLOWANCE_S = {"ci": 300.0, "gpu": 1800.0}
PER_ITERATION_S = {"ci": 30.0, "gpu": 120.0}
OPEN_ENDED_RUN_S = {"ci": 1800.0, "gpu": 3 * 3600.0}  # a lease is 2-3 h


def time_limit_s(profile: str, total_iterations: int | None, override: float | None = None) -> float | None:
    if override is None and os.environ.get(TIME_LIMIT_ENV):
        override = parse_time_limit(os.environ[TIME_LIMIT_ENV], source=TIME_LIMIT_ENV)
    if override is not None:
        override = parse_time_limit(override, source="time_limit_s")
        return float(override) if override > 0 else None
    startup = STARTUP_ALLOWANCE_S.get(profile, STARTUP_ALLOWANCE_S["gpu"])
    if not total_iterations:
        return OPEN_ENDED_RUN_S.get(profile, OPEN_ENDED_RUN_S["gpu"])
    return startup + total_iterations * PER_ITERATION_S.get(profile, PER_ITERATION_S["gpu"])


MAX_TIME_LIMIT_S = 365 * 24 * 3600.0
"""A longer one overflows the timer's thread and leaves the run unlimited while its record says otherwise."""


def parse_time_limit(text: str | float, *, source: str = "--time-limit") -> float:
    from lab_helpers.config.experiments import LabConfigError

    try:
        value = float(text)
    except (TypeError, ValueError, OverflowError):
        value = float("nan")
    if not (0 <= value <= min(MAX_TIME_LIMIT_S, threading.TIMEOUT_MAX)):  # NaN fails this too
        raise LabConfigError(
            f"{source}: expected seconds from 0 (no limit) to {MAX_TIME_LIMIT_S:.0f} (a year), e.g. 3600; got {text!r}"
        )
    return value
