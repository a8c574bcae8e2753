"""What the time model (``timing``) takes from measured records, and only from them: the figures it fits.

**The FLOPs model's MFU.** ``mfu_for``: fitted to the lab's own records for the device and method
(``mfu_from_records``: MFU and a fixed per-micro-batch overhead by least squares, records of the same precision
first), else ``MFU_TABLE`` (each figure with its source; today ``DEFAULT_MFU``, an assumption labelled as one).

**The traced model's figures.** ``traced_model``: the per-launch host cost (``fit_launch_cost``: host-bound
records of this GPU, else of any GPU, else a default that says so) and the matmul and bandwidth efficiencies
(``fit_efficiencies``: the device busy time of the records' profiles), each op's cost from the traced step
(``traced_ops``, memoised); and, where bf16 attention on Hopper builds a cuDNN plan per first-seen padded length,
what one plan build adds (``fit_plan_build_s``: the records' first-seen micro-batches over their steady ones).

A record's time is its steady one (``measured_step``: where it holds each micro-batch's length, of the timed ones
that built no plan, at their lengths) and its recipe the TrainingSpec it ran (``record_spec``).
Records are arguments: this module reads no file and probes no hardware.
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


def measured_step(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished record's measured micro-batch and optimizer-step time and its mean padded sequence length.

    Where the record holds the padded length of each micro-batch (``seq_lens``), the time is that of its steady
    timed micro-batches (``steady_micro_batches``: not profiled, and where the run builds attention plans, of lengths
    seen before), their median (a length-grouped run's mean, as ``iteration_times.steady_timing`` takes it), at
    their lengths (``lengths``, ``seq_len`` their mean). Else it is ``iteration_times.steady_train_s``: an
    iteration that took several times the run's median is counted at the median, since a one-off paid once in a
    short timed span is not what a step costs (``lengths`` None). ``recorded_micro_batch_s`` is ``train_s``'s own
    mean, the time the record's ``mfu`` was derived from. None for a plan-building run none of whose timed
    micro-batches repeated a length: its time is mostly plan builds.
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
    """Whether each padded length a run meets for the first time costs it a cuDNN attention plan build (host time:
    ``fit_plan_build_s``): bf16 attention (bf16-true, and bf16-mixed's autocast) on Hopper. fp32
    takes another attention kernel and builds none (``benchmarks/speed_diagnosis.py``)."""
    hopper = gpu_name is not None and device_key(gpu_name).startswith(("H100", "H200", "GH200"))
    return hopper and str(precision or "").startswith("bf16")


def steady_micro_batches(record: Mapping[str, Any]) -> list[tuple[float, int]] | None:
    """(seconds, padded length) of each timed micro-batch a record's steady time is of, read off its ``seq_lens``
    (the padded length of every micro-batch it trained, warm-up included): all of them, or where the run builds
    attention plans (``builds_attention_plans``) those of a length an earlier micro-batch had. Why: a plan build is
    host time the model adds apart (``fit_plan_build_s``); inside a record's time it inflated the per-launch cost
    fitted to it (``benchmarks/planner_padding_check_h200.out.txt``, section 1). None where the record holds no
    lengths for its timed ones."""
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


@dataclass(frozen=True)
class DeviceEfficiency:
    """The two fitted efficiencies of the roofline, with what they were fitted on."""

    matmul: float
    bandwidth: float
    source: str
    gpus: tuple[str, ...] = ()  # the GPU models (``device_key``) of the profiles fitted to: where they are carried from


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


def profiled_length(record: Mapping[str, Any]) -> int | None:
    """The mean padded length of the micro-batches a record's profile covered (``torch_profile_iters``: the first
    profiled one, and the one after the last, which stopped the profiler), read off ``seq_lens``; None without
    them. Why: the profile's device time is of those micro-batches, not of the timed ones (the H200's fp32
    ``small-batch`` profiled two of its longest)."""
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
    """The matmul and bandwidth efficiencies that make the roofline of each profiled record's traced ops match
    its profile's device busy time per optimizer step (``torch_profile_summary``: the kernels' own time, so no
    host time hides in it); least squares on the log, over a grid of 0.02. None without profiled records."""
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
    """The host seconds per kernel launch that one measured micro-batch implies, or None where it is not
    host-bound (under ``HOST_BOUND_MARGIN`` x its traced device time, the optimizer step's share included): the
    measured micro-batch / (its traced kernels + its share of the optimizer step's). ``ops`` is its
    ``op_costs.OpCosts``, ``accumulation`` its micro-batches per optimizer step; ``longest`` (the ops of its
    longest micro-batch, where the lengths are known) is what must be host-bound: where only the short ones are,
    the time holds device-bound micro-batches that the per-launch cost would absorb (a length-grouped run)."""
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
"""Micro-batches of many lengths are traced at multiples of this many tokens (and at the shortest and longest) and
read off the straight line between: a traced step's kernels, FLOPs and bytes grow nearly linearly with the length
(attention's quadratic share is a few % at 512 tokens), and tracing each of a pass's 130-170 distinct lengths
would take minutes."""


def length_costs(spec: TrainingSpec, gpu_name: str, eff: DeviceEfficiency, lengths: Sequence[int]) -> tuple[Any, Any]:
    """(kernels, device seconds) of one micro-batch of ``spec`` at each of ``lengths`` (padded tokens a sample), as
    two numpy arrays: traced at ``LENGTH_GRID``'s lengths, interpolated between."""
    import numpy as np

    low, high = min(lengths), max(lengths)
    grid = sorted({low, high, *range((low // LENGTH_GRID + 1) * LENGTH_GRID, high, LENGTH_GRID)})
    ops = [traced_ops(spec, n) for n in grid]
    kernels = [op.kernels_per_micro_batch() for op in ops]
    device = [_device_s(op.micro_batch, gpu_name, eff) for op in ops]
    return np.interp(lengths, grid, kernels), np.interp(lengths, grid, device)


def fit_plan_build_s(records: Iterable[Mapping[str, Any]], gpu_name: str) -> tuple[float, str] | None:
    """Host seconds a micro-batch of a first-seen length adds where the run builds attention plans: the median over
    this GPU's single-device plan-building records of ``iteration_times.length_split``'s ``first_seen_extra_s``
    (their median first-seen micro-batch over their steady one). None without such records."""
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
    """Host and device seconds of a micro-batch and of the optimizer step of ``spec`` on ``gpu_name``, from its
    trace; None where the GPU's bandwidth or peaks are unknown or nothing calibrates the efficiencies and the
    per-launch cost (``predict_time`` then uses the FLOPs model).

    ``lengths`` are the micro-batches' padded lengths (default: ``seq_len`` alone): each takes the larger of its
    own host and device time, and ``micro_s`` is their mean, since a short micro-batch is host-bound where a long
    one is device-bound and the mean length would hide it. ``first_seen`` of them have a length the run had not
    met: where the GPU builds attention plans, each adds ``plan_build_s`` (``fit_plan_build_s``), spread over
    the micro-batches. ``launches_saved`` per micro-batch come off the host's launches (compiled blocks:
    ``levers.launches_saved``); ``plan_builds`` False: the attention backend builds none (``levers.Levers``)."""
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
    """(seconds a plan build adds, its source, a note) for a plan-building run: the note says what was added."""
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
