"""Run an experiment of the lab and record it: the one call each notebook cell makes.

    from lab_helpers.lab import run_experiment
    records = run_experiment("grad-accum", profile="ci")

Order of work, each step its own module: resolve and check the recipe (experiments), predict memory
(planner), launch and watch the training process (runner), then turn what it reported into one record per
rank and append it to the results file (records). Bad input fails before any process starts.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import json
import math
import os
import signal
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from lab_helpers.child_report import is_oom_text
from lab_helpers.exit_cause import describe_returncode, host_memory_gib, host_oom_evidence, kernel_log
from lab_helpers.experiments import (
    LabConfigError,
    ResolvedRun,
    load_experiments,
    parse_set_args,
    resolve,
    resolve_path,
    runnable_recipe,
)
from lab_helpers.host_gate import host_ram_skip_reason
from lab_helpers.paths import lab_home, results_dir
from lab_helpers.quick_mode import QUICK_ENV, quick_from_env, quick_overrides
from lab_helpers.records import append_record
from lab_helpers.runner import ProcessOutcome, run_command
from lab_helpers.secrets import redact_mapping
from lab_helpers.time_limit import TIME_LIMIT_ENV

__all__ = [
    "default_profile",
    "run_experiment",
    "run_all",
    "record_skipped",
    "predict_experiment",
    "oom_demo_overrides",
    "LabConfigError",
]

PROFILE_ENV = "LAB_PROFILE"


def default_profile(node: Mapping[str, Any] | None = None) -> str:
    """``$LAB_PROFILE``, else ``gpu`` where CUDA is present and ``ci`` where it is not.

    A node whose GPUs torch cannot use (a driver older than torch's CUDA build, a CPU-only torch, a V100 with a
    build that has no Volta kernels) is not a CPU machine: that stops here with the reason and the fix, instead of
    quietly training tiny CPU models on a paid GPU node. ``LAB_PROFILE=ci`` still forces the CPU profile.
    ``node`` is ``describe_node()`` when the caller already has it.
    """
    if value := os.environ.get(PROFILE_ENV):
        return value
    problem = gpu_problem(node)
    if problem:
        raise LabConfigError(f"{problem} (or set LAB_PROFILE=ci to use the CPU profile on purpose)")
    import torch

    return "gpu" if torch.cuda.is_available() else "ci"


def gpu_problem(node: Mapping[str, Any] | None = None) -> str | None:
    """Why torch cannot drive the GPUs NVML sees here, with the fix; None where it can or there are none."""
    from lab_helpers.cuda_compat import torch_facts, torch_gpu_problem
    from lab_helpers.node import describe_node

    node = describe_node() if node is None else node
    if not node.get("gpus"):
        return None
    return torch_gpu_problem({**node, **torch_facts()})


# ----------------------------------------------------------------------------------------------- running


def run_experiment(
    exp_id: str,
    *,
    profile: str | None = None,
    overrides: Mapping[str, Any] | list[str] | None = None,
    results_path: Path | None = None,
    echo: bool = True,
    summary: bool = True,
    quick: bool | None = None,
    time_limit_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run one experiment and append its record(s); returns them (one per rank for distributed runs).

    ``echo`` shows the training output live; ``summary`` prints one result line per record. ``quick`` (default:
    ``$LAB_QUICK``) runs only until the true peak memory and a steady step time are measured (quick_mode).
    ``time_limit_s`` overrides the run's wall-clock limit (``lab_helpers.time_limit``; 0: none); a run that
    reaches it is ended and recorded as ``timeout``.

    Raises LabConfigError for bad input before anything starts, and KeyboardInterrupt after recording
    ``interrupted`` when the student interrupts. A failed or OOM run is a result, not an exception. Once the
    run is being ended or recorded, further interrupts are held until its record is stored.
    """
    from lab_helpers.interrupts import InterruptShield
    from lab_helpers.node import describe_node
    from lab_helpers.time_limit import time_limit_s as run_time_limit_s

    node = describe_node()  # once per run: the profile check, the hardware check and the record all use it
    profile = profile or default_profile(node)
    if isinstance(overrides, list):
        overrides = parse_set_args(overrides)
    _check_profile_hardware(profile, node)
    run = resolve(exp_id, profile, overrides)
    quick = (quick_from_env() if quick is None else quick) and run.experiment.kind == "litgpt"  # litgpt path only
    if quick:
        ranks = run.devices * run.experiment.num_nodes
        run = resolve(exp_id, profile, {**(overrides or {}), **quick_overrides(run.recipe["train"], ranks)})
    base = _base_record(run, node)
    base["mode"] = "quick" if quick else "full"
    if run.skip_reason:
        return _skip(base, run.skip_reason, results_path, summary)
    total_iters = _total_iterations(run)
    limit_s = run_time_limit_s(profile, total_iters, time_limit_s)
    base.update(_prediction_fields(run))
    base["time_limit_s"] = limit_s
    if host_reason := host_ram_skip_reason(run, base.get("predicted")):
        return _skip(base, host_reason, results_path, summary)
    run_dir = results_dir() / "runs" / base["run_id"]
    command = _command_for(run, run_dir)
    with InterruptShield() as shield:  # armed by the runner at the first interrupt, or when the process ends
        outcome = run_command(
            command,
            run_dir=run_dir,
            env={QUICK_ENV: "1" if quick else "0"},
            cwd=lab_home(),
            total_iters=total_iters,
            label=exp_id,
            echo=echo,
            time_limit_s=limit_s,
            shield=shield,
        )
        base["log_error"] = outcome.log_error  # the disk filled up: the log is cut short, the record says so
        try:
            records = _records_from(run, base, outcome, run_dir)
        except Exception as exc:  # noqa: BLE001 -- a bug here must not cost a paid-for run its record
            records = [{**base, "status": "error", "reason": f"the lab could not build the record: {exc!r}",
                        "returncode": outcome.returncode, "wall_s": outcome.wall_s,
                        "log_path": _relative(outcome.log_path)}]  # fmt: skip
        for record in records:
            append_record(record, path=results_path)
        if summary:
            for record in records:
                print(_one_line(record))
    if outcome.interrupted:
        raise KeyboardInterrupt(f"{exp_id} interrupted; recorded as 'interrupted'")
    if shield.count:
        raise KeyboardInterrupt(f"{exp_id} ended as the interrupt came; recorded as {records[0]['status']!r}")
    return records


