"""Predict a step's time and tokens/s before the run: the traced model on a GPU, the FLOPs model on a CPU or where
nothing calibrates the trace.

The traced model. The tracer runs the real step on fake tensors (``tracer``) and ``op_costs`` reads each op's
FLOPs, bytes and kernel launches off its shapes. Per micro-batch:

    host_s   = kernels launched x the per-launch host cost
    device_s = sum over ops of max(FLOPs / (unit peak x matmul efficiency), bytes / (bandwidth x its efficiency))
    micro_batch_s = max(host_s, device_s)            (the host runs ahead until the queue is full)
                  + plan builds x first-seen lengths / micro-batches   (bf16 attention on Hopper)
    step_s   = accumulation x micro_batch_s + optimizer step + communication + offload

Each micro-batch is timed at its own padded length: a short one can be host-bound where a long one is
device-bound, and at the mean length a length-grouped pass's long micro-batches average away
(benchmarks/planner_padding_check_h200.out.txt). Only four figures are fitted: the per-launch cost (or measured by
``python -m lab_helpers launch-cost``), the two efficiencies (from the records' profiles) and a cuDNN plan build's
host time. Not modelled: communication overlapping compute, kernel fusion.

The FLOPs model: (model FLOPs + recomputed forward) / (dense peak x MFU) + a per-micro-batch overhead. The FLOPs
are counted exactly (``flops``) and the peak is in ``gpu_peaks``; what is left, the MFU litgpt reaches, every
record carries, so ``mfu_for`` fits MFU and overhead to this device's and method's records, else takes
``MFU_TABLE``'s labelled assumption. A CPU's peak is its measured fp32 matmul rate (``cpu_speed``).

Communication is divided by the bus bandwidth given and added, not overlapped: an upper bound. MFU and overhead
are fitted to single-device records only, so no communication hides in them. Offload adds the host's Adam step
(torch's Adam rate: a lower bound on DeepSpeedCPUAdam's) and its PCIe transfers. Every hardware fact is an
argument: this module reads no records file and probes nothing (``plan_command.predict_step_time`` gathers them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab_helpers.hardware.cpu_speed import CpuRates
from lab_helpers.hardware.gpu_peaks import dense_peak_flops
from lab_helpers.planning.flops import train_flops_per_step

from .calibration import (
    CPU,
    Efficiency,
    builds_attention_plans,
    device_key,
    gpu_name_of,
    measured_step,
    mfu_for,
    record_spec,
    traced_model,
    traced_ops,
    without_nan,
)
from .communication import CommunicationVolume, communication_per_optimizer_step, host_device_bytes_per_optimizer_step
from .errors import PlanError
from .levers import launches_saved
from .spec import TrainingSpec, precision_bytes

if TYPE_CHECKING:  # annotations only: no import at run time
    from .calibration import DeviceEfficiency
    from .levers import Levers


PCIE4_X16_GBS = 31.5
"""PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction. Pinned copies reach less, so the
transfer time is a lower bound."""


@dataclass
class TimePlan:
    """Every device of a data-parallel run does the same; ``tokens_per_s_padded`` is per device, comparable with a
    record's (rank 0)."""

    step_s: float
    micro_batch_s: float
    optimizer_host_s: float
    tokens_per_s_padded: float
    model_flops_per_micro_batch: float
    hardware_flops_per_micro_batch: float
    peak_flops_per_s: float
    mfu: float
    overhead_s: float  # fixed seconds per micro-batch, fitted from records (0 from the table)
    mfu_source: str
    device_name: str
    gradient_accumulation_iters: int
    micro_batch_size: int
    seq_len: int
    notes: list[str] = field(default_factory=list)
    # the step's four terms (seconds per optimizer step; they add up to step_s)
    compute_s: float = 0.0  # accumulation x FLOPs / (peak x MFU)
    host_overhead_s: float = 0.0  # accumulation x overhead_s
    communication_s: float = 0.0  # link_bytes_per_gpu / link bandwidth (0 on one device or with no bandwidth)
    offload_s: float = 0.0  # host Adam step (optimizer_host_s) + host-device transfers (offload_transfer_s)
    offload_transfer_s: float = 0.0
    strategy: str = "single"
    devices: int = 1
    link_gbs: float | None = None  # bus bandwidth the communication term used
    link_gbs_source: str = ""
    communication_bytes_per_gpu: float = 0.0
    communication: str = ""  # the collectives, in words (communication.CommunicationVolume.describe)
    # the traced model (GPU with records to calibrate it): host and device per micro-batch, the larger bounds it
    host_ms_per_micro_batch: float | None = None  # kernels launched x the per-launch host cost
    device_ms_per_micro_batch: float | None = None  # roofline of the traced ops
    time_bound: str | None = None  # "host" or "device" (a micro-batch is the larger of the two)
    kernels_per_micro_batch: float | None = None  # ops that launch a GPU kernel, counted in the trace
    kernels_per_optimizer_step: float | None = None
    optimizer_step_ms: float | None = None  # once per optimizer step: the larger of its host and device time
    launch_cost_us: float | None = None  # host seconds per kernel launch x 1e6
    launch_cost_source: str = ""
    plan_build_ms: float | None = None  # host ms a first-seen padded length adds (bf16 attention on Hopper)
    plan_build_source: str = ""
    first_seen_lengths: int | None = None  # micro-batches of a length not met before, among the ones predicted
    micro_batches_predicted: int | None = None  # how many micro-batch lengths the prediction averaged
    matmul_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    efficiency_source: str = ""
    memory_bandwidth_gbs: float | None = None
    launches_saved_per_micro_batch: float | None = None  # what the levers take off the host (compiled blocks)
    compile_factor: float | None = None  # a block's launches compiled / eager, measured (levers.CompiledBlock)
    sources: dict[str, str] = field(default_factory=dict)  # each part of the prediction: measured here or carried

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        if self.time_bound is not None:
            return (
                f"predicted step {self.step_s:.3g} s, {self.tokens_per_s_padded:,.0f} tokens/s per device on "
                f"{self.device_name}, {self.time_bound}-bound (host {self.host_ms_per_micro_batch:.1f} ms, device "
                f"{self.device_ms_per_micro_batch:.1f} ms per micro-batch; MFU {self.mfu:.1%}) (launch cost: "
                f"{self.launch_cost_source}; efficiencies: {self.efficiency_source})"
            )
        fixed = f" + {self.overhead_s * 1000:.3g} ms per micro-batch" if self.overhead_s else ""
        # a CPU has no dense peak in the lab's table: its "MFU" is a fitted rate (04 printed "MFU 136.6%")
        rate = f"at MFU {self.mfu:.1%}" if self.device_name != CPU else "(code path only, no MFU on a CPU)"
        return (
            f"predicted step {self.step_s:.3g} s, {self.tokens_per_s_padded:,.0f} tokens/s per device on "
            f"{self.device_name} {rate}{fixed} ({self.mfu_source})"
        )

    def split(self) -> str:
        """On a CPU, where its launches were counted, host and device add up: one core does both."""
        if self.time_bound is None and self.kernels_per_micro_batch is not None:
            return (
                f"per micro-batch: host {self.host_ms_per_micro_batch:.1f} ms ({self.kernels_per_micro_batch:,.0f} "
                f"kernel launches; the fitted overhead in proportion), compute {self.device_ms_per_micro_batch:.1f} "
                f"ms: one core does both, so they add up (no bound); optimizer step {self.kernels_per_optimizer_step:,.0f} "
                "launches (inside the fitted overhead, not timed apart)"
            )
        if self.time_bound is None:
            return ""
        plans = ""
        if self.first_seen_lengths and self.plan_build_ms:
            plans = (f"; {self.first_seen_lengths} of {self.micro_batches_predicted} micro-batches of a first-seen "
                     f"length, +{self.plan_build_ms:.0f} ms each (attention plan builds)")  # fmt: skip
        return (
            f"per micro-batch: host {self.host_ms_per_micro_batch:.1f} ms ({self.kernels_per_micro_batch:,.0f} "
            f"kernel launches x {self.launch_cost_us:.1f} us), device {self.device_ms_per_micro_batch:.1f} ms "
            f"(roofline of the traced ops at matmul efficiency {self.matmul_efficiency:.2f}, bandwidth efficiency "
            f"{self.bandwidth_efficiency:.2f} of {self.memory_bandwidth_gbs:,.0f} GB/s): {self.time_bound}-bound{plans}; "
            f"optimizer step {self.optimizer_step_ms:.1f} ms once per step"
        )

    def terms(self) -> str:
        link = f" at {self.link_gbs:.3g} GB/s ({self.link_gbs_source})" if self.link_gbs else ""
        return (
            f"step {self.step_s:.3g} s = compute {self.compute_s:.3g} + host overhead {self.host_overhead_s:.3g} + "
            f"communication {self.communication_s:.3g}{link} + offload {self.offload_s:.3g} s; "
            f"{self.gradient_accumulation_iters} micro-batch(es) of {self.micro_batch_size} x {self.seq_len} tokens "
            f"per step on each of {self.devices} device(s), {self.strategy}"
        )


