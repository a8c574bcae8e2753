"""Each run's wall-clock limit, so that a run hung outside a collective cannot block ``run-all`` forever.

A rank stuck in a collective ends at the collective's timeout, but a dead data loader or a stuck file system
never ends. The limit is generous -- a slow run must never be cut -- and comes from the recipe: an allowance
for loading (checkpoint, data, DeepSpeed op builds) plus an allowance per micro-batch the run will do. The
planner predicts memory, not time, so there is no predicted step time to scale instead. A run whose
step count the recipe leaves open gets the profile's whole allowance. ``time_limit_s=`` (``--time-limit``)
or ``$LAB_TIME_LIMIT_S`` override it; 0 means no limit.
"""

from __future__ import annotations

import os
import threading

TIME_LIMIT_ENV = "LAB_TIME_LIMIT_S"
STARTUP_ALLOWANCE_S = {"ci": 300.0, "gpu": 1800.0}
PER_ITERATION_S = {"ci": 30.0, "gpu": 120.0}
OPEN_ENDED_RUN_S = {"ci": 1800.0, "gpu": 3 * 3600.0}  # a lease is 2-3 h


def time_limit_s(profile: str, total_iterations: int | None, override: float | None = None) -> float | None:
    """Seconds the run may take, or None for no limit (``override`` or ``$LAB_TIME_LIMIT_S`` of 0)."""
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
"""The longest limit accepted: a year, well inside what the timer can wait (``threading.TIMEOUT_MAX``); a longer
one used to overflow the timer's thread and leave the run unlimited while its record said otherwise."""


def parse_time_limit(text: str | float, *, source: str = "--time-limit") -> float:
    """A number of seconds (0: no limit) the timer can hold; anything else is one clear line."""
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
