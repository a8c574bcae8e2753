"""What the multi-GPU notebook shows around each run: the planner's prediction and the per-rank result rows.

Kept out of the notebook so its cells stay one or two lines, and so CI tests the same code the students run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RANK_COLUMNS = (
    "experiment",
    "rank",
    "simulated_world_size",
    "status",
    "strategy_used",
    "peak_alloc_gib",
    "peak_tensor_gib",
    "peak_reserved_gib",
    "gpu_used_peak_gib",
    "host_rss_peak_gib",
    "train_s",
    "tokens_per_s",
    "reason",
)


def prediction_text(
    exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None, simulate_world: int | None = None
) -> str:
    """Never raises: a prediction is advice, and a planner failure must not stop the student from running."""
    from lab_helpers.planning.predict import predict_experiment

    try:
        plan = predict_experiment(exp_id, profile=profile, overrides=overrides, simulate_world=simulate_world)
    except Exception as exc:  # noqa: BLE001
        return f"{exp_id}: no prediction ({type(exc).__name__}: {exc})"
    lines = [f"{exp_id}: {plan.summary()}", f"  host RAM predicted: {plan.host_gib:.1f} GiB"]
    parts = {k: v for k, v in (plan.breakdown_gib or {}).items() if v}
    if parts:
        lines.append("  per GPU, GiB: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
    return "\n".join(lines)


def show_prediction(
    exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None, simulate_world: int | None = None
) -> None:
    print(prediction_text(exp_id, profile=profile, overrides=overrides, simulate_world=simulate_world))


def rank_rows(records: Sequence[Mapping[str, Any]]):
    """One row per rank with the columns that matter for distribution (a pandas DataFrame)."""
    import pandas as pd

    frame = pd.DataFrame([{c: r.get(c) for c in RANK_COLUMNS} for r in records], columns=list(RANK_COLUMNS))
    return frame.round(3)


def check_records(records: Mapping[str, Sequence[Mapping[str, Any]]], expected: Mapping[str, set[str]]) -> list[str]:
    """The check CI relies on for the multi-GPU section: nbval runs the notebook's last cell on the ci profile.
    ``expected``: each experiment's accepted statuses ({"ok", "skipped"} where a machine may lack what it needs)."""
    problems = []
    for exp_id, allowed in expected.items():
        recs = list(records.get(exp_id) or [])
        if not recs:
            problems.append(f"{exp_id}: no record")
            continue
        statuses = {r.get("status") for r in recs}
        if not statuses <= set(allowed):
            problems.append(f"{exp_id}: status {sorted(statuses)} not in {sorted(allowed)}")
        if statuses == {"skipped"}:
            if not recs[0].get("reason"):
                problems.append(f"{exp_id}: skipped without a reason")
            continue
        world = recs[0].get("world_size") or 1
        ranks = sorted(r.get("rank") or 0 for r in recs)
        if ranks != list(range(world)):
            problems.append(f"{exp_id}: ranks {ranks}, expected one record per rank of {world}")
        finished = [r for r in recs if r.get("status") == "ok"]
        if finished:  # every rank ran the same resolved experiment: resolve it once
            from lab_helpers.config.experiments import resolve

            first = finished[0]
            run = resolve(
                str(first["experiment"]), str(first["profile"]), first.get("overrides"), check_files=False,
                simulate_world=first.get("simulated_world_size"),
            )  # fmt: skip
            problems += [f"{exp_id} rank {r.get('rank')}: {p}" for r in finished for p in _ok_rank_problems(r, run)]
    return problems


def _ok_rank_problems(record: Mapping[str, Any], run) -> list[str]:
    from lab_helpers.config.record_schema import record_problems

    problems = record_problems(record)
    if not (record.get("train_s") or 0) > 0 or not (record.get("iterations") or 0) >= 1:
        problems.append(
            f"no timed iterations after warm-up (train_s {record.get('train_s')}, iterations {record.get('iterations')})"
        )
    if not record.get("per_iteration") or not record.get("device_name"):
        problems.append("no per-iteration rows or no device name")
    if record.get("world_size") != run.ranks_run:  # a simulated rank: 1 process really run
        problems.append(f"world size {record.get('world_size')}, the experiment asks for {run.ranks_run}")
    if record.get("simulated_world_size") != run.simulated_world_size:
        problems.append(f"simulated world {record.get('simulated_world_size')}, asked {run.simulated_world_size}")
    used = str(record.get("strategy_used") or "")
    wanted = strategy_words(run.experiment.strategy, run.options)
    missing = [w for w in wanted if w not in used]
    if missing or ("SHARD_GRAD_OP" in used) != ("SHARD_GRAD_OP" in wanted):
        problems.append(f"strategy_used {used!r} is not the {run.experiment.strategy} asked for ({', '.join(wanted)})")
    return problems


