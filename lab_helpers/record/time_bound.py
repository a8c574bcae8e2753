"""Where a run's time goes: how busy its GPU was in the timed loop, and what limits it (``bound``). On the H100 the
small runs kept the GPU 5-25 % busy and nothing said so: a student read "bf16 is slower" where the GPU waited on
Python. Judged from the device's side: NVML's utilisation says whether the GPU had work, not how well it used it.
``host_core_pct`` is no evidence: it is 97-100 % in every GPU record, as a thread waiting in a CUDA synchronisation
spins its core.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lab_helpers.config.iteration_times import bootstrap_spread_pct, finite_number
from lab_helpers.config.paths import regular_file_inside

GPU_BOUND_BUSY_PCT = 90.0
"""Idle at most a tenth of the loop: its own work sets the pace, and a faster host gains at most that tenth."""

HOST_BOUND_BUSY_PCT = 50.0
"""Idle at least half the loop, waiting on the host (Python, launches, synchronisations, the data loader)."""

COMMUNICATION_BOUND_PCT = 50.0
"""From a trace only: NVML counts a collective kernel waiting on its peers as busy."""

MIN_BUSY_SAMPLES = 3

BAND_WORDS = {
    "gpu": f">= {GPU_BOUND_BUSY_PCT:.0f} %: the GPU had work nearly all the loop, its own work sets the pace",
    "both": f"between {HOST_BOUND_BUSY_PCT:.0f} and {GPU_BOUND_BUSY_PCT:.0f} %: neither the host nor the GPU alone "
    "sets the pace (the GPU works most of the loop and waits on the host for a share of it)",
    "host": f"<= {HOST_BOUND_BUSY_PCT:.0f} %: the GPU waited at least half the loop on the host side (Python, "
    "kernel launches, synchronisations, the data loader)",
}

NO_GPU_REASON = "no GPU: this run trained on the CPU, which NVML does not sample"


def loop_window(loop_monotonic_s: Any, timeline_t0_monotonic_s: float | None) -> tuple[float, float] | None:
    """The timed loop as (start, end) in the timeline's ``t_s`` (seconds since the sampler started), or None."""
    if timeline_t0_monotonic_s is None or not isinstance(loop_monotonic_s, list | tuple) or len(loop_monotonic_s) != 2:
        return None
    start, end = (float(v) - timeline_t0_monotonic_s for v in loop_monotonic_s)
    return (start, end) if end > start else None


def read_gpu_utilisation(path: Path) -> list[tuple[float, int, float]]:
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
    except (OSError, csv.Error, UnicodeDecodeError):  # a damaged file read on load must not break a table
        return []
    return rows


def loop_samples(samples: Iterable[tuple[float, int, float]], window: tuple[float, float]) -> dict[int, list[float]]:
    start, end = window
    inside: dict[int, list[float]] = {}
    for t_s, gpu, util in samples:
        if start <= t_s <= end:
            inside.setdefault(gpu, []).append(util)
    return inside


def gpu_busy_pct_per_gpu(samples: Iterable[tuple[float, int, float]], window: tuple[float, float]) -> dict[int, float]:
    return {gpu: statistics.fmean(values) for gpu, values in loop_samples(samples, window).items()}


def busy_spread(values: Sequence[float]) -> float | None:
    """A short loop has few 100-200 ms samples and one stall moves their mean: the spread says how far."""
    if len(values) < MIN_BUSY_SAMPLES:
        return None
    mean = statistics.fmean(values)
    spread_pct = bootstrap_spread_pct(values, mean=True)
    return 0.0 if mean <= 0 or spread_pct is None else spread_pct * mean / 100


def band(busy_pct: float) -> str:
    return "gpu" if busy_pct >= GPU_BOUND_BUSY_PCT else "host" if busy_pct <= HOST_BOUND_BUSY_PCT else "both"


def busy_words(busy_pct: float, spread: float | None, samples: int | None) -> str:
    """'GPU busy 76 ± 16 % (13 NVML samples in the loop)'."""
    noise = "" if spread is None else f" ± {spread:.0f}"
    if samples is None:
        return f"GPU busy {busy_pct:.0f}{noise} % over the loop"
    few = "" if spread is not None else ", too few for a noise estimate"
    return f"GPU busy {busy_pct:.0f}{noise} % ({samples} NVML samples in the loop{few})"


