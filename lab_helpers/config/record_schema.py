"""Every field of the run record and of the training process's report, named once with its unit: a record is read
for years (students' results, the shipped references) by several readers, so writers check against this and readers
conform to it. Imports nothing from the lab. GiB are 2^30 bytes everywhere (litgpt prints GB = 10^9).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30

PRECISIONS: tuple[str, ...] = ("32-true", "bf16-true", "bf16-mixed", "16-true", "16-mixed", "transformer-engine")
"""The precisions litgpt's CLI accepts: what a recipe may say."""

PLANNED_PRECISIONS: tuple[str, ...] = PRECISIONS[:5]
"""The subset the planner models (transformer-engine's fp8 layers are not)."""

STATUSES: tuple[str, ...] = ("ok", "oom", "error", "interrupted", "timeout", "skipped")
"""A record's status. A training process reports only the first four; the lab adds timeout and skipped."""

REPORT_STATUSES: tuple[str, ...] = STATUSES[:4]

BREAKDOWN_PARTS: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "temporaries",
    "communication_buffers",
    "cuda_context",
)
"""The parts of a GPU's memory the planner predicts (``predicted.breakdown_gib``) and the plots stack, in order."""

LAUNCHERS: tuple[str, ...] = ("litgpt-cli", "lightning-strategy")
"""litgpt's own CLI (one process) or the Lightning Trainer with a strategy; both train with Lightning."""

LEGACY_KIND_TO_LAUNCHER = {"litgpt": "litgpt-cli", "lightning": "lightning-strategy"}
"""The experiment YAML's ``kind:`` key, still read."""


@dataclass(frozen=True)
class Field:
    """One field: its name, unit (None for text, mappings and flags) and what it means."""

    name: str
    unit: str | None
    doc: str


def _fields(*rows: tuple[str, str | None, str]) -> tuple[Field, ...]:
    return tuple(Field(*row) for row in rows)


REPORT_FIELDS: tuple[Field, ...] = _fields(
    ("status", None, "ok | oom | error | interrupted"),
    ("error", None, "the allocator's OOM message or the tail of the traceback"),
    ("rank", None, "global rank; None for a single process"),
    ("world_size", "processes", "ranks of the run"),
    ("peak_alloc_gib", "GiB", "torch.cuda.max_memory_allocated over the training loop; None on a CPU, never 0"),
    ("peak_reserved_gib", "GiB", "torch.cuda.max_memory_reserved over the training loop; None on a CPU"),
    ("peak_tensor_gib", "GiB", "on a CPU: the peak of live tensor bytes over training (tensor_peak)"),
    ("peak_alloc_whole_run_gib", "GiB",
     "torch.cuda.max_memory_allocated over the whole process: checkpoint load (QLoRA's quantization) included"),
    ("peak_tensor_whole_run_gib", "GiB", "on a CPU: the peak of live tensor bytes over the whole process"),
    ("peak_phase", None, "the phase of the training loop in which its peak (peak_alloc_gib on a GPU, peak_tensor_gib "
     "on a CPU) was first reached: forward | backward | optimizer step | ... (tensor_peak.PEAK_PHASES); None where "
     "nothing was counted"),
    ("train_s", "s", "inside the training loop after the warm-up step, validation excluded"),
    ("warmup_s", "s", "the first optimizer step's iterations (None: not timed apart)"),
    ("warmup_iterations", "micro-batches", "micro-batches of warm-up (0: the run was too short to exclude any)"),
    ("tokens", "tokens", "training tokens without padding inside train_s"),
    ("tokens_padded", "tokens", "training tokens with padding inside train_s"),
    ("samples", "samples", "samples inside train_s"),
    ("iterations", "micro-batches", "micro-batches inside train_s"),
    ("seq_lens", "tokens", "the padded sequence length of every micro-batch the loop trained, in order (warm-up "
     "included; per_iteration's iter 1, 2, ...): which ones met a length for the first time (length_split)"),
    ("device_name", None, "the GPU's name, or 'cpu (<processor>)' on a CPU"),
    ("device_uuid", None, "the GPU this rank used, as NVML names it ('GPU-...'): maps NVML readings"),
    ("strategy_used", None, "e.g. 'fsdp2 (ModelParallelStrategy)' when a fallback ran"),
    ("host_core_pct", "%",
     "CPU time of the training process (every thread: Python, the autograd engine's, which launch the kernels; "
     "not data-loader worker processes) over the timed loop's wall time, validation excluded: 100 = one host core; "
     "no evidence of a host bound (a thread waiting in a CUDA synchronisation spins its core)"),
    ("loop_monotonic_s", None, "[start, end] seconds of the timed loop on the host's monotonic clock (time.monotonic): "
     "where in the NVML timeline gpu_busy_pct averages"),
    ("torch_profile_steps", "optimizer steps", "--trace-steps N: optimizer steps a torch.profiler trace covered "
     "(None: profiling was off, the default)"),
    ("torch_profile_iters", None, "[first, last] iteration the trace covered: left out of every time figure"),
    ("torch_profile_trace_path", None, "the Chrome trace (chrome://tracing, ui.perfetto.dev), relative to the results"),
    ("torch_profile_summary", None, "the trace in short (lab_helpers.training.torch_trace.summarize): wall, host-op and "
     "device time per step, device-idle share, ops and kernels per step, top 10 ops"),
    ("quick_stop", None, "what ended a quick run's timing (quick_mode.stop_reason): stable (enough timed, the "
     "medians of the two halves agree within quick_mode.STABLE_HALVES_PCT) | iteration_cap | time_cap | run_end (the "
     "recipe's steps or data ended first); None in full mode and on the Lightning path (a fixed count)"),
    ("quick_stop_halves_pct", "%", "the halves' disagreement the training process judged when it stopped"),
    ("compiled", None, "what torch.compile compiled before fit and with which mode, e.g. 'blocks (22, mode default)' "
     "(compile_blocks; a CUDA-graph mode asked for on a CPU says it ran 'default'); None: nothing compiled"),
    ("compile_s", "s", "seconds torch spent compiling over the whole run, from its own records (torch._dynamo.utils."
     "get_compilation_metrics: each frame's compile with its forward code, and each backward compiled at its first "
     "backward): the first compile falls in warm-up, outside train_s; a recompile after warm-up falls inside a timed "
     "micro-batch, where length_split shows it as a first-seen length's cost. None: nothing compiled"),
    ("recompiles", "compilations", "how many times a compiled block was compiled again after one of its guards failed "
     "(a new sequence length, until torch compiles one graph for any length): the compilations torch records with a "
     "recompile reason (the run's log prints each reason). None: nothing compiled"),
)
"""What every training process (the litgpt child, each Lightning rank) reports back to the launcher."""

