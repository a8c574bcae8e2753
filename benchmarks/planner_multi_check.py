"""The planner's per-rank prediction against rank 0 of an N-rank run, measured alone on this CPU (simulated ranks).

    python benchmarks/planner_multi_check.py [--only SUBSTRING] [--worlds 2,4,8] > benchmarks/planner_multi_check.out.txt
    python benchmarks/planner_multi_check.py --records reference_results/h200-141gb.jsonl \
        > benchmarks/planner_multi_check_h200.out.txt   # the GPU section: CUDA records against the planner now

Why: the multi-GPU section's per-rank predictions (DDP's buckets, FSDP's shards and gathered units, ZeRO's
partitions and buckets) cannot be checked against N real GPUs on the machines this project gets. A rank's memory
does not depend on the other ranks being real, so each experiment runs as rank 0 of a world of N with torch's
fake process group (``run_experiment(..., simulate_world=N)``: Lightning's own strategies, no communication)
and its peak of live tensor bytes (``peak_tensor_gib``, the CPU counterpart of max_memory_allocated) is
compared with the planner's prediction for a CPU (``device="cpu"``). Targets: every row within 10 %, the median
within 5 %. The course's own settings (``ddp-course``, ``fsdp-course``) are teaching rows, checked the same way.

Every run uses the ci profile's recipe with ``train.global_batch_size`` = micro batch x N x 2, so each rank
accumulates 2 micro-batches per optimizer step at every N (the lab's ``fsdp`` recipe on its reference 4 GPUs
does the same), and quick mode's step count. The course's rows too: they resolve without accumulation (the course
ran batch 4 per GPU; ``accumulation: 1`` in configs/experiments/multi.yaml), but a run's own global batch wins,
so here they accumulate 2 like the rest. Records go to a throw-away results folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROW_TARGET = 0.10
MEDIAN_TARGET = 0.05
EXPERIMENTS = ("ddp", "fsdp", "fsdp-bs8", "fsdp-grad-op", "deepspeed-offload", "deepspeed-zero2-offload")
COURSE_ROWS = ("ddp-course", "fsdp-course")
WORLDS = (2, 4, 8)
ACCUMULATION = 2


def simulated_overrides(exp_id: str, world_size: int, *, profile: str = "ci") -> dict[str, int]:
    """The global batch that gives every one of ``world_size`` ranks ``ACCUMULATION`` micro-batches per step."""
    from lab_helpers.config.experiments import resolve

    micro = int(resolve(exp_id, profile, check_files=False).recipe["train"]["micro_batch_size"])
    return {"train.global_batch_size": micro * world_size * ACCUMULATION}


def check_row(exp_id: str, world_size: int, *, profile: str = "ci") -> dict:
    """Run rank 0 of ``world_size`` for ``exp_id`` and return its record's measured and predicted peaks."""
    from lab_helpers.lab import run_experiment

    [record] = run_experiment(
        exp_id,
        profile=profile,
        overrides=simulated_overrides(exp_id, world_size, profile=profile),
        simulate_world=world_size,
        echo=False,
        summary=False,
        quick=True,
    )
    measured, predicted = record.get("peak_tensor_gib"), record.get("predicted_peak_alloc_gib")
    error = (predicted - measured) / measured if measured and predicted else None
    return {"record": record, "measured": measured, "predicted": predicted, "error": error}