def strategy_words(strategy: str, options: Mapping[str, Any]) -> list[str]:
    """Whichever Lightning class ran it: FSDP1 or FSDP2, CUDA or CPU."""
    if strategy == "fsdp":
        return ["fsdp", "SHARD_GRAD_OP"] if options.get("sharding") == "grad-op" else ["fsdp"]
    if strategy.startswith("deepspeed-zero"):
        words = [f"deepspeed zero{strategy.removeprefix('deepspeed-zero')}"]
        return words + (["cpu offload"] if options.get("offload_optimizer") else [])
    return {"single": ["single device"]}.get(strategy, [strategy])


SCALING_GPUS = (2, 4, 8)
"""multi.yaml's global batches divide by the micro batch times each of these."""


def batch_words(steps: Mapping[str, Any], *exp_ids: str, gpus: Sequence[int] = SCALING_GPUS) -> str:
    """Read from the recipes, never typed: the gpu profile's first, then the run as this node makes it (``steps``)."""
    from lab_helpers.config.experiments import resolve

    def spelled(run) -> str:
        return f"{run.recipe['train']['micro_batch_size']} × {run.gradient_accumulation} × {run.world_size}"

    def global_batch(run) -> int:
        return int(run.recipe["train"]["global_batch_size"])

    lines = ["Samples per optimizer step = micro batch × micro-batches per step × GPUs; the gpu profile's recipes:"]
    for exp_id in exp_ids:
        run = resolve(exp_id, "gpu", check_files=False)
        runs = (
            [run]
            if not run.experiment.distributed or run.experiment.strategy == "single"
            else [resolve(exp_id, "gpu", check_files=False, simulate_world=n) for n in gpus]
        )
        sizes = {global_batch(r) for r in runs}
        if len(sizes) == 1:
            lines.append(f"  {exp_id}: {sizes.pop()} = " + " = ".join(spelled(r) for r in runs))
        else:
            lines.append(f"  {exp_id}: " + "; ".join(f"{global_batch(r)} = {spelled(r)}" for r in runs))
    here = []
    for exp_id in exp_ids:
        step = steps.get(exp_id)
        if step is None:
            continue
        if not step.runs:
            here.append(f"{exp_id} not run")
            continue
        run = resolve(exp_id, step.profile, step.overrides, check_files=False, simulate_world=step.simulate_world)
        simulated = f" (rank 0 of {run.simulated_world_size}, simulated)" if run.simulated_world_size else ""
        here.append(f"{exp_id} {global_batch(run)} = {spelled(run)}{simulated}")
    if here:
        lines.append(f"As this node runs them ({steps[next(iter(steps))].profile} profile): " + "; ".join(here))
    return "\n".join(lines)


def offload_time_words(exp_id: str = "deepspeed-offload") -> str:
    """The model adds the host's optimizer step and the PCIe copies to the step, overlapping none of it: a
    prediction, and said so. Never raises: advice before a run."""
    from lab_helpers.present.plan_command import experiment_time

    try:
        plan, why, _ = experiment_time(exp_id, profile="gpu")
    except Exception as exc:  # noqa: BLE001
        return f"{exp_id}: no time prediction ({type(exc).__name__}: {exc})"
    if plan is None:
        return f"{exp_id}: no time prediction ({why})"
    text = (
        f"Predicted by the time model, not measured: `{exp_id}` as the gpu profile runs it on {plan.devices} x "
        f"{plan.device_name}, {plan.gradient_accumulation_iters} micro-batches of {plan.micro_batch_size} per "
        f"optimizer step: the GPUs compute {plan.compute_s:.3g} s, then wait {plan.offload_s:.3g} s for the offload "
        f"(the CPU's Adam step {plan.optimizer_host_s:.3g} s, at torch Adam's rate measured on this machine's CPU, "
        f"and the copies over PCIe {plan.offload_transfer_s:.3g} s): {100 * plan.offload_s / plan.step_s:.0f} % of "
        f"the {plan.step_s:.3g} s step"
    )
    if plan.communication_s:
        return text + f" (communication between the GPUs {plan.communication_s:.3g} s of it)"
    return text + " (communication between the GPUs not included: no link bandwidth measured here)"
