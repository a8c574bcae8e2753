"""The planner against real training loops on this CPU: every single-GPU experiment of the ci profile, run for
real, its peak of live tensor bytes (``peak_tensor_gib``) beside the planner's prediction for a CPU.

    python benchmarks/planner_cpu_check.py [--only SUBSTRING] > benchmarks/planner_cpu_check.out.txt

Why: the planner's GPU accuracy can only be checked on a GPU, but the quantity it computes -- the bytes of live
tensors at the step's worst moment -- exists on any machine. On a CPU the lab counts it in the real litgpt loop
(lab_helpers.training.tensor_peak); the planner predicts it with ``device="cpu"`` (no CUDA context, no cuBLAS
workspace). Target: each within 10 %. The whole process's peak (checkpoint load included:
``peak_tensor_whole_run_gib``) is compared with the planner's whole-run prediction too. Runs use quick mode's
step count where it is shorter. Records go to a throw-away results folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 0.10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only experiments whose id contains this text")
    args = parser.parse_args(argv)
    os.environ["LAB_RESULTS"] = tempfile.mkdtemp(prefix="planner-cpu-check-")
    import torch

    from lab_helpers.assets import prepare_ci
    from lab_helpers.config.experiments import load_experiments
    from lab_helpers.lab import run_experiment

    prepare_ci(progress=lambda *_: None)
    print("$ python benchmarks/planner_cpu_check.py" + (f" --only {args.only}" if args.only else ""))
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, no GPU: measured = peak of live tensor bytes")
    print(
        f"{'experiment':<14} {'status':<8} {'measured GiB':>12} {'predicted GiB':>13} {'error':>8}"
        f" {'whole measured':>14} {'whole predicted':>15} {'error':>8}"
    )
    errors = []
    whole_errors = []
    for exp_id in load_experiments("single"):
        if args.only and args.only not in exp_id:
            continue
        [record] = run_experiment(exp_id, profile="ci", echo=False, summary=False, quick=True)
        measured, predicted = record.get("peak_tensor_gib"), record.get("predicted_peak_alloc_gib")
        if record["status"] != "ok" or not measured or not predicted:
            print(f"{exp_id:<14} {record['status']:<8} {'':>12} {'':>13} {'':>8} {record.get('reason') or ''}")
            continue
        error = (predicted - measured) / measured
        errors.append(error)
        whole, whole_pred = record.get("peak_tensor_whole_run_gib"), record.get("predicted_peak_alloc_whole_run_gib")
        whole_cols = ""
        if whole and whole_pred:
            whole_errors.append((whole_pred - whole) / whole)
            whole_cols = f" {whole:>14.4f} {whole_pred:>15.4f} {whole_errors[-1]:>+8.1%}"
        print(f"{exp_id:<14} {'ok':<8} {measured:>12.4f} {predicted:>13.4f} {error:>+8.1%}{whole_cols}")
    if not errors:
        print("no comparable runs")
        return 1
    worst = max(errors, key=abs)
    within = sum(abs(e) <= TARGET for e in errors)
    print(
        f"training loop: compared {len(errors)}, within {TARGET:.0%}: {within}, median |error| "
        f"{statistics.median(abs(e) for e in errors):.1%}, worst {worst:+.1%}"
    )
    whole_within = sum(abs(e) <= TARGET for e in whole_errors)
    if whole_errors:
        print(
            f"whole run: compared {len(whole_errors)}, within {TARGET:.0%}: {whole_within}, median |error| "
            f"{statistics.median(abs(e) for e in whole_errors):.1%}, worst {max(whole_errors, key=abs):+.1%}"
        )
    return 0 if within == len(errors) and whole_within == len(whole_errors) else 1


if __name__ == "__main__":
    sys.exit(main())
