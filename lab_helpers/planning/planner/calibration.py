"""What the time model (``timing``) takes from measured records, and only from them: the figures it fits.

**The FLOPs model's MFU.** ``mfu_for``: fitted to the lab's own records for the device and method
(``mfu_from_records``: MFU and a fixed per-micro-batch overhead by least squares, records of the same precision
first), else ``MFU_TABLE`` (each figure with its source; today ``DEFAULT_MFU``, an assumption labelled as one).

**The traced model's three figures.** ``traced_model``: the per-launch host cost (``fit_launch_cost``: host-bound
records of this GPU, else of any GPU, else a default that says so) and the matmul and bandwidth efficiencies
(``fit_efficiencies``: the device busy time of the records' profiles), each op's cost from the traced step
(``traced_ops``, memoised).

A record's time is its steady one (``measured_step``) and its recipe the TrainingSpec it ran (``record_spec``).
Records are arguments: this module reads no file and probes no hardware.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.iteration_times import steady_train_s
from lab_helpers.hardware.cpu_speed import CpuRates
from lab_helpers.hardware.gpu_peaks import find_gpu
from lab_helpers.planning.flops import train_flops_per_step

from .errors import PlanError
from .published import lora_vs_nf4_minutes
from .spec import TrainingSpec

CPU = "cpu"

DEFAULT_MFU: dict[str, float] = {"full": 0.25, "lora": 0.20}
"""ASSUMPTION, not a measurement: conservative MFUs for litgpt fine-tuning on a data-centre GPU at the lab's
sequence lengths (512 tokens, short Alpaca samples; no fused kernels, no torch.compile). Lower than what
well-tuned pre-training reaches (40-60 %) because fine-tuning batches are short and padded. LoRA is set lower
than full: its FLOPs are ~2/3 of a full step's, but the frozen matmuls and dropout on the adapter path do not
shrink in proportion. Replace with the lab's own GPU records as soon as they exist (``mfu_for`` does it)."""

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
"""Per GPU model and method, with the source of each figure. Refill from the lab's records with
``mfu_from_records`` (which ``mfu_for`` already prefers); add a row here only with its source."""


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
    """How a device turns FLOPs into time: ``micro_batch_s = FLOPs / (peak x mfu) + overhead_s``.

    ``overhead_s`` is the fixed part of a micro-batch (kernel launches, Python, the optimizer's share, data
    loading) that does not shrink with FLOPs: it dominates the ci profile's tiny models on a CPU and is
    negligible beside a real model's compute on a GPU. It is fitted from records (0 without them)."""

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
    """The Efficiency for ``device_name`` and ``method``: fitted to ``records`` first, then the table.
    ``cpu_rates`` (the CPU's measured matmul rate) turns a CPU record's FLOPs into its ideal time."""
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
    """Fit ``micro_batch_s = ideal_s / mfu + overhead_s`` to finished runs of ``method`` on this kind of device.

    ``ideal_s`` is a micro-batch's FLOPs over the peak (the time at 100 % MFU): on a GPU ``mfu x micro_batch_s``
    from the record's own ``mfu``; on a CPU (no datasheet peak, no ``mfu`` in its records) the FLOPs counted
    here over ``cpu_rates``' measured matmul rate (no CPU record counts without it). Same-precision runs are used where there are enough to fit.
    With three or more runs of different sizes both terms are fitted (least squares; the overhead is kept
    >= 0); with fewer, the overhead is 0 and the MFU is the runs' median. None when no record matches."""
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
    """Least-squares (slope, intercept) of y on x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return slope, mean_y - slope * mean_x


def record_point(record: Mapping[str, Any], cpu_rates: CpuRates | None = None) -> tuple[float, float] | None:
    """(ideal_s, micro_batch_s) of a finished record: its micro-batch at 100 % MFU, and as measured. A CPU
    record needs the CPU's rates (``cpu_rates``) to say what 100 % is."""
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
    """The record's GPU, or None for a CPU run (also where a table gave the missing name as NaN)."""
    value = record.get("device_name")
    return value if isinstance(value, str) and value and device_key(value) != CPU else None


def _precision(record: Mapping[str, Any]) -> str | None:
    config = record.get("config")
    return config.get("precision") if isinstance(config, Mapping) else None


# ------------------------------------------------------------------------------------------------ records


def measured_step(record: Mapping[str, Any]) -> dict[str, float] | None:
    """A finished record's measured micro-batch and optimizer-step time and its mean padded sequence length.

    The time is the steady one (``iteration_times.steady_train_s``): an iteration that took several times the
    run's median is counted at the median, since a one-off paid once in a short timed span is not what a step
    costs. ``recorded_micro_batch_s`` is ``train_s``'s own mean, the time the record's ``mfu`` was derived from.
    """
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
    steady_s = steady_train_s(record) or float(train_s)
    micro_s = steady_s / int(iterations)
    repeated = record.get(REPEATED_LENGTH_FIELD)
    if isinstance(repeated, (int, float)) and repeated > 0:
        micro_s = float(repeated)  # first-seen lengths' attention plans left out (see REPEATED_LENGTH_FIELD)
        steady_s = micro_s * int(iterations)
    return {
        "micro_batch_s": micro_s,
        "recorded_micro_batch_s": float(train_s) / int(iterations),
        "step_s": micro_s * accumulation,
        "seq_len": max(1, round(float(padded) / (int(iterations) * int(micro)))),
        "tokens_per_s_padded": float(padded) / steady_s,
    }