# ------------------------------------------------------------------------------------------------ predicting


def predict_time(
    spec: TrainingSpec,
    *,
    gpu_name: str | None = None,
    records: Iterable[Mapping[str, Any]] = (),
    cpu_rates: CpuRates | None = None,
    mfu: float | None = None,
    seq_len: int | None = None,
    sample_lengths: Sequence[int] | None = None,
    batch_lengths: Sequence[int] | None = None,
    first_seen: int | None = None,
    link_gbs: float | None = None,
    link_gbs_source: str = "given",
    host_link_gbs: float = PCIE4_X16_GBS,
    launch_cost_s: float | None = None,
    launch_cost_source: str = "measured on this node",
    device_efficiency: DeviceEfficiency | None = None,
    levers: Levers | None = None,
) -> TimePlan:
    """The traced model on a GPU with ``records`` to calibrate it; given ``mfu``, or on a CPU, the FLOPs model.

    ``seq_len`` is the mean padded length of a micro-batch (time follows the mean, memory the worst case,
    ``spec.seq_len``); ``sample_lengths`` gives it instead, and ``batch_lengths`` (each micro-batch's padded length in
    run order) times each micro-batch apart, ``first_seen`` of them costing a plan build (default: each distinct length
    once). ``link_gbs`` is the bus bandwidth between devices (nccl-tests' busbw); without it there is no communication
    term, and a note says so. ``launch_cost_s`` is measured on this node, else fitted to the records."""
    spec.validate()
    records = list(records)
    if batch_lengths is not None:
        if not batch_lengths or min(batch_lengths) < 1:
            raise PlanError("batch_lengths must be a non-empty list of padded lengths >= 1")
        seq_len = max(1, round(sum(batch_lengths) / len(batch_lengths)))
        first_seen = len(set(batch_lengths)) if first_seen is None else first_seen
    elif seq_len is None and sample_lengths is not None:
        seq_len = mean_padded_length(sample_lengths, spec.micro_batch_size, spec.seq_len)
    seq = int(seq_len or spec.seq_len)
    if link_gbs is not None and not link_gbs > 0:
        raise PlanError(f"link bandwidth must be > 0 GB/s, got {link_gbs}")
    if seq < 1:
        raise PlanError(f"seq_len must be >= 1, got {seq}")
    device = CPU if spec.device == CPU else gpu_name
    if not device:
        raise PlanError("no GPU to predict time for: name one with --gpu-name (e.g. 'NVIDIA A100-SXM4-80GB')")
    if cpu_rates is None and (device == CPU or spec.offload_optimizer):
        what = "a CPU step" if device == CPU else "optimizer offload's host step"
        raise PlanError(f"{what} needs the CPU's measured rates: pass cpu_rates (cpu_speed.measure_cpu_rates())")
    notes: list[str] = []
    peak = _peak_flops(spec, device, cpu_rates)
    efficiency = _efficiency(spec, device, mfu, records, cpu_rates)
    used_mfu, source = efficiency.mfu, efficiency.source
    model_flops = train_flops_per_step(
        spec.model_config,
        method=spec.method,
        lora=spec.lora or None,
        micro_batch_size=spec.micro_batch_size,
        seq_len=seq,
    )
    hardware_flops = model_flops + (recompute_flops(model_flops, spec.method) if spec.activation_checkpointing else 0)
    compute_micro_s = hardware_flops / (peak * used_mfu)
    micro_s = compute_micro_s + efficiency.overhead_s
    accumulation = spec.gradient_accumulation_iters
    saved, saved_note = launches_saved(spec, seq, levers) if levers is not None else (0.0, "")
    if saved_note:
        notes.append(saved_note)
    if levers is not None and not levers.builds_plans and builds_attention_plans(spec.precision, device):
        notes.append(f"attention backend {levers.attention_backend}: no cuDNN plan build per first-seen length")
    traced = None
    if device != CPU and mfu is None:
        traced = traced_model(
            spec,
            device,
            seq,
            records=records,
            launch_cost_s=launch_cost_s,
            launch_cost_source=launch_cost_source,
            efficiency=device_efficiency,
            lengths=batch_lengths,
            first_seen=first_seen or 0,
            launches_saved=saved,
            plan_builds=levers is None or levers.builds_plans,
        )
    cpu_split = {}
    if device == CPU and levers is not None:
        efficiency, cpu_split = _cpu_launches(spec, seq, efficiency, compute_micro_s, saved)
        micro_s = compute_micro_s + efficiency.overhead_s
    optimizer_s = 0.0
    if traced is not None:
        optimizer_s = traced["optimizer_step_s"]
        micro_s = traced["micro_s"]
        compute_micro_s = traced["device_s"]
        used_mfu = model_flops / (peak * micro_s)
        source = "the traced model (host and device per micro-batch)"
        efficiency = Efficiency(used_mfu, micro_s - compute_micro_s, source)
        notes.extend(traced["notes"])
    volume, communication_s = _communication(spec, link_gbs, notes)
    host_s, transfer_s = _offload_s(spec, device, cpu_rates, accumulation, host_link_gbs, notes)
    step_s = accumulation * micro_s + optimizer_s + communication_s + host_s + transfer_s
    tokens = spec.micro_batch_size * seq * accumulation
    split = _traced_fields(traced, optimizer_s) or cpu_split
    return TimePlan(
        **split,
        launches_saved_per_micro_batch=saved if levers is not None else None,
        compile_factor=levers.compiled.factor if levers is not None and levers.compiled is not None else None,
        sources=_sources(device, traced, levers, source, cpu_rates),
        compute_s=accumulation * compute_micro_s + (optimizer_s if traced is not None else 0.0),
        host_overhead_s=accumulation * efficiency.overhead_s,
        communication_s=communication_s,
        offload_s=host_s + transfer_s,
        offload_transfer_s=transfer_s,
        strategy=spec.strategy,
        devices=spec.devices,
        link_gbs=link_gbs if volume.link_bytes_per_gpu else None,
        link_gbs_source=link_gbs_source if volume.link_bytes_per_gpu and link_gbs else "",
        communication_bytes_per_gpu=volume.link_bytes_per_gpu,
        communication=volume.describe(),
        step_s=step_s,
        micro_batch_s=micro_s,
        optimizer_host_s=host_s,
        tokens_per_s_padded=tokens / step_s,
        model_flops_per_micro_batch=model_flops,
        hardware_flops_per_micro_batch=hardware_flops,
        peak_flops_per_s=peak,
        mfu=used_mfu,
        overhead_s=efficiency.overhead_s,
        mfu_source=source,
        device_name=device,
        gradient_accumulation_iters=accumulation,
        micro_batch_size=spec.micro_batch_size,
        seq_len=seq,
        notes=notes,
    )


