"""``predict``: trace the step, apply the strategy's analytic terms, and report per-GPU memory."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab_helpers.config.record_schema import BREAKDOWN_PARTS, GIB

from . import analytic, ops_cache, whole_run
from ._compat import check_tracing_supported
from .errors import PlanError, PlannerUnavailable
from .spec import TrainingSpec, spec_from_recipe
from .tracer import trace


@dataclass
class MemoryPlan:
    """``peak_alloc_gib``: the training loop's peak from the start of ``fit`` (validation and generation inside it),
    what the lab records, comparable with ``max_memory_allocated`` per GPU; the breakdown's parts but
    ``cuda_context`` sum to it. ``whole_run_peak_alloc_gib`` adds the checkpoint load and QLoRA's quantization
    (what litgpt prints). ``gpu_used_gib`` is comparable with NVML's "used"."""

    peak_alloc_gib: float
    breakdown_gib: dict[str, float]
    host_gib: float
    gpu_memory_gib: float | None
    gpu_used_gib: float = 0.0
    peak_phase: str = ""
    method: str = ""
    strategy: str = "single"
    devices: int = 1
    micro_batch_size: int = 1
    seq_len: int = 0
    precision: str = ""
    model_name: str = ""
    total_params: int = 0
    trainable_params: int = 0
    trace_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    whole_run_peak_alloc_gib: float = 0.0
    whole_run_peak_phase: str = ""
    whole_run_gpu_used_gib: float = 0.0
    peaks_by_phase_gib: dict[str, float] = field(default_factory=dict)
    # how the optimizer steps (spec.STEP_IMPLEMENTATIONS: foreach | for-loop | fused), as the run will; None where
    # the step is not a torch optimizer's (QLoRA's paged AdamW, 8-bit AdamW, DeepSpeed)
    optimizer_step: str | None = None

    def to_dict(self) -> dict:
        """The fields and ``fits``, JSON-clean: what a record's ``predicted`` and ``plan --json`` hold."""
        return json.loads(json.dumps({**asdict(self), "fits": self.fits}))

    @property
    def fits(self) -> bool | None:
        """None where the GPU's size is unknown."""
        return None if self.gpu_memory_gib is None else self.worst_gpu_used_gib <= self.gpu_memory_gib

    @property
    def worst_gpu_used_gib(self) -> float:
        """A run that dies while loading is an OOM too."""
        return max(self.gpu_used_gib, self.whole_run_gpu_used_gib)

    def summary(self) -> str:
        where = f" per GPU x{self.devices}" if self.devices > 1 else ""
        if self.gpu_memory_gib is None:
            verdict = "GPU size unknown"
            of = ""
        else:
            verdict = "fits" if self.fits else "will OOM"
            of = f" of {self.gpu_memory_gib:.1f} GiB"
        whole = ""
        if self.whole_run_peak_alloc_gib > self.peak_alloc_gib:
            whole = f"; whole run {self.whole_run_peak_alloc_gib:.1f} GiB (in {self.whole_run_peak_phase})"
        return (
            f"predicted peak {self.peak_alloc_gib:.1f} GiB allocated ({self.gpu_used_gib:.1f} GiB used{of})"
            f"{whole}{where}: {verdict}"
        )


_CACHE: dict[str, MemoryPlan] = {}
_CACHE_SIZE = 64


def predict(spec: TrainingSpec) -> MemoryPlan:
    """Memoized per spec (notebooks ask again, OOM demonstrations try a few batch sizes); a copy each time."""
    spec.validate()
    check_tracing_supported()  # before the memo: a torch upgrade must fail loudly even for a remembered spec
    key = repr(spec)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _kept_on_disk(key, spec)
    return copy.deepcopy(_CACHE[key])


def _kept_on_disk(key: str, spec: TrainingSpec) -> MemoryPlan:
    """Kept between processes (``ops_cache``); a miss or a refused entry traces again and replaces it."""
    on_disk = ops_cache.key_for(f"memory plan\0{key}", int(spec.seq_len or 0))
    kept = ops_cache.load_json(on_disk)
    if kept is not None:
        plan = kept_plan(kept, spec)
        if isinstance(plan, MemoryPlan):
            return plan
        ops_cache.refused(on_disk, plan)
    plan = _predict(spec)
    try:
        data = json.loads(json.dumps(asdict(plan)))  # the fields: ``fits`` is derived again from them
    except (TypeError, ValueError):  # a value JSON cannot hold (numpy's bool, from a GPU size given as numpy): not kept
        return plan
    ops_cache.store_json(on_disk, data)
    return plan


_ECHOED = ("method", "strategy", "devices", "micro_batch_size", "seq_len", "precision", "gpu_memory_gib",
           "optimizer_step")  # fmt: skip
"""A plan's fields that repeat its spec's: a kept plan must have them as the spec does (the same type too)."""
_GIB_FIELDS = ("peak_alloc_gib", "host_gib", "gpu_used_gib", "trace_seconds", "whole_run_peak_alloc_gib",
               "whole_run_gpu_used_gib")  # fmt: skip
_TEXT_FIELDS = ("peak_phase", "model_name", "whole_run_peak_phase")
_ROUNDING_GIB = 1e-4  # breakdown_gib and peaks_by_phase_gib are rounded to 4 places


