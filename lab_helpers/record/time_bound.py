"""Where a run's time goes: how busy its GPU was during the training loop, and what limits it (``bound``).

Why: on the H100 the small runs kept the GPU 5-25 % busy while one host core was saturated, and nothing in a
record said so: a student read "bf16 is slower than fp32" where the GPU was simply waiting on Python. Two
figures tell the cases apart, both over the timed loop only (start-up, checkpoint load and teardown would
dilute them):

* ``gpu_busy_pct``: NVML's utilisation (the share of each sample period in which at least one kernel ran)
  averaged over the timeline samples inside the loop. It says whether the GPU had work, not how well the work
  used it (MFU says that).
* ``host_core_pct``: the CPU time of the training process over the loop's wall time (the child measures it),
  100 = one core. Its Python thread and the autograd engine's launch every kernel, one after the other: near
  100 % of one core the host is the bottleneck.

The record layer (``run_record``) calls this with the timeline the sampler wrote (``sampler.TIMELINE_COLUMNS``)
and the loop's window the child reported (``loop_monotonic_s``), shifted to the timeline's clock.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

GPU_BOUND_BUSY_PCT = 80.0
"""At or above this mean NVML utilisation over the loop the GPU had work nearly all the time: ``gpu`` bound."""

HOST_BOUND_CORE_PCT = 80.0
"""At or above this share of one core the training process's host side is (nearly) always busy: ``host``."""

COMMUNICATION_BOUND_PCT = 50.0
"""At or above this share of the device's busy time in collective kernels (a ``--profile-steps`` trace,
``step_profile.summarize``'s ``collective_pct``), a run of several ranks is ``communication`` bound. NVML alone
never says so: it counts a collective kernel waiting on its peers as busy."""

NO_GPU_REASON = "no GPU: this run trained on the CPU, which NVML does not sample"


def loop_window(loop_monotonic_s: Any, timeline_t0_monotonic_s: float | None) -> tuple[float, float] | None:
    """The timed loop as (start, end) in the timeline's ``t_s`` (seconds since the sampler started), or None."""
    if timeline_t0_monotonic_s is None or not isinstance(loop_monotonic_s, list | tuple) or len(loop_monotonic_s) != 2:
        return None
    start, end = (float(v) - timeline_t0_monotonic_s for v in loop_monotonic_s)
    return (start, end) if end > start else None


def read_gpu_utilisation(path: Path) -> list[tuple[float, int, float]]:
    """(t_s, NVML GPU index, util_pct) of every GPU row of a timeline CSV; [] where there is none."""
    rows: list[tuple[float, int, float]] = []
    try:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                try:
                    t_s, gpu, util = float(row["t_s"]), int(row["gpu"]), float(row["util_pct"])
                except (KeyError, TypeError, ValueError):
                    continue  # a host row (no GPU index) or an unreadable reading
                if math.isfinite(util):
                    rows.append((t_s, gpu, util))
    except OSError:
        return []
    return rows


def gpu_busy_pct_per_gpu(
    samples: Iterable[tuple[float, int, float]], window: tuple[float, float]
) -> dict[int, float]:
    """Mean NVML utilisation per GPU index over the samples taken inside ``window`` (timeline seconds)."""
    start, end = window
    inside: dict[int, list[float]] = {}
    for t_s, gpu, util in samples:
        if start <= t_s <= end:
            inside.setdefault(gpu, []).append(util)
    return {gpu: sum(values) / len(values) for gpu, values in inside.items()}