def _cpu_launches(
    spec: TrainingSpec, seq: int, efficiency: Efficiency, compute_s: float, saved: float
) -> tuple[Efficiency, dict[str, Any]]:
    """One core is host and device, so the two add up: the fitted overhead is taken as the launches' host time and
    shrinks in proportion where a lever launches fewer."""
    eager = traced_ops(spec, seq).kernels_per_micro_batch()
    kernels = max(eager - saved, 0.0)
    overhead = efficiency.overhead_s * kernels / eager if eager else efficiency.overhead_s
    fields = {
        "kernels_per_micro_batch": kernels,
        "host_ms_per_micro_batch": overhead * 1e3,
        "device_ms_per_micro_batch": compute_s * 1e3,
        "kernels_per_optimizer_step": traced_ops(spec, seq).kernels_per_optimizer_step(),
    }
    return dataclasses.replace(efficiency, overhead_s=overhead), fields


def _sources(
    device: str, traced: dict[str, Any] | None, levers: Levers | None, fitted: str, cpu_rates: CpuRates | None
) -> dict[str, str]:
    here = "measured on this machine"
    sources = {"kernels per micro-batch": "traced on this machine (the real step on fake tensors)"}
    if levers is not None and levers.compiled is not None:
        carried = "" if device == CPU else f"; carried over to the {device} (CUDA's inductor fuses its own way)"
        sources["compile factor"] = f"{levers.compiled.source}{carried}"
        if levers.cuda_graphs:
            sources["CUDA graphs"] = (
                "a model, not a measurement: one graph replay per compiled block, forward and backward"
            )
    if traced is None:
        if device == CPU and cpu_rates is not None:
            sources["compute rate"] = f"{here} (fp32 matmul rate, cpu_speed)"
        sources["MFU and host overhead"] = f"carried from records: {fitted}"
        return sources
    cost = traced["launch_cost_source"]
    sources["per-launch host cost"] = cost if cost.startswith("measured") else f"carried from records: {cost}"
    gpus = " and ".join(traced["efficiency_gpus"]) or "other GPUs"
    sources["device efficiencies"] = f"carried from the {gpus}'s profiles: {traced['efficiency_source']}"
    if traced["plan_build_source"]:
        sources["plan build"] = f"carried from records: {traced['plan_build_source']}"
    return sources