def gpu_rows(records_path: Path) -> int:
    """The GPU section: each simulated-rank record of ``records_path`` (rank 0 of N on one CUDA GPU, its
    ``peak_alloc_gib``) beside the prediction it stored and the planner's prediction now, asked with the record's
    own experiment, overrides and N."""
    import json

    from lab_helpers.planning.predict import predict_experiment

    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get("simulated_world_size") and r.get("status") == "ok"]
    print(f"$ python benchmarks/planner_multi_check.py --records {records_path}")
    gpus = sorted({str((r.get("environment") or {}).get("gpu_names", ["?"])[0]) for r in records})
    print(f"# {len(records)} simulated-rank records on {', '.join(gpus)}: rank 0 of N alone on one GPU (fake process "
          "group); measured = max_memory_allocated over the training loop")  # fmt: skip
    print(f"{'experiment':<14} {'N':>2} {'accum':>5} {'measured GiB':>12} {'stored pred':>11} {'error':>8} "
          f"{'predicted now':>13} {'error':>8}  peak phase now")  # fmt: skip
    errors: dict[str, list[float]] = {"lab": [], "course": []}
    for r in records:
        n, measured, stored = r["simulated_world_size"], r["peak_alloc_gib"], r["predicted_peak_alloc_gib"]
        plan = predict_experiment(r["experiment"], profile=r["profile"], overrides=r.get("overrides"), device="cuda",
                                  simulate_world=n, gpu_memory_gib=(r.get("predicted") or {}).get("gpu_memory_gib"))  # fmt: skip
        train = r["config"]["train"]
        accumulation = train["global_batch_size"] // (train["micro_batch_size"] * n)
        error = (plan.peak_alloc_gib - measured) / measured
        errors["course" if r["experiment"] in COURSE_ROWS else "lab"].append(error)
        print(f"{r['experiment']:<14} {n:>2} {accumulation:>5} {measured:>12.2f} {stored:>11.2f} "
              f"{(stored - measured) / measured:>+8.1%} {plan.peak_alloc_gib:>13.2f} {error:>+8.1%}  {plan.peak_phase}")  # fmt: skip
    ok = True
    for group, values in errors.items():
        if values:
            median = statistics.median(abs(e) for e in values)
            within = sum(abs(e) <= ROW_TARGET for e in values)
            print(f"{group} rows now: compared {len(values)}, within {ROW_TARGET:.0%}: {within}, median |error| "
                  f"{median:.1%} (target {MEDIAN_TARGET:.0%}), worst {max(values, key=abs):+.1%}")  # fmt: skip
            ok = ok and within == len(values) and median <= MEDIAN_TARGET
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only experiments whose id contains this text")
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="world sizes, comma-separated")
    parser.add_argument("--records", type=Path, default=None,
                        help="a GPU's records (e.g. reference_results/h200-141gb.jsonl): its simulated ranks against "
                        "the planner now, instead of running on this CPU")  # fmt: skip
    args = parser.parse_args(argv)
    if args.records:
        return gpu_rows(args.records)
    os.environ["LAB_RESULTS"] = tempfile.mkdtemp(prefix="planner-multi-check-")
    import torch

    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)
    worlds = [int(w) for w in args.worlds.split(",")]
    shown = " ".join(f"--{k} {v}" for k, v in (("only", args.only), ("worlds", args.worlds)) if v and v != ",".join(map(str, WORLDS)))
    print(f"$ python benchmarks/planner_multi_check.py {shown}".rstrip())
    print(
        f"# torch {torch.__version__}, {os.cpu_count()} CPUs, no GPU: rank 0 of N alone (fake process group); "
        "measured = peak of live tensor bytes over the training loop"
    )
    print(f"{'experiment':<24} {'N':>2} {'status':<8} {'measured GiB':>12} {'predicted GiB':>13} {'error':>8}  strategy used")
    errors: dict[str, list[float]] = {"lab": [], "course": []}
    failed = 0
    for exp_id in (*EXPERIMENTS, *COURSE_ROWS):
        if args.only and args.only not in exp_id:
            continue
        for world_size in worlds:
            row = check_row(exp_id, world_size)
            record = row["record"]
            if row["error"] is None:
                failed += 1
                reason = record.get("reason") or record.get("prediction_error") or "no figure"
                print(f"{exp_id:<24} {world_size:>2} {record['status']:<8} {'':>12} {'':>13} {'':>8}  {reason}")
                continue
            errors["course" if exp_id in COURSE_ROWS else "lab"].append(row["error"])
            used = str(record.get("strategy_used") or "").split(";")[0]
            print(
                f"{exp_id:<24} {world_size:>2} {'ok':<8} {row['measured']:>12.4f} {row['predicted']:>13.4f}"
                f" {row['error']:>+8.1%}  {used}"
            )
    ok = failed == 0
    for group, values in errors.items():
        if not values:
            continue
        median = statistics.median(abs(e) for e in values)
        within = sum(abs(e) <= ROW_TARGET for e in values)
        print(
            f"{group} rows: compared {len(values)}, within {ROW_TARGET:.0%}: {within}, median |error| {median:.1%} "
            f"(target {MEDIAN_TARGET:.0%}), worst {max(values, key=abs):+.1%}"
        )
        ok = ok and within == len(values) and median <= MEDIAN_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