REPORT_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in REPORT_FIELDS)


def _reported(*names: str) -> tuple[Field, ...]:
    by_name = {f.name: f for f in REPORT_FIELDS}
    return tuple(by_name[name] for name in names)

PER_ITERATION_KEYS: tuple[str, ...] = ("iter", "loss", "iter_time_s", "tokens")
"""One row per logged iteration (``per_iteration``): iteration number, loss, seconds, tokens so far."""

RECORD_FIELDS: tuple[Field, ...] = _reported(
    "rank", "world_size", "error", "peak_alloc_gib", "peak_reserved_gib", "peak_tensor_gib",
    "peak_alloc_whole_run_gib", "peak_tensor_whole_run_gib", "peak_phase", "train_s", "warmup_s",
    "warmup_iterations", "tokens", "tokens_padded", "iterations", "device_name", "device_uuid", "strategy_used",
    "host_core_pct", "loop_monotonic_s", "torch_profile_steps", "torch_profile_iters", "torch_profile_trace_path",
    "torch_profile_summary", "quick_stop", "quick_stop_halves_pct", "seq_lens", "compiled", "compile_s", "recompiles",
) + _fields(
    # who and what
    ("run_id", None, "unique: start time, experiment, random suffix"),
    ("experiment", None, "the experiment's id (configs/experiments/*.yaml)"),
    ("section", None, "single | multi"),
    ("profile", None, "ci | gpu"),
    ("mode", None, "full | quick (quick_mode: until the peak and a steady step time are measured)"),
    ("batch_order", None, "the order of the samples in micro-batches (recipe_defaults.BATCH_ORDERS): shuffle (quick "
     "mode: the lab's fixed shuffle; a full run: litgpt's shuffled loader) | length-grouped (micro-batches of samples "
     "of similar length, quick_mode.LengthGroupedSampler); None: a record from before the field, shuffled"),
    ("pad_multiple", None, "training micro-batches padded to a multiple of this many tokens, or 'max': each to the "
     "longest sample (pad_batches; seq_lens shows the lengths); None: litgpt's padding, to each one's longest sample"),
    ("attention_backend", None, "the one scaled-dot-product attention backend the loop was restricted to "
     "(recipe_defaults.ATTENTION_BACKENDS, e.g. flash); None: torch's choice"),
    ("started_at", None, "ISO time, UTC"),
    ("method", None, "full | lora | qlora"),
    ("strategy", None, "single | ddp | fsdp | deepspeed-zero2 | deepspeed-zero3"),
    ("recipe_path", None, "the recipe the experiment starts from"),
    ("overrides", None, "dotted-key overrides given for this run"),
    ("config", None, "the full resolved recipe (secrets masked)"),
    ("environment", None, "GPU names, driver, CUDA, package versions"),
    ("random_weights", None, "the checkpoint has random weights (time and memory valid, loss not)"),
    ("time_limit_s", "s", "the wall-clock limit the run had (None: none)"),
    ("simulated_world_size", "processes",
     "rank 0 of a run of this many ranks, measured alone on one device with torch's fake process group "
     "(world_size 1 really run): memory real, time without communication (None: a real run)"),
    # prediction
    ("predicted_peak_alloc_gib", "GiB", "the planner's predicted peak allocated memory per GPU"),
    ("predicted_peak_alloc_whole_run_gib", "GiB", "the same over the whole process (load, generation included)"),
    ("predicted", None, "the planner's whole MemoryPlan (breakdown_gib per part, host_gib, ...)"),
    ("prediction_error", None, "why there is no prediction"),
    # outcome
    ("status", None, " | ".join(STATUSES)),
    ("reason", None, "one line: why the run did not end ok, or was skipped"),
    ("returncode", None, "exit code of the launched process"),
    ("log_error", None, "why the log or the timeline is incomplete (e.g. the disk filled up)"),
    ("recovered", None, "how the record was rebuilt from its run folder after the launcher ended before storing it "
     "(lab_helpers.record.recovery: exit code unknown, wall_s from the timeline); None: stored by the launcher"),
    # memory
    ("gpu_used_peak_gib", "GiB", "NVML 'memory used' peak of this rank's GPU during the run"),
    ("gpu_used_peak_gib_per_gpu", "GiB", "NVML 'memory used' peak per GPU index"),
    ("host_rss_peak_gib", "GiB", "peak resident memory of the run's process tree"),
    # time and throughput
    ("wall_s", "s", "from launch to exit"),
    ("process_start", None, "warm (forked from the launcher's warm Python: warm_start) | cold (a new Python)"),
    # steady timing (derived from per_iteration and the counts by iteration_times.steady_timing; readers re-derive)
    ("iter_median_s", "s", "median time of the timed iterations (after warm-up, profiled ones left out); "
     "train_s / iterations where no per-iteration time was logged"),
    ("iter_iqr_s", "s", "interquartile range (Q3 - Q1) of the same iterations"),
    ("iter_count", "micro-batches", "how many timed iterations the median and IQR are of"),
    ("iter_halves_pct", "%", "|median of the first half - median of the second half| / median: quick mode's "
     "stability figure (stable below 10 %)"),
    # steady time apart from first-seen sequence lengths (iteration_times.length_split from seq_lens; readers
    # re-derive)
    ("steady_iter_s", "s", "median time of the timed micro-batches of a length the run had already seen (a "
     "length-grouped run: their mean); None where seq_lens is missing or fewer than 3 repeated: steady_basis says"),
    ("steady_iter_count", "micro-batches", "how many timed micro-batches steady_iter_s is of"),
    ("steady_spread_pct", "%", "half the 95 % bootstrap interval of steady_iter_s, as % of it: its own noise"),
    ("first_seen_count", "micro-batches", "timed micro-batches of a length no earlier micro-batch had"),
    ("first_seen_extra_s", "s", "their median time over steady_iter_s: what a first-seen length costs (plan builds, "
     "recompiles)"),
    ("first_seen_pct", "%", "the share of the timed micro-batches' time that first-seen ones took beyond a steady one"),
    ("steady_basis", None, "what steady_iter_s is of, or why the record has none (lengths not recorded, too few "
     "repeated)"),
    ("tokens_per_s", "tokens/s", "unpadded tokens of a mean timed micro-batch / iter_median_s (a length-grouped "
     "run: / the mean timed micro-batch, train_s / iterations, since its micro-batches differ in length by design)"),
    ("tokens_per_s_padded", "tokens/s", "padded tokens of a mean timed micro-batch / the same time: the ONE token "
     "count of MFU"),
    ("padding_pct", "%", "100 x (tokens_padded - tokens) / tokens_padded: the share of tokens_per_s_padded that is padding"),
    ("flops_per_step", "FLOP", "model FLOPs of one micro-batch (forward + backward), the MFU numerator's unit"),
    ("flops_per_token", "FLOP/token", "flops_per_step x iterations / tokens_padded: model FLOPs of one padded token"),
    ("gpu_peak_flops", "FLOP/s", "the GPU's dense peak for the precision, from the lab's peak table"),
    ("mfu", "fraction", "tokens_per_s_padded x flops_per_token / gpu_peak_flops (= flops_per_step / iter_median_s / "
     "gpu_peak_flops, the mean timed micro-batch for a length-grouped run; derived; None on a CPU)"),
    # where the time goes (lab_helpers.record.time_bound)
    ("gpu_busy_pct", "%", "NVML utilisation of this rank's GPU averaged over the timed loop only (loop_monotonic_s); "
     "None on a CPU, with gpu_busy_reason"),
    ("gpu_busy_spread_pct", "%", "the noise of gpu_busy_pct, in points: half the 95 % bootstrap interval of the mean "
     "of its NVML samples inside the loop (a short loop has few 100-200 ms samples); None under 3 samples; derived "
     "from the timeline by readers for older records"),
    ("gpu_busy_sample_count", "samples", "the NVML samples of this rank's GPU inside the loop that gpu_busy_pct "
     "averages"),
    ("gpu_busy_pct_per_gpu", "%", "the same per NVML GPU index"),
    ("gpu_busy_reason", None, "why gpu_busy_pct is None (no GPU, no NVML samples inside the loop)"),
    ("bound", None, "what limits the run, judged from the device's side (lab_helpers.record.time_bound): "
     "communication only from a profile (several ranks, collective kernels >= 50 % of the device's busy time: NVML "
     "counts them as busy); else gpu (gpu_busy_pct >= 90: the GPU idles at most a tenth of the loop), host "
     "(gpu_busy_pct <= 50: it waits on the host side at least half the loop), both between (neither alone sets the "
     "pace); a profile's 100 - device_idle_pct where NVML has no sample in the loop. host_core_pct is no evidence (a "
     "thread waiting on the GPU spins its core). Runs of one experiment on one GPU whose gpu_busy_pct agree within "
     "their gpu_busy_spread_pct share the label of their pooled figure. Derived: readers re-derive it; None on a CPU"),
    ("bound_reason", None, "the figures behind bound with their noise (and a profile's device idle share and kernels "
     "per step), where a threshold lies inside the noise, and where another run of the experiment on the GPU got "
     "another label, which figure differs and by how much beyond the noise; or why there is no bound"),
    ("loop_window_s", "s", "[start, end] of the timed loop (loop_monotonic_s) on the timeline's clock (its t_s): "
     "the timeline figure marks load + warm-up before it and teardown after it; None when either is missing"),
    ("mfu_error", None, "why flops_per_step could not be counted"),
    ("per_iteration", None, "rows of " + ", ".join(PER_ITERATION_KEYS) + " (iter_time_s in s)"),
    ("timeline_path", None, "the sampled GPU/host timeline (CSV), relative to the results folder"),
    ("log_path", None, "the run's output, relative to the results folder"),
    ("reference_note", None, "export-reference: where and how the reference run was made"),
)
"""One record per run (per rank where there are several); old records may lack later fields: readers conform."""