def _peak_flops(spec: TrainingSpec, device: str, cpu_rates: CpuRates | None) -> float:
    if device == CPU:
        peak = cpu_rates.matmul_flops_per_s
    else:
        peak = dense_peak_flops(device, spec.precision)
        if peak is None:
            raise PlanError(
                f"no dense peak for {device!r} at {spec.precision} in lab_helpers.hardware.gpu_peaks: time cannot be predicted"
            )
    return peak


def _efficiency(
    spec: TrainingSpec,
    device: str,
    mfu: float | None,
    records: list,
    cpu_rates: CpuRates | None,
) -> Efficiency:
    if mfu is not None:
        if not 0 < mfu <= 1:
            raise PlanError(f"mfu must be in (0, 1], got {mfu}")
        efficiency = Efficiency(float(mfu), 0.0, "given")
    else:
        efficiency = mfu_for(device, spec.method, spec.precision, records=records, cpu_rates=cpu_rates)
    return efficiency


def _communication(spec: TrainingSpec, link_gbs: float | None, notes: list[str]) -> tuple[CommunicationVolume, float]:
    volume = step_communication(spec)
    communication_s = 0.0
    if volume.link_bytes_per_gpu and link_gbs is None:
        notes.append(
            "communication between devices not included: no link bandwidth (pass --link-gbs, or measure this "
            "node's with `python -m lab_helpers bandwidth`)"
        )
    elif volume.link_bytes_per_gpu:
        communication_s = volume.link_bytes_per_gpu / (link_gbs * 1e9)
        notes.append(f"communication: {volume.describe()}; not overlapped with compute (an upper bound)")
    return volume, communication_s