def run_all(
    *,
    section: str = "single",
    profile: str | None = None,
    results_path: Path | None = None,
    only: Iterable[str] | None = None,
    echo: bool = True,
    quick: bool | None = None,
) -> list[dict[str, Any]]:
    """Every experiment of a section in order; a failing experiment is recorded and the next one runs.

    OOM demonstrations get the batch that makes them OOM on this GPU (``oom_demo_overrides``), as in the notebook.
    """
    profile = profile or default_profile()
    chosen = set(only) if only else None
    records: list[dict[str, Any]] = []
    for exp_id, experiment in load_experiments(section).items():
        if chosen is not None and exp_id not in chosen:
            continue
        overrides: dict[str, Any] = {}
        if experiment.expect == "oom":
            overrides, why = oom_demo_overrides(exp_id, profile=profile)
            print(f"{exp_id}: {why}", flush=True)
        records.extend(
            run_experiment(
                exp_id, profile=profile, overrides=overrides, results_path=results_path, echo=echo, quick=quick
            )
        )
    return records


def _check_profile_hardware(profile: str, node: Mapping[str, Any]) -> None:
    """A profile that needs CUDA (``gpu``) on a machine where torch has none stops before anything starts."""
    from lab_helpers.experiments import check_profile

    if not check_profile(profile).get("needs_cuda"):
        return
    problem = gpu_problem(node)  # also where CUDA works but the build lacks this GPU's kernels (a V100 on cu130)
    if problem:
        raise LabConfigError(problem)
    import torch

    if not torch.cuda.is_available():
        raise LabConfigError(
            f"profile {profile!r} needs a CUDA GPU and torch sees none here: use --profile ci (LAB_PROFILE=ci) on a CPU"
        )