def trace_words(trace: Mapping[str, Any]) -> str:
    """A few us per kernel means many short kernels, whose launches the host pays one by one."""
    idle = finite_number(trace.get("device_idle_pct"))
    if idle is None:
        return ""
    words = f"trace: device idle {idle:.0f} % of its {trace.get('steps')} steps"
    kernels, busy_ms = (
        finite_number(trace.get("kernels_per_step")),
        finite_number(trace.get("device_busy_ms_per_step")),
    )
    if kernels and busy_ms:
        words += f", {kernels:,.0f} kernels per step of {1e3 * busy_ms / kernels:.0f} us device time each"
    return f"{words} ({band(100 - idle)} there)"


def classify(
    gpu_busy_pct: float | None,
    spread: float | None = None,
    *,
    world_size: int,
    trace: Mapping[str, Any] | None = None,
    samples: int | None = None,
) -> tuple[str | None, str]:
    """``communication`` only from a trace, else the band of the busy share over the timed loop; ``why`` says where
    a threshold lies inside the noise."""
    trace = trace if isinstance(trace, Mapping) else {}
    idle, collective = finite_number(trace.get("device_idle_pct")), finite_number(trace.get("collective_pct"))
    if gpu_busy_pct is not None:
        figures = busy_words(gpu_busy_pct, spread, samples)
        if words := trace_words(trace):
            figures += f"; {words}"
        busy = gpu_busy_pct
    elif idle is not None:
        figures = f"no NVML sample inside the loop; device busy {100 - idle:.0f} % of the traced steps"
        busy, spread = 100 - idle, None
    else:
        return None, "no GPU utilisation inside the training loop, and no trace"
    several = world_size > 1
    if several and collective is not None:
        figures += f"; collectives {collective:.0f} % of the device's busy time (trace)"
        if collective >= COMMUNICATION_BOUND_PCT:
            return "communication", f"{figures}: collectives >= {COMMUNICATION_BOUND_PCT:.0f} %"
    bound = band(busy)
    why = f"{figures}: {BAND_WORDS[bound]}"
    near = [line for line in (HOST_BOUND_BUSY_PCT, GPU_BOUND_BUSY_PCT) if spread and abs(busy - line) <= spread]
    if near:
        why += f" (the {near[0]:.0f} % line is inside its noise)"
    if several and collective is None and bound != "host":
        why += "; NVML counts collective kernels as busy, so part of it may be communication (a trace tells)"
    return bound, why


def where_time_goes(
    report: Mapping[str, Any],
    *,
    timeline_path: Path | None,
    timeline_t0_monotonic_s: float | None,
    gpu_index: int | None,
    world_size: int,
) -> dict[str, Any]:
    """``loop_window_s`` on a CPU too: the timeline figure marks load, loop and teardown with it."""
    window = loop_window(report.get("loop_monotonic_s"), timeline_t0_monotonic_s)
    loop = None if window is None else [round(window[0], 3), round(window[1], 3)]
    none = {"gpu_busy_pct": None, "gpu_busy_spread_pct": None, "gpu_busy_sample_count": None,
            "gpu_busy_pct_per_gpu": None, "loop_window_s": loop}  # fmt: skip
    device = str(report.get("device_name") or "")
    if not device or device.startswith("cpu"):
        return {**none, "gpu_busy_reason": NO_GPU_REASON, "bound": None, "bound_reason": NO_GPU_REASON}
    if window is None or timeline_path is None:
        why = "the run reported no timed training loop" if window is None else "no timeline was sampled"
        return {**none, "gpu_busy_reason": why, "bound": None, "bound_reason": why}
    per_gpu = loop_samples(read_gpu_utilisation(timeline_path), window)
    mine = per_gpu.get(gpu_index, []) if gpu_index is not None else []
    busy = statistics.fmean(mine) if mine else None
    reason = None
    if busy is None:
        reason = (
            "no NVML utilisation sample of this rank's GPU inside the training loop (a loop shorter than a sample?)"
        )
    spread = busy_spread(mine)
    bound, why = classify(busy, spread, world_size=world_size, trace=report.get("torch_profile_summary"),
                          samples=len(mine) or None)  # fmt: skip
    return {
        **none,
        "gpu_busy_pct": busy,
        "gpu_busy_spread_pct": spread,
        "gpu_busy_sample_count": len(mine) or None,
        "gpu_busy_pct_per_gpu": {str(k): statistics.fmean(v) for k, v in per_gpu.items()} or None,
        "gpu_busy_reason": reason,
        "bound": bound,
        "bound_reason": why if bound else reason or why,
    }


