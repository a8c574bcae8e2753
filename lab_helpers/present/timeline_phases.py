"""Where a run's timeline splits into load, training loop and teardown, and when it ran out of memory.

Why: a timeline of GPU utilisation and memory is 25 s of curves; without the phases a student reads the 18 s of
checkpoint loading as "the GPU idles during training", and cannot tell the OOM moment from the teardown after it.
The loop's window comes from the record (``loop_window_s``: the timed loop on the timeline's clock, from
``time_bound``); records written before that field have no phases, and the figure says so rather than guess.
The OOM moment is read off the timeline: the first sample at which GPU memory used reached its peak (within
``OOM_PEAK_SHARE``), since PyTorch's allocator keeps what it holds until the process exits -- so it is as
precise as the sampling interval (100-200 ms), and the label says it is the sample, not the allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from lab_helpers.config.iteration_times import finite_number

OOM_PEAK_SHARE = 0.98
"""A sample within this share of the run's highest GPU memory used counts as "at the peak" (NVML's reading
steps by whole allocator segments: the peak sample and its neighbours differ by a few hundred MiB)."""

LOAD, LOOP, TEARDOWN = "load + warm-up", "timed loop", "teardown"


def phases(record: Mapping[str, Any], frame: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(name, start_s, end_s) of load + warm-up, the timed loop and teardown on the timeline's clock; [] when the
    record has no ``loop_window_s`` (older records, a run that failed before its loop ended)."""
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
    """Seconds since launch of the first timeline sample at the OOM'd run's GPU memory peak; None for a run that
    did not run out of memory or a timeline without GPU memory."""
    if record.get("status") != "oom":
        return None
    rows = frame[frame["gpu"].notna() & frame["mem_used_gib"].notna()]
    if rows.empty:
        return None
    peak = rows["mem_used_gib"].max()
    at_peak = rows[rows["mem_used_gib"] >= OOM_PEAK_SHARE * peak]
    return float(at_peak["t_s"].min())
