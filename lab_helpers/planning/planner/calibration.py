"""What the time model (``timing``) fits to measured records, and only that: the FLOPs model's MFU and overhead
(``mfu_for``); the traced model's per-launch cost, matmul and bandwidth efficiencies and plan-build time
(``traced_model``). Records are arguments: this module reads no file and probes no hardware.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.iteration_times import first_seen_iterations, length_split, steady_train_s, timed_iterations
from lab_helpers.hardware.cpu_speed import CpuRates
from lab_helpers.hardware.gpu_peaks import find_gpu
from lab_helpers.planning.flops import train_flops_per_step

from .errors import PlanError
from .published import lora_vs_nf4_minutes
from .spec import TrainingSpec

CPU = "cpu"

DEFAULT_MFU: dict[str, float] = {"full": 0.25, "lora": 0.20}
"""An assumption, not a measurement: conservative MFUs for litgpt fine-tuning on short, padded 512-token Alpaca
samples, below pre-training's 40-60 %. LoRA is lower than full: its FLOPs are ~2/3 of a full step's, but the frozen
matmuls and the adapter path's dropout do not shrink in proportion. ``mfu_for`` prefers the lab's records."""

# litgpt's own resource table (``published``: tutorials/resource-tables.md, 10/2023, 1x A100-SXM4-40GB, bf16-true,
# finetune/lora.py, micro batch 1): minutes per 1k iterations without and with bnb.nf4, same model and data. The
# ratio is QLoRA's extra time (dequantising every weight per matmul) relative to LoRA.
LITGPT_LORA_VS_NF4_MIN: dict[str, tuple[float, float]] = lora_vs_nf4_minutes()
QLORA_SPEED_RATIO = statistics.median(lora / nf4 for lora, nf4 in LITGPT_LORA_VS_NF4_MIN.values())
"""LoRA time / QLoRA time in litgpt's table (median of its four models): QLoRA's MFU is LoRA's times this."""


@dataclass(frozen=True)
class MfuEntry:
    gpu: str  # a gpu_peaks model name ("A100"), or "*" for any GPU
    method: str
    mfu: float
    source: str


MFU_TABLE: tuple[MfuEntry, ...] = (
    MfuEntry("*", "full", DEFAULT_MFU["full"], "assumption (DEFAULT_MFU): no records of this GPU and method"),
    MfuEntry("*", "lora", DEFAULT_MFU["lora"], "assumption (DEFAULT_MFU): no records of this GPU and method"),
    MfuEntry(
        "*",
        "qlora",
        DEFAULT_MFU["lora"] * QLORA_SPEED_RATIO,
        f"assumed LoRA MFU x {QLORA_SPEED_RATIO:.2f}, litgpt's LoRA/QLoRA time ratio "
        "(tutorials/resource-tables.md, 1x A100)",
    ),
)
"""Add a row only with its source."""


# ------------------------------------------------------------------------------------------------ MFU


def device_key(device_name: str | None) -> str:
    """What MFUs are keyed by: "cpu", the GPU's model in the peak table ("A100"), or the raw name."""
    if not isinstance(device_name, str) or not device_name or device_name == CPU or device_name.startswith(f"{CPU} ("):
        # no name (None, or NaN from a table), "cpu" or "cpu (x86_64)"
        return CPU
    peak = find_gpu(device_name)
    return peak.model if peak is not None else str(device_name)


@dataclass(frozen=True)
class Efficiency:
    """``micro_batch_s = FLOPs / (peak x mfu) + overhead_s``. ``overhead_s`` is what does not shrink with FLOPs
    (launches, Python, data loading): it dominates the ci models on a CPU and is negligible on a GPU."""

    mfu: float
    overhead_s: float
    source: str


def mfu_for(
    device_name: str,
    method: str,
    precision: str,
    *,
    records: Iterable[Mapping[str, Any]] = (),
    cpu_rates: CpuRates | None = None,
) -> Efficiency:
    """Records first, then ``MFU_TABLE``; a CPU record needs ``cpu_rates`` to say what 100 % MFU is."""
    derived = mfu_from_records(records, device_name, method, precision, cpu_rates=cpu_rates)
    if derived is not None:
        return derived
    key = device_key(device_name)
    if key == CPU:
        raise PlanError(
            f"no ci records of {method!r} runs to derive this CPU's MFU from: run the ci profile first "
            "(LAB_PROFILE=ci python -m lab_helpers run ...) or pass mfu="
        )
    for entry in MFU_TABLE:
        if entry.gpu in (key, "*") and entry.method == method:
            return Efficiency(entry.mfu, 0.0, entry.source)
    raise PlanError(f"no MFU for method {method!r}")


