"""From what a run left behind (reports, log, exit code, timeline) to one record per rank, by the same code for both
launchers so both sections' records share fields and units. A finished run's record is never lost: a number that
cannot be worked out (MFU's FLOPs) is stored as None with the reason.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import signal
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab_helpers.config.experiments import ResolvedRun, resolve_path
from lab_helpers.config.iteration_times import length_split, steady_timing
from lab_helpers.config.paths import lab_home, open_lab_file, results_dir, shown_path
from lab_helpers.config.secrets import for_terminal, redact_mapping
from lab_helpers.launch.runner import ProcessOutcome
from lab_helpers.launch.time_limit import TIME_LIMIT_ENV
from lab_helpers.record.exit_cause import describe_returncode, host_memory_gib, host_oom_evidence, kernel_log
from lab_helpers.record.time_bound import where_time_goes
from lab_helpers.training.child_report import is_oom_text

METRICS_GLOB = "out/logs/**/metrics.csv"
"""Per-iteration rows: litgpt's CSV logger writes them, and so does the Lightning ranks' report callback."""


def base_record(run: ResolvedRun, node: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields known before the run starts: who, what, where, with which recipe and environment."""
    from lab_helpers.hardware.node import environment_summary

    stamp = dt.datetime.now(dt.UTC)
    return {
        "run_id": f"{stamp:%Y%m%d-%H%M%S}-{run.experiment.id}-{uuid.uuid4().hex[:6]}",
        "experiment": run.experiment.id,
        "section": run.experiment.section,
        "profile": run.profile,
        "started_at": stamp.isoformat(timespec="seconds"),
        "rank": None,
        "world_size": run.ranks_run,  # processes really run: 1 for a simulated rank
        "simulated_world_size": run.simulated_world_size,
        "method": run.experiment.method,
        "strategy": run.experiment.strategy,
        "batch_order": run.options["batch_order"],  # the child is told it (--batch-order) and cannot run another
        "pad_multiple": run.options["pad_multiple"],  # likewise (--pad-multiple)
        "attention_backend": run.options["attention_backend"],  # likewise (--attention-backend)
        "recipe_path": str(
            run.recipe_path.relative_to(lab_home()) if run.recipe_path.is_relative_to(lab_home()) else run.recipe_path
        ),
        "overrides": redact_mapping(dict(run.overrides)),
        "config": redact_mapping(run.recipe),
        "environment": environment_summary(node),
        "random_weights": _random_weights(run),
    }


def _random_weights(run: ResolvedRun) -> bool | None:
    checkpoint = run.recipe.get("checkpoint_dir")
    if not checkpoint:
        return None
    path = resolve_path(checkpoint)
    return (path / "RANDOM_WEIGHTS").exists() if path.exists() else None