def record_skipped(
    exp_id: str,
    *,
    reason: str,
    profile: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    results_path: Path | None = None,
) -> list[dict[str, Any]]:
    """Record that the lab chose not to run ``exp_id`` on this node, and why (lab_helpers.node_plan decides:
    too few GPUs, model states larger than the GPU). A skip is a result like any other: tables show its reason.
    """
    run = resolve(exp_id, profile or default_profile(), overrides, check_files=False)
    return _skip({**_base_record(run), "mode": "full"}, reason, results_path, summary=True)


def _skip(base: dict[str, Any], reason: str, results_path: Path | None, summary: bool) -> list[dict[str, Any]]:
    """A skip is a result like any other: recorded with its reason, and said."""
    record = {**base, "status": "skipped", "reason": reason}
    append_record(record, path=results_path)
    if summary:
        print(f"{record['experiment']}: skipped ({reason})")
    return [record]


# ----------------------------------------------------------------------------------------------- pieces


def _base_record(run: ResolvedRun, node: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from lab_helpers.node import environment_summary

    stamp = dt.datetime.now(dt.UTC)
    return {
        "run_id": f"{stamp:%Y%m%d-%H%M%S}-{run.experiment.id}-{uuid.uuid4().hex[:6]}",
        "experiment": run.experiment.id,
        "section": run.experiment.section,
        "profile": run.profile,
        "started_at": stamp.isoformat(timespec="seconds"),
        "rank": None,
        "world_size": run.devices * run.experiment.num_nodes,
        "method": run.experiment.method,
        "strategy": run.experiment.strategy,
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


def predict_experiment(
    exp_id: str,
    *,
    profile: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    gpu_memory_gib: float | None = None,
):
    """The planner's MemoryPlan for an experiment as it would run here (``.summary()`` prints the verdict)."""
    run = resolve(exp_id, profile or default_profile(), overrides, check_files=False)
    return _plan(run, gpu_memory_gib if gpu_memory_gib is not None else _gpu_memory_gib())


def _plan(run: ResolvedRun, gpu_memory_gib: float | None):
    """The notebook shows the prediction, then runs: the second ask (inside run_experiment) is a cache hit."""
    import torch

    recipe_json = json.dumps(runnable_recipe(run.recipe), sort_keys=True, default=str)
    offload = bool(run.experiment.options.get("offload_optimizer", False))
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU run is compared with its live tensor bytes
    return _cached_plan(
        recipe_json, run.devices * run.experiment.num_nodes, run.experiment.strategy, offload, gpu_memory_gib, device
    )


@functools.lru_cache(maxsize=64)
def _cached_plan(
    recipe_json: str,
    devices: int,
    strategy: str,
    offload_optimizer: bool,
    gpu_memory_gib: float | None,
    device: str = "cuda",
):
    from lab_helpers.planner import plan_recipe

    return plan_recipe(
        json.loads(recipe_json),
        devices=devices,
        strategy=strategy,
        offload_optimizer=offload_optimizer,
        gpu_memory_gib=gpu_memory_gib,
        device=device,
    )


OOM_DEMO_MARGIN = 0.2
"""An OOM demonstration must be predicted this far over the GPU's memory (20 %): the planner can be off by
up to ~10 %, and a demonstration that fits by accident teaches the opposite of what it should."""


def oom_demo_overrides(
    exp_id: str, *, profile: str | None = None, max_doublings: int = 6, gpu_memory_gib: float | None = None
) -> tuple[dict[str, Any], str]:
    """Overrides that make an OOM demonstration OOM on *this* GPU, and a sentence saying what was chosen.

    LAB.md's OOM experiments assume an 80 GB GPU; on a larger one they would fit and teach nothing. The
    planner is asked, and the micro (and global) batch doubled until the prediction exceeds the GPU's memory
    by at least ``OOM_DEMO_MARGIN``. ``run_all`` and the notebook both use it.
    """
    profile = profile or default_profile()
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else _gpu_memory_gib()
    if gpu_gib is None:
        return {}, "no GPU here: the experiment runs as defined (an OOM needs a GPU)"
    run = resolve(exp_id, profile, check_files=False)
    train = dict(run.recipe["train"])
    overrides: dict[str, Any] = {}
    needed_gib = gpu_gib * (1 + OOM_DEMO_MARGIN)
    for _ in range(max_doublings + 1):
        plan = _plan(resolve(exp_id, profile, overrides, check_files=False), gpu_gib)
        if plan.fits is False and plan.gpu_used_gib >= needed_gib:
            if not overrides:
                return {}, f"as defined: {plan.summary()}"
            return (
                overrides,
                f"micro batch raised to {overrides['train.micro_batch_size']} so that it will not fit "
                f"(at least {OOM_DEMO_MARGIN:.0%} over this GPU, beyond the planner's error): {plan.summary()}",
            )
        train["micro_batch_size"] *= 2
        train["global_batch_size"] = max(train["global_batch_size"], train["micro_batch_size"])
        overrides = {
            "train.micro_batch_size": train["micro_batch_size"],
            "train.global_batch_size": train["global_batch_size"],
        }
    return {}, f"the planner predicts it fits even at micro batch {train['micro_batch_size']}: runs as defined"


def _prediction_fields(run: ResolvedRun) -> dict[str, Any]:
    """The planner's prediction, stored with the run so plots show predicted beside measured."""
    try:
        plan = _plan(run, _gpu_memory_gib())
    except Exception as exc:  # a prediction is advice: never let it stop a paid-for run
        return {"predicted_peak_alloc_gib": None, "predicted": None, "prediction_error": f"{type(exc).__name__}: {exc}"}
    return {
        "predicted_peak_alloc_gib": plan.peak_alloc_gib,
        "predicted_peak_alloc_whole_run_gib": plan.whole_run_peak_alloc_gib,
        "predicted": plan.to_dict(),
    }


def _gpu_memory_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _command_for(run: ResolvedRun, run_dir: Path) -> list[str]:
    if run.experiment.kind == "lightning":
        from lab_helpers.distributed import build_command

        return build_command(run, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = run_dir / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(runnable_recipe(run.recipe, out_dir=run_dir / "out"), sort_keys=False))
    return [sys.executable, "-m", "lab_helpers.child_litgpt", run.litgpt_command, "--config", str(recipe_file)]


def _total_iterations(run: ResolvedRun) -> int | None:
    if run.experiment.kind == "lightning":
        from lab_helpers.distributed import total_iterations

        return total_iterations(run)
    train = run.recipe.get("train") or {}
    if not train.get("max_steps"):
        return None
    accumulation = train["global_batch_size"] // (train["micro_batch_size"] * run.devices)
    return train["max_steps"] * accumulation


# ----------------------------------------------------------------------------------------------- records


def _records_from(run: ResolvedRun, base: dict, outcome: ProcessOutcome, run_dir: Path) -> list[dict[str, Any]]:
    distributed = run.experiment.kind == "lightning"
    # one record per rank, always: a rank killed before it could report (the OOM killer, SIGKILL) gets one too
    ranks = sorted(set(outcome.reports) | set(range(base["world_size"] if distributed else 1)))
    per_iteration = _per_iteration(run_dir)
    records = []
    for rank in ranks:
        report = outcome.reports.get(rank, {})
        status, reason, error = _status(report, outcome, launched=rank == 0)
        train_s = report.get("train_s")
        tokens, tokens_padded = report.get("tokens"), report.get("tokens_padded")
        iterations = report.get("iterations") or (len(per_iteration) or None)
        record = {
            **base,
            "rank": rank if distributed else None,
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
            "gpu_used_peak_gib": outcome.timeline.gpu_used_peak_for(rank, report.get("device_uuid")),
            "gpu_used_peak_gib_per_gpu": {str(k): v for k, v in outcome.timeline.gpu_used_peak_gib.items()} or None,
            "host_rss_peak_gib": outcome.timeline.host_rss_peak_gib,
            "train_s": train_s,
            "warmup_s": report.get("warmup_s"),
            "warmup_iterations": report.get("warmup_iterations"),
            "wall_s": outcome.wall_s,
            "tokens": tokens,
            "tokens_padded": tokens_padded,
            "iterations": iterations,
            "tokens_per_s": _rate(tokens, train_s),
            "tokens_per_s_padded": _rate(tokens_padded, train_s),
            "mfu": _mfu(run, report, iterations, train_s),
            "device_name": report.get("device_name"),
            "device_uuid": report.get("device_uuid"),
            "strategy_used": report.get("strategy_used"),
            "per_iteration": per_iteration or None,
            "timeline_path": _relative(outcome.timeline.path),
            "log_path": _relative(outcome.log_path),
        }
        records.append(record)
    return records


def _status(
    report: Mapping[str, Any], outcome: ProcessOutcome, *, launched: bool
) -> tuple[str, str | None, str | None]:
    """(status, reason, error) from the rank's own report, the log and the exit code, in that order of trust.

    The exit code belongs to the launched process (rank 0, or the only process): another rank's own "ok"
    stands even when rank 0 died afterwards. A run ended by its time limit is ``timeout`` whatever its ranks
    said on the way out (they see the runner's SIGTERM as an interrupt).
    """
    if outcome.interrupted:
        return "interrupted", "interrupted by the user; every process of the run was ended", None
    if outcome.timed_out:
        why = (
            f"no result within the time limit of {outcome.time_limit_s:.0f} s; every process of the run was ended "
            f"(a longer limit: --time-limit SECONDS or ${TIME_LIMIT_ENV})"
        )
        return "timeout", why, "\n".join(outcome.tail[-20:]) or None
    if report.get("status") in ("oom", "error", "interrupted"):
        return report["status"], _first_line(report.get("error")), report.get("error")
    if report.get("status") == "ok" and (not launched or outcome.returncode == 0):
        return "ok", None, None
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


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[-1][:300] if text and text.strip() else None


def _rate(count: float | None, seconds: float | None) -> float | None:
    if not count or not seconds or seconds <= 0:
        return None
    return count / seconds


def _mfu(run: ResolvedRun, report: Mapping[str, Any], iterations: int | None, train_s: float | None) -> float | None:
    """Model FLOPs utilisation; None on a CPU or an unknown GPU (there is no honest peak to divide by)."""
    device = report.get("device_name")
    if not device or not iterations or not train_s or not report.get("tokens_padded"):
        return None
    from litgpt import Config

    from lab_helpers.flops import mfu, train_flops_per_step

    micro = run.recipe["train"]["micro_batch_size"]
    seq_len = max(1, round(report["tokens_padded"] / (iterations * micro)))  # the mean padded length
    config = Config.from_file(resolve_path(run.recipe["checkpoint_dir"]) / "model_config.yaml")
    lora = {k: v for k, v in run.recipe.items() if k.startswith("lora_")}
    flops = train_flops_per_step(
        config, method=run.experiment.method, lora=lora, micro_batch_size=micro, seq_len=seq_len
    )
    return mfu(
        flops_per_step=flops,
        steps=int(iterations),
        train_s=train_s,
        gpu_name=device,
        precision=run.recipe.get("precision") or "",
    )


def _per_iteration(run_dir: Path) -> list[dict[str, float]]:
    """litgpt's CSV log, one row per logged iteration: iter, loss, iter_time_s, tokens."""
    rows: list[dict[str, float]] = []
    for path in sorted(run_dir.glob("out/logs/**/metrics.csv")):
        with open(path, newline="") as fh:
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


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(results_dir()))
    except ValueError:
        return str(path)


def _one_line(record: Mapping[str, Any]) -> str:
    def fmt(value, unit=""):
        return "n/a" if value is None else f"{value:.3g}{unit}"

    rank = "" if record.get("rank") is None else f" rank {record['rank']}"
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
        parts.append(str(record["reason"]))
    return " | ".join(parts)