RECORD_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in RECORD_FIELDS)
UNITS: dict[str, str | None] = {f.name: f.unit for f in RECORD_FIELDS}

_NUMERIC_UNITS = {"GiB", "s", "tokens", "tokens/s", "micro-batches", "FLOP", "FLOP/s", "fraction", "processes", "%",
                  "FLOP/token", "optimizer steps", "compilations"}
_NUMERIC_FIELDS: tuple[tuple[str, str], ...] = tuple((k, u) for k, u in UNITS.items() if u in _NUMERIC_UNITS)


def record_problems(record: Mapping[str, Any]) -> list[str]:
    problems = [f"unknown field {key!r}" for key in record if key not in UNITS]
    if record.get("status") not in STATUSES:
        problems.append(f"status {record.get('status')!r} is not one of {', '.join(STATUSES)}")
    for key, unit in UNITS.items():
        value = record.get(key)
        if value is None or unit not in _NUMERIC_UNITS:
            continue
        # per GPU {index: value}, or a [start, end] pair (loop_window_s): each a number of the unit
        values = value.values() if isinstance(value, Mapping) else value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            problems.append(f"{key} ({unit}) is not a number: {value!r}")
    return problems


def conform(record: Mapping[str, Any]) -> dict[str, Any]:
    """Unknown fields are kept (a newer lab may have written them); never raises on a record's values."""
    out = dict.fromkeys(RECORD_FIELD_NAMES)  # the schema's order, then unknown fields in the record's order
    out.update(record)
    return out