# ------------------------------------------------------------------------------------------ on read


def stored_loop_samples(record: Mapping[str, Any], folders: Sequence[Path]) -> list[float]:
    """What an older record's noise is derived from; [] where they do not give the record's own figure."""
    busy, window = finite_number(record.get("gpu_busy_pct")), record.get("loop_window_s")
    raw, per_gpu = record.get("timeline_path"), record.get("gpu_busy_pct_per_gpu")
    if busy is None or not isinstance(raw, str) or not isinstance(per_gpu, Mapping):
        return []
    if not isinstance(window, list | tuple) or len(window) != 2 or any(finite_number(v) is None for v in window):
        return []
    index = next((key for key, value in per_gpu.items() if finite_number(value) == busy), None)
    if index is None or not str(index).isdigit():
        return []
    for folder in folders:
        path = regular_file_inside(folder, raw)
        if path is None:
            continue
        samples = loop_samples(read_gpu_utilisation(path), (float(window[0]), float(window[1]))).get(int(index), [])
        if samples and math.isclose(statistics.fmean(samples), busy, abs_tol=0.01):
            return samples
    return []


def rederived(record: Mapping[str, Any], folders: Sequence[Path]) -> dict[str, Any]:
    """By today's rule, so the shipped references follow it; {} where the record holds no device figure."""
    busy = finite_number(record.get("gpu_busy_pct"))
    trace = record.get("torch_profile_summary")
    trace = trace if isinstance(trace, Mapping) else {}
    if busy is None and finite_number(trace.get("device_idle_pct")) is None:
        return {}
    out: dict[str, Any] = {}
    spread, count = finite_number(record.get("gpu_busy_spread_pct")), finite_number(record.get("gpu_busy_sample_count"))
    if busy is not None and count is None and (samples := stored_loop_samples(record, folders)):
        spread, count = busy_spread(samples), len(samples)
        out.update(gpu_busy_spread_pct=spread, gpu_busy_sample_count=count)
    world = int(finite_number(record.get("world_size")) or 1)
    bound, why = classify(
        busy, spread, world_size=world, trace=trace, samples=None if count is None else int(count)
    )
    return {**out, "bound": bound, "bound_reason": why}


RUN_LENGTH_OVERRIDES = ("train.max_steps", "train.lr_warmup_steps")
"""They change no kernel, so runs that differ in them alone are runs of one experiment."""


def _same_experiment(record: Mapping[str, Any]) -> str:
    """Overrides but for the run's length; a simulated rank 0 of 4 is not one of 8."""
    overrides = record.get("overrides") if isinstance(record.get("overrides"), Mapping) else {}
    shaping = {key: value for key, value in overrides.items() if key not in RUN_LENGTH_OVERRIDES}
    keys = ("experiment", "device_name", "profile", "rank", "world_size", "simulated_world_size")
    return json.dumps([shaping, *(record.get(key) for key in keys)], sort_keys=True, default=str)


def _noise(record: Mapping[str, Any]) -> float:
    spread = finite_number(record.get("gpu_busy_spread_pct"))
    return math.inf if spread is None else spread  # no estimate: it cannot be told apart from any other run


def _apart(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float]:
    """(how far apart two runs' busy figures are, their joint noise: the root of the sum of their noises' squares)."""
    return abs(a["gpu_busy_pct"] - b["gpu_busy_pct"]), math.hypot(_noise(a), _noise(b))


def _figure(record: Mapping[str, Any]) -> str:
    spread = finite_number(record.get("gpu_busy_spread_pct"))
    busy = record["gpu_busy_pct"]
    return f"{busy:.0f} % (no noise estimate)" if spread is None else f"{busy:.0f} ± {spread:.0f} %"


def _differs(run: Mapping[str, Any], other: Mapping[str, Any], other_label: str) -> str:
    apart, noise = _apart(run, other)
    if math.isinf(noise):
        beyond = "one has no noise estimate"
    else:
        beyond = f"{apart - noise:.0f} beyond" if apart > noise else "within"
        beyond += f" their joint noise (±{noise:.0f})"
    return (
        f"the other `{run['experiment']}` run on this GPU ({other.get('run_id')}) is `{other_label}`: GPU busy "
        f"{_figure(other)} there against {_figure(run)} here, {apart:.0f} points apart, {beyond}"
    )