def _offload_s(
    spec: TrainingSpec,
    device: str,
    cpu_rates: CpuRates | None,
    accumulation: int,
    host_link_gbs: float,
    notes: list[str],
) -> tuple[float, float]:
    host_s = transfer_s = 0.0
    if spec.offload_optimizer:
        trainable = trainable_params(spec)
        host_s = trainable / cpu_rates.adam_params_per_s
        notes.append("host optimizer step from the host's measured torch Adam rate")
        if device != CPU:  # on a CPU the "device" is the host: nothing to copy
            traffic = host_device_bytes_per_optimizer_step(
                trainable_parameter_count=trainable,
                bytes_per_parameter=_bytes_per_parameter(spec.precision),
                world_size=spec.devices,
                micro_batches_per_step=accumulation,
            )
            transfer_s = traffic.total_bytes / (host_link_gbs * 1e9)
    return host_s, transfer_s


def _traced_fields(traced: dict[str, Any] | None, optimizer_s: float) -> dict[str, Any]:
    split = {}
    if traced is not None:
        split = {
            "host_ms_per_micro_batch": traced["host_s"] * 1e3,
            "device_ms_per_micro_batch": traced["device_s"] * 1e3,
            "time_bound": "host" if traced["host_s"] > traced["device_s"] else "device",
            "kernels_per_micro_batch": traced["kernels_per_micro_batch"],
            "kernels_per_optimizer_step": traced["kernels_per_optimizer_step"],
            "optimizer_step_ms": optimizer_s * 1e3,
            "launch_cost_us": traced["launch_cost_s"] * 1e6,
            "launch_cost_source": traced["launch_cost_source"],
            "plan_build_ms": traced["plan_build_s"] * 1e3 if traced["plan_build_source"] else None,
            "plan_build_source": traced["plan_build_source"],
            "first_seen_lengths": traced["first_seen"],
            "micro_batches_predicted": traced["micro_batches"],
            "matmul_efficiency": traced["matmul_efficiency"],
            "bandwidth_efficiency": traced["bandwidth_efficiency"],
            "efficiency_source": traced["efficiency_source"],
            "memory_bandwidth_gbs": traced["bandwidth"] / 1e9,
        }
    return split