def records_from(
    run: ResolvedRun, base: Mapping[str, Any], outcome: ProcessOutcome, run_dir: Path, ranks: list[int | None]
) -> list[dict[str, Any]]:
    """One record per rank of ``ranks`` (the launcher's), plus any rank that reported beyond them."""
    labelled = {0 if rank is None else rank: rank for rank in ranks}
    for reported in outcome.reports:
        labelled.setdefault(reported, reported)
    per_iteration = per_iteration_rows(run_dir)
    mfu_inputs: dict[str, Any] | None = None
    records = []
    for number in sorted(labelled):
        report = outcome.reports.get(number, {})
        status, reason, error = _status(report, outcome, launched=number == 0)
        train_s = report.get("train_s")
        tokens, tokens_padded = report.get("tokens"), report.get("tokens_padded")
        iterations = report.get("iterations") or (len(per_iteration) or None)
        if mfu_inputs is None or report.get("device_name") != mfu_inputs["device_name"]:
            mfu_inputs = {"device_name": report.get("device_name"), **_mfu_inputs(run, report, iterations)}
        record = {
            **base,
            "rank": labelled[number],
            "status": status,
            "reason": reason,
            "error": error,
            "returncode": outcome.returncode,
            "peak_alloc_gib": report.get("peak_alloc_gib"),
            "peak_reserved_gib": report.get("peak_reserved_gib"),
            "peak_tensor_gib": report.get("peak_tensor_gib"),
            # the same peaks over the whole process (checkpoint load, QLoRA's quantization included)
            "peak_alloc_whole_run_gib": report.get("peak_alloc_whole_run_gib"),
            "peak_tensor_whole_run_gib": report.get("peak_tensor_whole_run_gib"),
            "peak_phase": report.get("peak_phase"),  # where in the loop the training peak was reached
            "gpu_used_peak_gib": outcome.timeline.gpu_used_peak_for(number, report.get("device_uuid")),
            "gpu_used_peak_gib_per_gpu": {str(k): v for k, v in outcome.timeline.gpu_used_peak_gib.items()} or None,
            "host_rss_peak_gib": outcome.timeline.host_rss_peak_gib,
            "train_s": train_s,
            "warmup_s": report.get("warmup_s"),
            "warmup_iterations": report.get("warmup_iterations"),
            "wall_s": outcome.wall_s,
            "process_start": outcome.process_start,
            "tokens": tokens,
            "tokens_padded": tokens_padded,
            "iterations": iterations,
            "seq_lens": report.get("seq_lens"),
            "flops_per_step": mfu_inputs["flops_per_step"],
            "gpu_peak_flops": mfu_inputs["gpu_peak_flops"],
            "mfu_error": mfu_inputs["mfu_error"],
            "device_name": report.get("device_name"),
            "device_uuid": report.get("device_uuid"),
            "strategy_used": report.get("strategy_used"),
            "per_iteration": per_iteration or None,
            "timeline_path": relative_to_results(outcome.timeline.path),
            "log_path": relative_to_results(outcome.log_path),
            "host_core_pct": report.get("host_core_pct"),
            "loop_monotonic_s": report.get("loop_monotonic_s"),
            **_torch_profile_fields(report),
            "quick_stop": report.get("quick_stop"),
            "quick_stop_halves_pct": report.get("quick_stop_halves_pct"),
            "compiled": report.get("compiled"),  # what compiled, with its seconds and recompiles
            "compile_s": report.get("compile_s"),
            "recompiles": report.get("recompiles"),
            **where_time_goes(
                report,
                timeline_path=outcome.timeline.path,
                timeline_t0_monotonic_s=outcome.timeline.t0_monotonic_s,
                gpu_index=outcome.timeline.gpu_index_for(number, report.get("device_uuid")),
                world_size=run.ranks_run,  # a simulated rank runs alone, with no collectives: one process
            ),
        }
        record.update(steady_timing(record))  # pure arithmetic on the stored inputs: cannot fail
        record.update(length_split(record))
        records.append(record)
    return records


def _torch_profile_fields(report: Mapping[str, Any]) -> dict[str, Any]:
    trace = report.get("torch_profile_trace_path")
    return {
        "torch_profile_steps": report.get("torch_profile_steps"),
        "torch_profile_iters": report.get("torch_profile_iters"),
        "torch_profile_trace_path": None if trace is None else relative_to_results(Path(trace)),
        "torch_profile_summary": report.get("torch_profile_summary"),
    }


def _status(
    report: Mapping[str, Any], outcome: ProcessOutcome, *, launched: bool
) -> tuple[str, str | None, str | None]:
    """Trusts the rank's report, then the log, then the exit code, which is the launched process's only: another
    rank's "ok" stands when rank 0 died afterwards. A time-limited run is ``timeout`` whatever its ranks said."""
    if outcome.interrupted:
        who = f"by {outcome.interrupted_by}" if outcome.interrupted_by else "by the user"
        return "interrupted", f"interrupted {who}; every process of the run was ended", None
    if outcome.timed_out:
        why = (
            f"no result within the time limit of {outcome.time_limit_s:.0f} s; every process of the run was ended "
            f"(a longer limit: --time-limit SECONDS or ${TIME_LIMIT_ENV})"
        )
        return "timeout", why, "\n".join(outcome.tail[-20:]) or None
    if outcome.exit_cause:  # e.g. its warm server died: the rank saw a SIGTERM it took for an interrupt
        return "error", outcome.exit_cause, "\n".join(outcome.tail[-20:]) or None
    if report.get("status") in ("oom", "error", "interrupted"):
        return report["status"], last_line(report.get("error")), report.get("error")
    if report.get("status") == "ok" and (not launched or outcome.returncode == 0 or outcome.recovered):
        return "ok", None, None
    if outcome.recovered:  # no exit code to go by: the launcher that waited for it is gone
        why = "no report from this rank, and its launcher ended before it could record the run"
        return "error", why, "\n".join(outcome.tail[-20:]) or None
    oom_lines = [line for line in outcome.tail if is_oom_text(line)]
    if oom_lines:
        return "oom", oom_lines[-1][:300], "\n".join(oom_lines)
    if outcome.returncode != 0:
        why = describe_returncode(outcome.returncode) + ("" if report else "; the process wrote no report")
        if outcome.returncode == -signal.SIGKILL:  # what the OOM killer sends
            evidence = host_oom_evidence(
                pids={outcome.pid} if outcome.pid else set(),
                started_s=outcome.started_monotonic_s,
                ended_s=(outcome.started_monotonic_s or 0) + outcome.wall_s,
                kernel_log_text=kernel_log(),
                rss_peak_gib=outcome.timeline.host_rss_peak_gib,
                host_gib=host_memory_gib(),
            )
            if evidence:
                why += f"; probably the host ran out of memory ({evidence})"
        return "error", why, "\n".join(outcome.tail[-20:])
    return "error", "the training process exited without a report", "\n".join(outcome.tail[-20:])