def classify(
    gpu_busy_pct: float | None, host_core_pct: float | None, *, world_size: int, collective_pct: float | None = None
) -> tuple[str | None, str]:
    """(bound, why): ``communication`` only from a profile (several ranks whose collective kernels took at least
    COMMUNICATION_BOUND_PCT of the device's busy time); else ``gpu`` when the GPU was busy >= GPU_BOUND_BUSY_PCT;
    otherwise ``host`` when the training process used >= HOST_BOUND_CORE_PCT of a core, or when there is one
    process (the GPU then waits on the host side: Python, kernel launches, synchronisations, the data loader).
    Several ranks with GPU and host both below their thresholds and no profile: None, since NVML counts
    collective kernels as busy and cannot tell what waited. None where the GPU figure is missing."""
    if gpu_busy_pct is None:
        return None, "no GPU utilisation inside the training loop"
    host = "n/a" if host_core_pct is None else f"{host_core_pct:.0f} %"
    figures = f"GPU busy {gpu_busy_pct:.0f} %, host {host} of a core"
    several = world_size > 1
    if several and collective_pct is not None:
        figures += f", collectives {collective_pct:.0f} % of the device's busy time (profile)"
        if collective_pct >= COMMUNICATION_BOUND_PCT:
            return "communication", f"{figures}: collectives >= {COMMUNICATION_BOUND_PCT:.0f} %"
    unprofiled = several and collective_pct is None
    if gpu_busy_pct >= GPU_BOUND_BUSY_PCT:
        caveat = (
            "; NVML counts collective kernels as busy, so part of it may be communication (a profile tells)"
            if unprofiled else ""
        )  # fmt: skip
        return "gpu", f"{figures}: GPU busy >= {GPU_BOUND_BUSY_PCT:.0f} %{caveat}"
    if host_core_pct is not None and host_core_pct >= HOST_BOUND_CORE_PCT:
        return "host", f"{figures}: GPU busy < {GPU_BOUND_BUSY_PCT:.0f} %, host >= {HOST_BOUND_CORE_PCT:.0f} % of a core"
    if unprofiled:
        return None, (
            f"{figures}: GPU and host both below {GPU_BOUND_BUSY_PCT:.0f} % with {world_size} ranks; NVML cannot tell "
            "what waited (collective kernels count as busy): a profile (--profile-steps) can"
        )
    return "host", f"{figures}: GPU busy < {GPU_BOUND_BUSY_PCT:.0f} % (waits on the host side)"


def where_time_goes(
    report: Mapping[str, Any],
    *,
    timeline_path: Path | None,
    timeline_t0_monotonic_s: float | None,
    gpu_index: int | None,
    world_size: int,
) -> dict[str, Any]:
    """The record's ``gpu_busy_pct``, ``gpu_busy_pct_per_gpu``, ``gpu_busy_reason``, ``bound`` and ``bound_reason``
    for one rank, and ``loop_window_s``: the timed loop on the timeline's clock, on a CPU too (the timeline figure
    marks load, loop and teardown with it). ``gpu_index``: the NVML index of this rank's GPU (None: unknown, or a
    CPU run)."""
    window = loop_window(report.get("loop_monotonic_s"), timeline_t0_monotonic_s)
    loop = None if window is None else [round(window[0], 3), round(window[1], 3)]
    none = {"gpu_busy_pct": None, "gpu_busy_pct_per_gpu": None, "loop_window_s": loop}
    device = str(report.get("device_name") or "")
    if not device or device.startswith("cpu"):
        return {**none, "gpu_busy_reason": NO_GPU_REASON, "bound": None, "bound_reason": NO_GPU_REASON}
    if window is None or timeline_path is None:
        why = "the run reported no timed training loop" if window is None else "no timeline was sampled"
        return {**none, "gpu_busy_reason": why, "bound": None, "bound_reason": why}
    per_gpu = gpu_busy_pct_per_gpu(read_gpu_utilisation(timeline_path), window)
    busy = per_gpu.get(gpu_index) if gpu_index is not None else None
    reason = None
    if busy is None:
        reason = "no NVML utilisation sample of this rank's GPU inside the training loop (a loop shorter than a sample?)"
    profile = report.get("torch_profile_summary")
    collective_pct = profile.get("collective_pct") if isinstance(profile, Mapping) else None
    bound, why = classify(busy, report.get("host_core_pct"), world_size=world_size, collective_pct=collective_pct)
    return {
        **none,
        "gpu_busy_pct": busy,
        "gpu_busy_pct_per_gpu": {str(k): v for k, v in per_gpu.items()} or None,
        "gpu_busy_reason": reason,
        "bound": bound,
        "bound_reason": reason or why,
    }