def kept_plan(data: Any, spec: TrainingSpec) -> MemoryPlan | str:
    """Only a plan ``_predict(spec)`` could have made (types, the spec's own values, finite sizes summing to the peak,
    no more and no fewer fields), else why not: an edited entry must not print NaN, or 7.5 GiB for a 0.035 GiB run."""
    if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(MemoryPlan)}:
        return "not MemoryPlan's fields"
    expected = {name: getattr(spec, name) for name in _ECHOED} | {"model_name": str(spec.model_config.name)}
    for name, value in expected.items():
        if data[name] != value or type(data[name]) is not type(value):
            return f"{name} {data[name]!r} is not the spec's {value!r}"
    if not all(_size(data[name]) for name in _GIB_FIELDS):
        return "a size that is no finite number >= 0"
    if not all(isinstance(data[name], str) for name in _TEXT_FIELDS) or not _texts(data["notes"]):
        return "a name or note that is not text"
    if not all(_whole(data[name]) for name in ("total_params", "trainable_params")):
        return "a parameter count that is no whole number >= 0"
    breakdown, phases = data["breakdown_gib"], data["peaks_by_phase_gib"]
    if not isinstance(breakdown, dict) or set(breakdown) != set(BREAKDOWN_PARTS):
        return "a breakdown not of BREAKDOWN_PARTS"
    if not all(map(_size, breakdown.values())):
        return "a breakdown part that is no finite number >= 0"
    if not isinstance(phases, dict) or not phases or not all(map(_size, phases.values())):
        return "peaks by phase that are no finite numbers >= 0"
    peak, whole = data["peak_alloc_gib"], data["whole_run_peak_alloc_gib"]
    parts = sum(v for k, v in breakdown.items() if k != "cuda_context")
    context = round(analytic.CUDA_CONTEXT_BYTES / GIB, 4) if spec.device == "cuda" else 0.0
    if abs(parts - peak) > _ROUNDING_GIB * len(breakdown) or abs(breakdown["cuda_context"] - context) > _ROUNDING_GIB:
        return f"a breakdown summing to {parts:.4g} GiB, not the peak {peak:.4g} GiB"
    if whole < peak - _ROUNDING_GIB or abs(max(phases.values()) - whole) > _ROUNDING_GIB:
        return f"a whole-run peak {whole:.4g} GiB that is not its phases' largest"
    if data["gpu_used_gib"] < peak - _ROUNDING_GIB or data["trainable_params"] > data["total_params"]:
        return "GPU memory used below the peak, or more trainable parameters than parameters"
    return MemoryPlan(**data)


def _size(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _texts(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(value, str) for value in values)


def _predict(spec: TrainingSpec) -> MemoryPlan:
    try:
        result = trace(spec)
    except (PlanError, PlannerUnavailable):
        raise
    except Exception as err:  # an architecture or op the fake-tensor trace cannot run: say so in one line
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise PlannerUnavailable(
            f"tracing {spec.model_config.name} ({spec.method}) failed: {type(err).__name__}: {first}"
        ) from err
    breakdown = analytic.STRATEGY_MODELS[spec.strategy](spec, result)
    parts = {k: breakdown.parts.get(k, 0) / GIB for k in BREAKDOWN_PARTS if k != "cuda_context"}
    parts["cuda_context"] = analytic.CUDA_CONTEXT_BYTES / GIB if spec.device == "cuda" else 0.0
    used_gib = analytic.gpu_used_bytes(breakdown, spec.device) / GIB
    whole = whole_run.whole_run(spec, result, breakdown.allocated_bytes, breakdown.phase)
    whole_breakdown = analytic.DeviceBreakdown(
        {"all": whole["bytes"]}, whole["phase"], outside_allocator_bytes=breakdown.outside_allocator_bytes
    )
    whole_used_gib = analytic.gpu_used_bytes(whole_breakdown, spec.device) / GIB
    notes = [*result.notes, *breakdown.notes]
    if whole["bytes"] > breakdown.allocated_bytes:
        notes.append(f"the whole run peaks outside the training loop, in {whole['phase']}")
    return MemoryPlan(
        peak_alloc_gib=breakdown.allocated_bytes / GIB,
        breakdown_gib={k: round(v, 4) for k, v in parts.items()},
        host_gib=breakdown.host_bytes / GIB,
        gpu_memory_gib=spec.gpu_memory_gib,
        gpu_used_gib=used_gib,
        peak_phase=breakdown.phase,
        method=spec.method,
        strategy=spec.strategy,
        devices=spec.devices,
        micro_batch_size=spec.micro_batch_size,
        seq_len=spec.seq_len,
        precision=spec.precision,
        model_name=str(spec.model_config.name),
        total_params=result.total_param_numel,
        trainable_params=result.trainable_param_numel,
        trace_seconds=result.seconds,
        notes=notes,
        whole_run_peak_alloc_gib=whole["bytes"] / GIB,
        whole_run_peak_phase=whole["phase"],
        whole_run_gpu_used_gib=whole_used_gib,
        peaks_by_phase_gib=whole["by_phase_gib"],
        optimizer_step=spec.optimizer_step,
    )


def plan_recipe(recipe: dict | str | Path, **kwargs) -> MemoryPlan:
    """``predict(spec_from_recipe(recipe, **kwargs))``."""
    return predict(spec_from_recipe(recipe, **kwargs))