MIN_POINTS_FOR_OVERHEAD = 3


def mfu_from_records(
    records: Iterable[Mapping[str, Any]],
    device_name: str,
    method: str,
    precision: str,
    *,
    cpu_rates: CpuRates | None = None,
) -> Efficiency | None:
    """Fit ``micro_batch_s = ideal_s / mfu + overhead_s`` (``ideal_s``: the time at 100 % MFU), same precision
    first. Both terms need three runs of different sizes; with fewer, the overhead is 0 and the MFU the median."""
    key = device_key(device_name)
    same: list[tuple[float, float]] = []
    other: list[tuple[float, float]] = []
    for record in map(without_nan, records):
        if record.get("status") != "ok" or record.get("method") != method:
            continue
        if device_key(gpu_name_of(record)) != key or int(record.get("world_size") or 1) != 1:
            continue  # a multi-device record's time holds communication, which predict_time adds on its own
        point = record_point(record, cpu_rates)
        if point is not None:
            (same if _precision(record) == precision else other).append(point)
    points = same if len(same) >= MIN_POINTS_FOR_OVERHEAD or not other else same + other
    if not points:
        return None
    what = f"{len(points)} {precision + ' ' if points is same else ''}{method} record(s) on {key}"
    ideal = [x for x, _ in points]
    if len(points) >= MIN_POINTS_FOR_OVERHEAD and max(ideal) > 1.5 * min(ideal):
        slope, overhead = _line(points)
        if overhead < 0 or slope <= 0:  # through the origin instead: no negative fixed cost
            slope, overhead = sum(x * y for x, y in points) / sum(x * x for x, _ in points), 0.0
        # against a datasheet peak an MFU above 1 is impossible: the points do not follow the line (the median
        # below); a CPU's "peak" is a measured matmul rate, which its training steps may beat
        if slope > 0 and (slope >= 1 or key == CPU):
            return Efficiency(1 / slope, overhead, f"fitted to {what}")
    return Efficiency(statistics.median(x / y for x, y in points), 0.0, f"median of {what}")


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return slope, mean_y - slope * mean_x


def record_point(record: Mapping[str, Any], cpu_rates: CpuRates | None = None) -> tuple[float, float] | None:
    """(the micro-batch's time at 100 % MFU, as measured) of a finished record."""
    measured = measured_step(record)
    if measured is None:
        return None
    if gpu_name_of(record):
        value = record.get("mfu")
        if not isinstance(value, (int, float)) or value <= 0:
            return None
        return value * measured["recorded_micro_batch_s"], measured["micro_batch_s"]  # mfu x its own time: ideal
    if cpu_rates is None:
        return None
    flops = _cpu_record_flops(json.dumps(record, sort_keys=True, default=str))
    if flops is None:
        return None
    return flops / cpu_rates.matmul_flops_per_s, measured["micro_batch_s"]


@functools.lru_cache(maxsize=256)
def _cpu_record_flops(record_json: str) -> float | None:
    """Memoised by the record's text: reading a recipe and counting FLOPs takes a fraction of a second."""
    record = json.loads(record_json)
    measured = measured_step(record)
    if measured is None:
        return None
    try:
        spec = record_spec(record)
    except (PlanError, OSError, ValueError, KeyError, TypeError):
        return None  # a record the planner cannot read (an old or multi-GPU Lightning run): no MFU from it
    return train_flops_per_step(
        spec.model_config,
        method=spec.method,
        lora=spec.lora or None,
        micro_batch_size=spec.micro_batch_size,
        seq_len=measured["seq_len"],
    )