def mean_padded_length(sample_lengths: Sequence[int], micro_batch_size: int, max_seq_length: int) -> int:
    """litgpt pads a batch to its longest sample, so a batch of ``k`` samples costs the expected maximum of ``k``
    lengths, not the mean: P(max <= l_(i)) = (i/n)^k over the n sorted lengths (drawn with replacement)."""
    lengths = sorted(min(int(n), max_seq_length) for n in sample_lengths)
    if not lengths or lengths[0] < 1:
        raise PlanError("sample lengths must be a non-empty list of token counts >= 1")
    n, k = len(lengths), int(micro_batch_size)
    expected = sum(length * ((i / n) ** k - ((i - 1) / n) ** k) for i, length in enumerate(lengths, start=1))
    return max(1, round(expected))


def step_communication(spec: TrainingSpec) -> CommunicationVolume:
    if spec.devices == 1:
        return communication_per_optimizer_step(
            strategy="single", parameter_count=0, bytes_per_parameter=1, world_size=1, micro_batches_per_step=1
        )
    total, trainable = _parameter_counts(spec)
    return communication_per_optimizer_step(
        strategy=spec.strategy,
        parameter_count=total,
        bytes_per_parameter=_bytes_per_parameter(spec.precision),
        world_size=spec.devices,
        micro_batches_per_step=spec.gradient_accumulation_iters,
        sharding=None if spec.strategy != "fsdp" else ("full" if spec.fsdp_reshard_after_forward else "grad-op"),
        trainable_parameter_count=trainable,
        wrapping=None if spec.strategy != "fsdp" else ("block" if spec.fsdp_wrap_blocks else "none"),
        root_parameter_count=_outside_blocks(spec) if spec.strategy == "fsdp" and spec.fsdp_wrap_blocks else 0,
        fsdp_impl=spec.fsdp_impl if spec.strategy == "fsdp" else None,
    )