def rate(count: float | None, seconds: float | None) -> float | None:
    """None, never 0, when either is missing or not positive."""
    if not _positive(count) or not _positive(seconds):
        return None
    return float(count) / float(seconds)  # type: ignore[arg-type]


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


SANE_MAGNITUDE = 1e24
"""A GPU's FLOP/s are ~1e15, a run's tokens ~1e12: a value beyond this is a damaged or hand-edited line."""

MAX_RANK = 1_000_000
_RECORD_PATH_FIELDS = ("timeline_path", "log_path")
_MAPPING_FIELDS = ("overrides", "config", "environment", "predicted", "gpu_used_peak_gib_per_gpu")


def record_unfit(record: Any, *, text_is_unicode: bool = False) -> str | None:
    """Readers set such a line aside: one bad line of an append-only file must not break every table. Only what
    readers rely on is checked. ``text_is_unicode``: the caller knows it holds no lone surrogate."""
    if not isinstance(record, Mapping):
        return "not a JSON object"
    experiment = record.get("experiment")
    if not isinstance(experiment, str) or not experiment.strip():
        return f"experiment is not a name: {short_repr(experiment)}"
    if record.get("status") not in STATUSES:
        return f"status {short_repr(record.get('status'))} is not one of {', '.join(STATUSES)}"
    rank = record.get("rank")
    if rank is not None and (not _whole(rank) or not 0 <= rank <= MAX_RANK):
        return f"rank is not a whole number in 0..{MAX_RANK}: {short_repr(rank)}"
    for key, unit in _NUMERIC_FIELDS:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, Mapping | list):  # per GPU, per iteration: the numbers in it are checked
            if (bad := _insane_in(value.values() if isinstance(value, Mapping) else value)) is not None:
                return f"{key} ({unit}) is not a finite number within +-{SANE_MAGNITUDE:g}: {short_repr(bad[0])}"
        elif not _sane_number(value):
            return f"{key} ({unit}) is not a finite number within +-{SANE_MAGNITUDE:g}: {short_repr(value)}"
    for key in ("run_id", "profile", "section", "mode", "started_at", "method", "strategy", "reason"):
        if record.get(key) is not None and not isinstance(record.get(key), str):
            return f"{key} is not text: {short_repr(record.get(key))}"
    for key in _MAPPING_FIELDS:
        if record.get(key) is not None and not isinstance(record.get(key), Mapping):
            return f"{key} is not a mapping: {short_repr(record.get(key))}"
    if record.get("per_iteration") is not None and not isinstance(record.get("per_iteration"), list):
        return "per_iteration is not a list"
    for key in _RECORD_PATH_FIELDS:
        if (problem := run_file_problem(record.get(key))) is not None:
            return f"{key} {problem}"
    if not text_is_unicode and not _encodes(record) and (bad := _bad_text(record)) is not None:  # at C speed
        return f"text that is not valid Unicode in {bad}"  # (the walk finds where)
    return None