def without_nan(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record without NaN fields: a pandas table fills every missing field of a row with NaN."""
    return {k: v for k, v in record.items() if not (isinstance(v, float) and math.isnan(v))}


def gpu_name_of(record: Mapping[str, Any]) -> str | None:
    """None for a CPU run, also where a table gave the missing name as NaN."""
    value = record.get("device_name")
    return value if isinstance(value, str) and value and device_key(value) != CPU else None


def _precision(record: Mapping[str, Any]) -> str | None:
    config = record.get("config")
    return config.get("precision") if isinstance(config, Mapping) else None


# ------------------------------------------------------------------------------------------------ records


def measured_step(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished record's steady micro-batch and step time and mean padded length. With each micro-batch's length
    (``seq_lens``): ``steady_micro_batches``' median (a length-grouped run's mean) at their lengths; else
    ``steady_train_s``, since a one-off paid once in a short timed span is not what a step costs.
    ``recorded_micro_batch_s`` is the time the record's ``mfu`` was derived from. None for a plan-building run none of
    whose timed micro-batches repeated a length: its time is mostly plan builds."""
    config = record.get("config") if isinstance(record.get("config"), Mapping) else {}
    train = config.get("train") or {}
    iterations, train_s, padded = record.get("iterations"), record.get("train_s"), record.get("tokens_padded")
    micro = train.get("micro_batch_size")
    if record.get("status") != "ok" or not iterations or not train_s or not padded or not micro:
        return None
    devices = int(record.get("world_size") or 1)
    from lab_helpers.config.experiments import gradient_accumulation_steps

    batch = {"micro_batch_size": micro, "global_batch_size": train.get("global_batch_size", micro)}
    accumulation = gradient_accumulation_steps({"train": batch}, world_size=devices)
    steady = steady_micro_batches(record)
    if steady == []:
        return None
    if steady:
        seconds, lengths = [s for s, _ in steady], [n for _, n in steady]
        mean = record.get("batch_order") == "length-grouped"
        micro_s = statistics.fmean(seconds) if mean else statistics.median(seconds)
        tokens_per_s = int(micro) * statistics.fmean(lengths) / micro_s
        seq_len = max(1, round(statistics.fmean(lengths)))
    else:
        steady_s = steady_train_s(record) or float(train_s)
        micro_s, lengths = steady_s / int(iterations), None
        tokens_per_s = float(padded) / steady_s
        seq_len = max(1, round(float(padded) / (int(iterations) * int(micro))))
    return {
        "micro_batch_s": micro_s,
        "recorded_micro_batch_s": float(train_s) / int(iterations),
        "step_s": micro_s * accumulation,
        "seq_len": seq_len,
        "lengths": lengths,
        "tokens_per_s_padded": tokens_per_s,
    }


def builds_attention_plans(precision: str | None, gpu_name: str | None) -> bool:
    """bf16 attention on Hopper builds a cuDNN plan for each padded length it first meets (host time); fp32 takes
    another kernel and builds none (``benchmarks/speed_diagnosis.py``)."""
    hopper = gpu_name is not None and device_key(gpu_name).startswith(("H100", "H200", "GH200"))
    return hopper and str(precision or "").startswith("bf16")


def steady_micro_batches(record: Mapping[str, Any]) -> list[tuple[float, int]] | None:
    """(seconds, padded length) of the timed micro-batches, read off ``seq_lens``; where the run builds attention
    plans, only those of a length seen before: a plan build inside a record's time inflated the per-launch cost fitted
    to it (``benchmarks/planner_padding_check_h200.out.txt``, section 1). None without lengths."""
    timed = timed_iterations(record)
    lengths = record.get("seq_lens")
    if not timed or not isinstance(lengths, Sequence) or isinstance(lengths, str):
        return None
    if len(lengths) < max(iteration for iteration, _ in timed):
        return None
    plans = builds_attention_plans(_precision(record), gpu_name_of(record))
    first_seen = first_seen_iterations(lengths) if plans else set()  # the split length_split makes, one rule
    return [(seconds, int(lengths[i - 1])) for i, seconds in timed if i not in first_seen]


def record_spec(record: Mapping[str, Any]) -> TrainingSpec:
    """Checkpoint paths resolved as the lab does."""
    from lab_helpers.config.experiments import resolve_path

    from .spec import spec_from_recipe

    config = dict(record["config"])
    config["checkpoint_dir"] = str(resolve_path(config["checkpoint_dir"]))
    strategy = record.get("strategy") or "single"
    offload = strategy == "deepspeed-zero3" and "offload" in str(record.get("experiment", ""))
    return spec_from_recipe(
        config,
        devices=int(record.get("world_size") or 1),
        strategy=None if strategy == "single" else strategy,
        offload_optimizer=offload,
        device="cuda" if gpu_name_of(record) else CPU,
    )


# ------------------------------------------------------------------------------------------------ the traced model

HOST_BOUND_MARGIN = 1.2
"""A record calibrates the per-launch cost only where its micro-batch took over this x its predicted device time:
there the time is the host's."""


@dataclass(frozen=True)
class DeviceEfficiency:
    matmul: float
    bandwidth: float
    source: str
    gpus: tuple[str, ...] = ()  # the GPU models (``device_key``) of the profiles fitted to: where they are carried from


_OPS_CACHE: dict[str, Any] = {}


def traced_ops(spec: TrainingSpec, seq_len: int):
    """At the mean padded length (time follows it); memoised: a leave-one-out check asks for each record's ops often."""
    from . import ops_cache
    from .tracer import trace

    spec = dataclasses.replace(spec, seq_len=int(seq_len))
    key = repr(spec)
    if key not in _OPS_CACHE:
        if len(_OPS_CACHE) > 256:
            _OPS_CACHE.pop(next(iter(_OPS_CACHE)))
        on_disk = ops_cache.key_for(key, int(seq_len))  # kept between processes too (ops_cache: tracing takes seconds)
        ops = ops_cache.load(on_disk)
        if ops is None:
            ops = trace(spec).op_costs
            ops_cache.store(on_disk, ops)
        _OPS_CACHE[key] = ops
    return _OPS_CACHE[key]


def _gpu_rates(gpu_name: str) -> tuple[dict[str, float | None], float | None]:
    from lab_helpers.hardware.gpu_peaks import dense_peaks, memory_bandwidth

    return dense_peaks(gpu_name), memory_bandwidth(gpu_name)


def _device_s(ops, gpu_name: str, eff: DeviceEfficiency) -> float:
    from .op_costs import device_seconds

    peaks, bandwidth = _gpu_rates(gpu_name)
    return device_seconds(
        ops, peaks=peaks, bandwidth=bandwidth, matmul_efficiency=eff.matmul, bandwidth_efficiency=eff.bandwidth
    )


def _record_ops(record: Mapping[str, Any]):
    measured = measured_step(record)
    if measured is None or not gpu_name_of(record) or int(record.get("world_size") or 1) != 1:
        return None
    if record.get("simulated_world_size"):
        return None  # rank 0 of a simulated N-rank run: its strategy's hooks, not one GPU's step
    try:
        spec = record_spec(record)
        return spec, traced_ops(spec, measured["seq_len"]), measured
    except (PlanError, OSError, ValueError, KeyError, TypeError):
        return None


def profiled_length(record: Mapping[str, Any]) -> int | None:
    """Mean padded length of the micro-batches the profile covered (the first profiled one, and the one after the last,
    which stopped the profiler): not the timed ones (the H200's fp32 ``small-batch`` profiled two of its longest)."""
    span, lengths = record.get("torch_profile_iters"), record.get("seq_lens")
    if (
        not isinstance(span, Sequence)
        or len(span) != 2
        or not isinstance(lengths, Sequence)
        or isinstance(lengths, str)
    ):
        return None
    covered = lengths[int(span[0]) - 1 : int(span[1]) - 1]
    return max(1, round(statistics.fmean(covered))) if covered else None


def fit_efficiencies(records: Iterable[Mapping[str, Any]]) -> DeviceEfficiency | None:
    """Matmul and bandwidth efficiencies that make each profiled record's traced roofline match its profile's device
    busy time (kernels' own time: no host time hides in it); least squares on the log, on a 0.02 grid."""
    import numpy as np

    from .op_costs import Ops

    points: list[tuple[list[tuple[float, float, float]], float]] = []
    names, gpus = [], set()
    for record in map(without_nan, records):
        summary = record.get("torch_profile_summary")
        if not isinstance(summary, Mapping) or not summary.get("device_busy_ms_per_step"):
            continue
        found = _record_ops(record)
        if found is None:
            continue
        spec, ops, _ = found
        if profiled_length(record) is not None:
            ops = traced_ops(spec, profiled_length(record))
        peaks, bandwidth = _gpu_rates(gpu_name_of(record))
        if not bandwidth or not peaks:
            continue
        rows = []
        accumulation = spec.gradient_accumulation_iters

        def add(part: Ops, times: float, rows=rows, peaks=peaks, bandwidth=bandwidth) -> None:
            for op, n in part:
                peak = peaks.get(op.unit or "fp32_matmul") or peaks.get("fp32_matmul")
                rows.append((n * times, op.flops / peak if op.flops and peak else 0.0, op.bytes / bandwidth))

        add(ops.micro_batch, accumulation)
        add(ops.optimizer_step, 1)
        points.append((rows, float(summary["device_busy_ms_per_step"]) / 1e3))
        names.append(f"{record.get('experiment')} ({device_key(gpu_name_of(record))})")
        gpus.add(device_key(gpu_name_of(record)))
    if not points:
        return None
    grid = np.arange(0.1, 1.0001, 0.02)
    loss = np.zeros((len(grid), len(grid)))
    for rows, measured in points:
        n, compute, moved = (np.array(col) for col in zip(*rows, strict=True))
        # time[i, j] = sum_k n_k max(compute_k / grid_i, moved_k / grid_j)
        total = np.zeros_like(loss)
        for i, e_mm in enumerate(grid):
            total[i] = (n[None, :] * np.maximum(compute[None, :] / e_mm, moved[None, :] / grid[:, None])).sum(axis=1)
        loss += np.log(total / measured) ** 2
    i, j = np.unravel_index(np.argmin(loss), loss.shape)
    return DeviceEfficiency(
        float(grid[i]),
        float(grid[j]),
        f"fitted to the device busy time of {len(points)} profiled record(s): {', '.join(names)}",
        tuple(sorted(gpus)),
    )


def host_bound_launch_cost(
    micro_batch_s: float, ops, accumulation: int, gpu_name: str, eff: DeviceEfficiency, longest: Any = None
) -> float | None:
    """Host seconds per launch one measured micro-batch implies, or None where it is not host-bound. ``longest`` must
    be host-bound: where only the short micro-batches are, the time holds device-bound ones that the per-launch cost
    would absorb (a length-grouped run)."""
    longest = longest or ops
    device = (
        _device_s(longest.micro_batch, gpu_name, eff) + _device_s(longest.optimizer_step, gpu_name, eff) / accumulation
    )
    if micro_batch_s < HOST_BOUND_MARGIN * device:
        return None
    return micro_batch_s / (ops.kernels_per_micro_batch() + ops.kernels_per_optimizer_step() / accumulation)


def fit_launch_cost(
    records: Iterable[Mapping[str, Any]], gpu_name: str, eff: DeviceEfficiency
) -> tuple[float, str] | None:
    """Median over host-bound records, this GPU model's first: the per-launch cost is the node's (CPU, Python, torch
    build); every GPU's makes it a default, and the source says so."""
    key = device_key(gpu_name)
    records = [without_nan(record) for record in records]

    def points(same_gpu: bool) -> list[tuple[float, str]]:
        found_points = []
        for record in records:
            name = gpu_name_of(record)
            if name is None or (device_key(name) == key) != same_gpu or not all(_gpu_rates(name)):
                continue
            found = _record_ops(record)
            if found is None:
                continue
            spec, ops, measured = found
            longest = traced_ops(spec, max(measured["lengths"])) if measured["lengths"] else None
            accumulation = spec.gradient_accumulation_iters
            cost = host_bound_launch_cost(measured["micro_batch_s"], ops, accumulation, name, eff, longest)
            if cost is not None:
                found_points.append((cost, str(record.get("experiment"))))
        return found_points

    same = points(True)
    chosen = same or points(False)
    if not chosen:
        return None
    where = key if same else f"other GPUs ({key} has none)"
    label = "fitted" if same else "default, fitted"
    return (
        statistics.median(c for c, _ in chosen),
        f"{label} to {len(chosen)} host-bound record(s) on {where}: {', '.join(n for _, n in chosen)}",
    )


LENGTH_GRID = 128
"""A traced step's kernels, FLOPs and bytes grow nearly linearly with the length (attention's quadratic share is a
few % at 512 tokens), so lengths are traced on this grid and interpolated: tracing each of a pass's 130-170
distinct lengths would take minutes."""


def length_costs(spec: TrainingSpec, gpu_name: str, eff: DeviceEfficiency, lengths: Sequence[int]) -> tuple[Any, Any]:
    import numpy as np

    low, high = min(lengths), max(lengths)
    grid = sorted({low, high, *range((low // LENGTH_GRID + 1) * LENGTH_GRID, high, LENGTH_GRID)})
    ops = [traced_ops(spec, n) for n in grid]
    kernels = [op.kernels_per_micro_batch() for op in ops]
    device = [_device_s(op.micro_batch, gpu_name, eff) for op in ops]
    return np.interp(lengths, grid, kernels), np.interp(lengths, grid, device)


def fit_plan_build_s(records: Iterable[Mapping[str, Any]], gpu_name: str) -> tuple[float, str] | None:
    """The median over this GPU's single-device plan-building records of their first-seen micro-batch over their
    steady one (``iteration_times.length_split``)."""
    key = device_key(gpu_name)
    points: list[tuple[float, str]] = []
    for record in map(without_nan, records):
        name = gpu_name_of(record)
        if name is None or device_key(name) != key or not builds_attention_plans(_precision(record), name):
            continue
        if int(record.get("world_size") or 1) != 1 or record.get("simulated_world_size"):
            continue
        split = length_split(record)
        if split.get("first_seen_extra_s") is not None and split.get("first_seen_count"):
            points.append((float(split["first_seen_extra_s"]), str(record.get("experiment"))))
    if not points:
        return None
    names = ", ".join(n for _, n in points)
    return statistics.median(s for s, _ in points), f"fitted to {len(points)} bf16 record(s) on {key}: {names}"


def traced_model(
    spec: TrainingSpec,
    gpu_name: str,
    seq_len: int,
    *,
    records: Iterable[Mapping[str, Any]] = (),
    launch_cost_s: float | None = None,
    launch_cost_source: str = "measured on this node",
    efficiency: DeviceEfficiency | None = None,
    lengths: Sequence[int] | None = None,
    first_seen: int = 0,
    launches_saved: float = 0.0,
    plan_builds: bool = True,
) -> dict[str, Any] | None:
    """Host and device seconds of a micro-batch and of the optimizer step, from the trace; None where the GPU's
    bandwidth or peaks are unknown or nothing calibrates the fits (``predict_time`` then uses the FLOPs model).
    Each of ``lengths`` takes the larger of its own host and device time and ``micro_s`` is their mean: a short
    micro-batch is host-bound where a long one is device-bound, and the mean length would hide it."""
    import numpy as np

    peaks, bandwidth = _gpu_rates(gpu_name)
    if not bandwidth or not peaks:
        return None
    records = [without_nan(r) for r in records]
    eff = efficiency or fit_efficiencies(records)
    if eff is None:
        return None
    if launch_cost_s is None:
        fitted = fit_launch_cost(records, gpu_name, eff)
        if fitted is None:
            return None
        launch_cost_s, launch_cost_source = fitted
    lengths = list(lengths or [seq_len])
    ops = traced_ops(spec, max(lengths))  # its optimizer step and notes do not depend on the length
    kernels, device = length_costs(spec, gpu_name, eff, lengths)
    kernels = kernels - launches_saved
    host = kernels * launch_cost_s
    kernels_step = ops.kernels_per_optimizer_step()
    device_step = _device_s(ops.optimizer_step, gpu_name, eff)
    notes = list(ops.notes)
    plan_build_s, plan_source = 0.0, ""
    if builds_attention_plans(spec.precision, gpu_name) and plan_builds:
        plan_build_s, plan_source, note = _plan_builds(records, gpu_name, first_seen, len(lengths))
        notes.append(note)
    return {
        "host_s": float(host.mean()),
        "device_s": float(device.mean()),
        "micro_s": float(np.maximum(host, device).mean()) + plan_build_s * first_seen / len(lengths),
        "plan_build_s": plan_build_s,
        "plan_build_source": plan_source,
        "first_seen": first_seen,
        "micro_batches": len(lengths),
        "optimizer_step_s": max(kernels_step * launch_cost_s, device_step),
        "kernels_per_micro_batch": float(kernels.mean()),
        "kernels_per_optimizer_step": kernels_step,
        "launch_cost_s": launch_cost_s,
        "launch_cost_source": launch_cost_source,
        "matmul_efficiency": eff.matmul,
        "bandwidth_efficiency": eff.bandwidth,
        "efficiency_source": eff.source,
        "efficiency_gpus": eff.gpus,
        "bandwidth": bandwidth,
        "notes": notes,
    }


def _plan_builds(records: list, gpu_name: str, first_seen: int, micro_batches: int) -> tuple[float, str, str]:
    fitted = fit_plan_build_s(records, gpu_name)
    if fitted is None:
        note = ("not included: each padded length a run meets first builds a cuDNN attention plan (bf16 on Hopper), "
                "and no bf16 record of this GPU says what one costs")  # fmt: skip
        return 0.0, "", note
    seconds, source = fitted
    if first_seen:
        note = (f"cuDNN attention plans: {first_seen} of the {micro_batches} micro-batches have a length not met "
                f"before, each +{seconds * 1e3:.0f} ms of host ({source})")  # fmt: skip
    else:
        note = (f"predicted is the time on lengths met before: each first-seen padded length adds "
                f"{seconds * 1e3:.0f} ms of host, a cuDNN attention plan ({source})")  # fmt: skip
    return seconds, source, note