def last_line(text: str | None) -> str | None:
    """Where a traceback says what went wrong."""
    return text.strip().splitlines()[-1][:300] if text and text.strip() else None


def _mfu_inputs(run: ResolvedRun, report: Mapping[str, Any], iterations: int | None) -> dict[str, Any]:
    """None on a CPU or an unknown GPU (no honest peak to divide by); a failure is kept as ``mfu_error``, not raised."""
    empty = {"flops_per_step": None, "gpu_peak_flops": None, "mfu_error": None}
    device = report.get("device_name")
    if not device or str(device).startswith("cpu") or not iterations or not report.get("tokens_padded"):
        return empty
    try:
        from litgpt import Config

        from lab_helpers.config.recipe_defaults import lora_settings
        from lab_helpers.hardware.gpu_peaks import dense_peak_flops
        from lab_helpers.planning.flops import train_flops_per_step

        peak = dense_peak_flops(device, run.recipe.get("precision") or "")
        if peak is None:
            return empty
        micro = run.recipe["train"]["micro_batch_size"]
        seq_len = max(1, round(report["tokens_padded"] / (iterations * micro)))  # the mean padded length
        config = Config.from_file(resolve_path(run.recipe["checkpoint_dir"]) / "model_config.yaml")
        flops = train_flops_per_step(
            config, method=run.experiment.method, lora=lora_settings(run.recipe), micro_batch_size=micro,
            seq_len=seq_len,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 -- a finished run keeps its record; MFU is derived later or not at all
        return {**empty, "mfu_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"flops_per_step": flops, "gpu_peak_flops": peak, "mfu_error": None}


METRICS_MAX_BYTES = 256 * 2**20  # a row an iteration (~100 bytes): 100,000 iterations are ~10 MB


def per_iteration_rows(run_dir: Path) -> list[dict[str, float | None]]:
    """Each metrics file read as a regular file inside the run folder (``paths.open_lab_file``), else skipped: a
    FIFO there hung the recovery of an orphaned run."""
    rows: list[dict[str, float | None]] = []
    for path in sorted(run_dir.glob(METRICS_GLOB)):
        try:
            binary = open_lab_file(path, max_bytes=METRICS_MAX_BYTES, folder=run_dir)
        except FileNotFoundError:
            continue
        except OSError as exc:
            warnings.warn(f"{shown_path(path)}: not read ({exc.strerror}): its iterations left out", stacklevel=2)
            continue
        with io.TextIOWrapper(binary, newline="") as fh:
            for row in csv.DictReader(fh):
                if not row.get("iter"):
                    continue
                rows.append(
                    {
                        "iter": int(float(row["iter"])),
                        "loss": _float(row.get("loss")),
                        "iter_time_s": _float(row.get("iter_time")),
                        "tokens": _float(row.get("tokens")),
                    }
                )
    return rows


def _float(text: str | None) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def relative_to_results(path: Path) -> str:
    try:
        return str(path.relative_to(results_dir()))
    except ValueError:
        return str(path)


def one_line(record: Mapping[str, Any]) -> str:
    def fmt(value, unit=""):
        return "n/a" if value is None else f"{value:.3g}{unit}"

    rank = "" if record.get("rank") is None else f" rank {record['rank']}"
    simulated = record.get("simulated_world_size")
    if simulated:
        rank += f" of {simulated} (simulated: memory real, time without communication)"
    parts = [
        f"{record['experiment']}{rank}: {record['status']}",
        (
            f"peak alloc {fmt(record.get('peak_alloc_gib'), ' GiB')}"
            if record.get("peak_tensor_gib") is None
            else f"peak tensors {fmt(record.get('peak_tensor_gib'), ' GiB')} (CPU)"
        )
        + f" (predicted {fmt(record.get('predicted_peak_alloc_gib'), ' GiB')})",
        f"train {fmt(record.get('train_s'), ' s')}",
        f"{fmt(record.get('tokens_per_s'))} tok/s",
    ]
    if record.get("reason"):
        parts.append(for_terminal(str(record["reason"])))  # an error may quote a token or an escape sequence
    return " | ".join(parts)