def agree_within_noise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One label for runs whose busy figures agree within their joint noise: a label read off one threshold flipped
    between two quick runs of ``small-batch`` on one H200 (76 and 97 % busy, the same time per micro-batch)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if pooled_candidate(record):
            groups.setdefault(_same_experiment(record), []).append(record)
    for runs in (runs for runs in groups.values() if len(runs) > 1):
        labels = _pooled_labels(runs)
        for run, (label, pooled, others) in zip(runs, labels, strict=True):
            if label != run["bound"]:
                run["bound_reason"] += (f"; pooled with {others} other run(s) of `{run['experiment']}` on this GPU "
                                        f"whose busy figure agrees within the noise: {pooled:.0f} % -> {label}")  # fmt: skip
                run["bound"] = label
        _name_the_others(runs, [label for label, _, _ in labels])
    return records


AGREEMENT_FIELDS = (
    "experiment", "overrides", "device_name", "profile", "rank", "world_size", "simulated_world_size", "status",
    "bound", "bound_reason", "gpu_busy_pct", "gpu_busy_spread_pct", "gpu_busy_sample_count", "run_id",
)  # fmt: skip
"""A reader of 100,000 records may give ``agree_within_noise`` these alone."""


def pooled_candidate(record: Mapping[str, Any]) -> bool:
    return (
        record.get("status") == "ok"
        and record.get("bound") in BAND_WORDS
        and finite_number(record.get("gpu_busy_pct")) is not None
    )


NAMED_OTHERS = 3
"""More are counted, not named: a term holds thousands of runs of one experiment, and naming each is quadratic."""


def _name_the_others(runs: list[dict[str, Any]], labels: list[str]) -> None:
    """The runs labelled otherwise than a label are the same for every run of that label."""
    for label in set(labels):
        others = [j for j, other_label in enumerate(labels) if other_label != label]
        if not others:
            continue
        for i in (i for i, own in enumerate(labels) if own == label):
            run = runs[i]
            for j in others[:NAMED_OTHERS]:
                run["bound_reason"] += f"; {_differs(run, runs[j], labels[j])}"
            if len(others) > NAMED_OTHERS:
                run["bound_reason"] += (f"; and {len(others) - NAMED_OTHERS} more run(s) of `{run['experiment']}` "
                                        "on this GPU labelled otherwise")  # fmt: skip


def _pooled_labels(runs: list[dict[str, Any]]) -> list[tuple[str, float, int]]:
    """Every pair is compared (5,000 runs: 25 million pairs), so with numpy in blocks, giving the loop's figures bit
    for bit: ``math.hypot`` within 1e-12 of the joint noise, where numpy's may round otherwise; sums in group order."""
    import numpy as np

    count = len(runs)
    busy = np.array([run["gpu_busy_pct"] for run in runs], dtype=np.float64)
    noise = np.array([_noise(run) for run in runs], dtype=np.float64)
    weights = np.array([finite_number(run.get("gpu_busy_sample_count")) or 1 for run in runs], dtype=np.float64)
    weighted = weights * busy
    labels: list[tuple[str, float, int]] = []
    rows = max(1, (1 << 20) // count)
    for first in range(0, count, rows):
        block = slice(first, min(count, first + rows))
        apart = np.abs(busy[block, None] - busy[None, :])
        joint = np.hypot(noise[block, None], noise[None, :])
        agree = apart <= joint
        for i, j in zip(*np.nonzero(np.isfinite(joint) & (np.abs(apart - joint) <= 1e-12 * joint)), strict=True):
            a, b = runs[first + int(i)], runs[int(j)]
            agree[i, j] = _apart(a, b)[0] <= _apart(a, b)[1]
        pooled = (np.cumsum(np.where(agree, weighted, 0.0), axis=1)[:, -1]
                  / np.cumsum(np.where(agree, weights, 0.0), axis=1)[:, -1])  # fmt: skip
        agreeing = agree.sum(axis=1)
        for i, (figure, n) in enumerate(zip(pooled.tolist(), agreeing.tolist(), strict=True)):
            run = runs[first + i]
            labels.append((band(figure) if n > 1 else run["bound"], figure, n - 1))
    return labels
