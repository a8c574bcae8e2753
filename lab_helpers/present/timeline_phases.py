"""Where a run's timeline splits into load, loop and teardown, and when it ran out of memory: without the phases a
student reads 18 s of checkpoint loading as "the GPU idles during training". The OOM moment is the first sample at
the memory peak (the allocator keeps what it holds until exit), so it is as precise as the sampling interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from lab_helpers.config.iteration_times import finite_number

OOM_PEAK_SHARE = 0.98
"""NVML's reading steps by whole allocator segments: the peak sample's neighbours differ by a few hundred MiB."""

LOAD, LOOP, TEARDOWN = "load + warm-up", "timed loop", "teardown"


def phases(record: Mapping[str, Any], frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    """[] without ``loop_window_s`` (older records, a run that failed before its loop ended)."""
    window = record.get("loop_window_s")
    if not isinstance(window, list | tuple) or len(window) != 2:
        return []
    start, end = (finite_number(v) for v in window)
    times = pd.to_numeric(frame["t_s"], errors="coerce").dropna()
    if start is None or end is None or end <= start or times.empty:
        return []
    first, last = float(times.min()), float(times.max())
    spans = [(LOAD, first, start), (LOOP, start, end), (TEARDOWN, end, max(last, end))]
    return [(name, a, b) for name, a, b in spans if b > a]


def oom_moment_s(record: Mapping[str, Any], frame: pd.DataFrame) -> float | None:
    if record.get("status") != "oom":
        return None
    rows = frame[frame["gpu"].notna() & frame["mem_used_gib"].notna()]
    if rows.empty:
        return None
    peak = rows["mem_used_gib"].max()
    at_peak = rows[rows["mem_used_gib"] >= OOM_PEAK_SHARE * peak]
    return float(at_peak["t_s"].min())