def run_file_problem(value: Any) -> str | None:
    """Only the text is judged; opening the file (``paths.regular_file_inside``) resolves links too."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        return f"is not a path: {short_repr(value)}"
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\\" in value or "\0" in value:
        return f"is not a relative path inside the results folder: {short_repr(value)}"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sane_number(value: Any) -> bool:
    # a comparison, not math.isfinite: NaN and the infinities fail it, and an int too large for a float is
    # refused instead of raising OverflowError
    return _number(value) and -SANE_MAGNITUDE <= value <= SANE_MAGNITUDE


def _insane_in(values: Any) -> tuple[Any] | None:
    """A list of plain numbers (``seq_lens``: one per micro-batch) is judged at C speed."""
    kinds = set(map(type, values))
    if kinds and kinds <= {int, float} and -SANE_MAGNITUDE <= min(values) and max(values) <= SANE_MAGNITUDE:
        if float not in kinds or all(map(math.isfinite, values)):  # NaN: min and max need not see it
            return None
    return next(((v,) for v in values if _number(v) and not _sane_number(v)), None)


def _encodes(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
        return False
    return True


def _bad_text(value: Any, where: str = "the record") -> str | None:
    """The first field holding a string that cannot be written as UTF-8 (a lone surrogate from a ``\\ud800``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if (bad := _bad_text(key, where)) or (bad := _bad_text(item, str(key))):
                return bad
    elif isinstance(value, list):
        for item in value:
            if bad := _bad_text(item, where):
                return bad
    return None


def short_repr(value: Any, limit: int = 60) -> str:
    """A value as a message names it: a hostile record's 1 MB string must not become a 1 MB message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