def _bytes_per_parameter(precision: str) -> int:
    """Mixed precision keeps fp32 weights and gradients: they travel in fp32."""
    return precision_bytes(precision)


def recompute_flops(model_flops: float, method: str) -> float:
    """One more forward: 1/3 of a full step (forward, input and weight gradients 2N each), 1/2 of a LoRA step."""
    return model_flops / (3 if method == "full" else 2)


def trainable_params(spec: TrainingSpec) -> int:
    return _parameter_counts(spec)[1]


def _outside_blocks(spec: TrainingSpec) -> int:
    """FSDP's root unit when it wraps per block (embedding, final norm, head)."""
    import torch
    from litgpt import GPT

    with torch.device("meta"):
        model = GPT(spec.model_config)
    inside = sum(p.numel() for p in model.transformer.h.parameters())
    return sum(p.numel() for p in model.parameters()) - inside


def _parameter_counts(spec: TrainingSpec) -> tuple[int, int]:
    import torch

    with torch.device("meta"):
        if spec.method == "full":
            from litgpt import GPT

            model = GPT(spec.model_config)
        else:
            from litgpt.lora import GPT, mark_only_lora_as_trainable

            model = GPT(spec.model_config)
            mark_only_lora_as_trainable(model)
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def predicted_vs_measured(
    records: Iterable[Mapping[str, Any]],
    *,
    leave_one_out: bool = True,
    mfu_records: Iterable[Mapping] | None = None,
    cpu_rates: CpuRates | None = None,
) -> list[dict[str, Any]]:
    """Measured against predicted step time per finished record, at the record's own padded lengths. With
    ``leave_one_out`` the record is left out of the MFU fit: a prediction, not the record fitted to itself. Records the
    planner cannot read are skipped."""
    records = [without_nan(record) for record in records]
    pool = [without_nan(record) for record in mfu_records] if mfu_records is not None else records
    rows = []
    for record in records:
        measured = measured_step(record)
        if measured is None:
            continue
        try:
            spec = record_spec(record)
        except (PlanError, OSError, ValueError, KeyError, TypeError):
            continue
        others = [r for r in pool if r is not record and r != record] if leave_one_out else pool
        device = gpu_name_of(record) or CPU
        try:
            plan = predict_time(
                spec,
                gpu_name=device if device != CPU else None,
                records=others,
                cpu_rates=cpu_rates,
                seq_len=measured["seq_len"],
                batch_lengths=measured["lengths"],
                first_seen=0,  # the measured time is a steady one: no plan builds in it (measured_step)
            )
        except PlanError:
            continue
        rows.append(
            {
                "experiment": record.get("experiment"),
                "device": device_key(device),
                "method": spec.method,
                "precision": spec.precision,
                "measured_step_s": measured["step_s"],
                "predicted_step_s": plan.step_s,
                "error_pct": (plan.step_s - measured["step_s"]) / measured["step_s"] * 100,
                "measured_tokens_per_s": measured["tokens_per_s_padded"],
                "predicted_tokens_per_s": plan.tokens_per_s_padded,
                "mfu": plan.mfu,
                "mfu_source": plan.mfu_source,
                "host_ms_per_micro_batch": plan.host_ms_per_micro_batch,
                "device_ms_per_micro_batch": plan.device_ms_per_micro_batch,
                "time_bound": plan.time_bound,
                "kernels_per_micro_batch": plan.kernels_per_micro_batch,
                "launch_cost_us": plan.launch_cost_us,
                "launch_cost_source": plan.launch_cost_source,
                "plan_build_ms": plan.plan_build_ms,
                "matmul_efficiency": plan.matmul_efficiency,
                "bandwidth_efficiency": plan.bandwidth_efficiency,
                "efficiency_source": plan.efficiency_source,
                "measured_micro_batch_s": measured["micro_batch_s"],
                "predicted_micro_batch_s": plan.step_s / plan.gradient_accumulation_iters,
                "gradient_accumulation_iters": plan.gradient_accumulation_iters,
            }
        )
    return rows