def record_spec(record: Mapping[str, Any]) -> TrainingSpec:
    """The TrainingSpec a record ran (its resolved recipe; checkpoint paths resolved as the lab does)."""
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
"""A record counts as host-bound, and so calibrates the per-launch cost, where its measured micro-batch is over
this factor x its predicted device time: there the time is the host's."""

REPEATED_LENGTH_FIELD = "repeated_length_iter_median_s"
"""A record annotated (by ``benchmarks/planner_time_check.py``) with the median of its timed micro-batches whose
padded length the run had seen before: bf16 on Hopper pays a cuDNN attention plan per new length (tens of ms of
host per call, ``benchmarks/speed_diagnosis.py``), which the model leaves out. ``measured_step`` prefers it."""


@dataclass(frozen=True)
class DeviceEfficiency:
    """The two fitted efficiencies of the roofline, with what they were fitted on."""

    matmul: float
    bandwidth: float
    source: str


_OPS_CACHE: dict[str, Any] = {}


def traced_ops(spec: TrainingSpec, seq_len: int):
    """The traced op costs (``op_costs.OpCosts``) of ``spec`` at ``seq_len`` tokens a sample (the mean padded
    length: time follows it), memoised: a leave-one-out check asks each record's ops many times."""
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
    """(spec, OpCosts at the record's mean padded length, measured) of a single-GPU record, or None."""
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


def fit_efficiencies(records: Iterable[Mapping[str, Any]]) -> DeviceEfficiency | None:
    """The matmul and bandwidth efficiencies that make the roofline of each profiled record's traced ops match
    its profile's device busy time per optimizer step (``torch_profile_summary``: the kernels' own time, so no
    host time hides in it); least squares on the log, over a grid of 0.02. None without profiled records."""
    import numpy as np

    from .op_costs import Ops

    points: list[tuple[list[tuple[float, float, float]], float]] = []
    names = []
    for record in map(without_nan, records):
        summary = record.get("torch_profile_summary")
        if not isinstance(summary, Mapping) or not summary.get("device_busy_ms_per_step"):
            continue
        found = _record_ops(record)
        if found is None:
            continue
        spec, ops, _ = found
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
    )


def host_bound_launch_cost(micro_batch_s: float, ops, accumulation: int, gpu_name: str, eff: DeviceEfficiency):
    """The host seconds per kernel launch that one measured micro-batch implies, or None where it is not
    host-bound (under ``HOST_BOUND_MARGIN`` x its traced device time, the optimizer step's share included): the
    measured micro-batch / (its traced kernels + its share of the optimizer step's). ``ops`` is its
    ``op_costs.OpCosts``, ``accumulation`` its micro-batches per optimizer step."""
    device = _device_s(ops.micro_batch, gpu_name, eff) + _device_s(ops.optimizer_step, gpu_name, eff) / accumulation
    if micro_batch_s < HOST_BOUND_MARGIN * device:
        return None
    return micro_batch_s / (ops.kernels_per_micro_batch() + ops.kernels_per_optimizer_step() / accumulation)


def fit_launch_cost(
    records: Iterable[Mapping[str, Any]], gpu_name: str, eff: DeviceEfficiency
) -> tuple[float, str] | None:
    """Host seconds per kernel launch, fitted to host-bound records (``host_bound_launch_cost`` of each), the
    median. Records of this GPU model first (the per-launch cost is the node's: CPU, Python, torch build); else
    every GPU's, which makes it a default, and the source says so. Only the records that can count are traced."""
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
            cost = host_bound_launch_cost(measured["micro_batch_s"], ops, spec.gradient_accumulation_iters, name, eff)
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


def traced_model(
    spec: TrainingSpec,
    gpu_name: str,
    seq_len: int,
    *,
    records: Iterable[Mapping[str, Any]] = (),
    launch_cost_s: float | None = None,
    launch_cost_source: str = "measured on this node",
    efficiency: DeviceEfficiency | None = None,
) -> dict[str, Any] | None:
    """Host and device seconds of one micro-batch and of the optimizer step of ``spec`` on ``gpu_name``, from its
    trace; None where the GPU's bandwidth or peaks are unknown or nothing calibrates the efficiencies and the
    per-launch cost (``predict_time`` then uses the FLOPs model)."""
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
    ops = traced_ops(spec, seq_len)
    kernels_micro, kernels_step = ops.kernels_per_micro_batch(), ops.kernels_per_optimizer_step()
    device_micro = _device_s(ops.micro_batch, gpu_name, eff)
    device_step = _device_s(ops.optimizer_step, gpu_name, eff)
    notes = list(ops.notes)
    if spec.precision.startswith("bf16") and device_key(gpu_name).startswith(("H100", "H200", "GH200")):
        notes.append(
            "not included: on Hopper in bf16, each padded length a run has not seen before builds a cuDNN attention "
            "plan (47-83 ms of host per call, forward and backward, on the H200: benchmarks/speed_diagnosis.py); "
            "predicted is the time on repeated lengths"
        )
    return {
        "host_s": kernels_micro * launch_cost_s,
        "device_s": device_micro,
        "optimizer_step_s": max(kernels_step * launch_cost_s, device_step),
        "kernels_per_micro_batch": kernels_micro,
        "kernels_per_optimizer_step": kernels_step,
        "launch_cost_s": launch_cost_s,
        "launch_cost_source": launch_cost_source,
        "matmul_efficiency": eff.matmul,
        "bandwidth_efficiency": eff.bandwidth,
        "efficiency_source": eff.source,
        "bandwidth": bandwidth,
        "notes": notes,
    }
