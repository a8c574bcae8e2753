"""The time model against measured runs: each finished record's optimizer-step time beside the planner's
prediction (lab_helpers.planner.timing), its MFU taken from the *other* records (leave-one-out).

    python benchmarks/planner_time_check.py [--records FILE.jsonl] > benchmarks/planner_time_check.out.txt

Why leave-one-out: an MFU derived from a run predicts that run exactly, which proves nothing; predicted from
the others, the error says how well FLOPs / (peak x MFU) + a fixed overhead per micro-batch carries over
between experiments. Default records:
reference_results/ci-cpu.jsonl (the ci profile on a 2-core CPU), where the "peak" is this machine's measured
fp32 matmul rate; it cancels out (MFU derived and used against the same measurement), so the output does not
depend on how busy the machine is now. A GPU session's results/runs.jsonl can be passed with --records.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default=str(ROOT / "reference_results" / "ci-cpu.jsonl"))
    args = parser.parse_args(argv)
    from lab_helpers.planner.timing import predicted_vs_measured
    from lab_helpers.records import read_records

    shown = Path(args.records).resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    print(
        "$ python benchmarks/planner_time_check.py"
        + (f" --records {shown}" if args.records != parser.get_default("records") else "")
    )
    from lab_helpers.cpu_speed import measure_cpu_rates
    from lab_helpers.planner.timing import CPU, device_key

    records = read_records(Path(args.records))
    on_cpu = any(device_key(record.get("device_name")) == CPU for record in records)
    cpu_rates = measure_cpu_rates() if on_cpu else None
    rows = predicted_vs_measured(records, cpu_rates=cpu_rates)
    print(f"# {len(records)} records from {shown}; MFU and overhead for each row fitted to the other records")
    if cpu_rates is not None:
        print(
            f"# CPU peak = this machine's measured fp32 matmul rate, {cpu_rates.matmul_flops_per_s / 1e9:.1f} "
            "GFLOP/s (cached): an MFU over 1 means that timing ran slower than the training did (a busy machine); "
            "predicted seconds do not depend on it (it cancels out)"
        )
        print(
            f"# this machine now: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min); CPU records "
            "measured on a shared, busy machine scatter (leave-one-out then shows the scatter, not the model)"
        )
    print(
        f"{'experiment':<14} {'device':<8} {'method':<6} {'precision':<10} {'measured s':>10} {'predicted s':>11} "
        f"{'error':>8} {'MFU':>6}  MFU from"
    )
    for row in rows:
        print(
            f"{row['experiment']:<14} {row['device']:<8} {row['method']:<6} {row['precision']:<10} "
            f"{row['measured_step_s']:>10.3f} {row['predicted_step_s']:>11.3f} {row['error_pct']:>+7.0f}% "
            f"{row['mfu']:>6.3f}  {row['mfu_source']}"
        )
    if not rows:
        print("no comparable records")
        return 1
    errors = [abs(row["error_pct"]) for row in rows]
    worst = max(rows, key=lambda row: abs(row["error_pct"]))
    within = sum(e <= 50 for e in errors)
    print(
        f"compared {len(rows)}: median |error| {statistics.median(errors):.0f}%, worst {worst['error_pct']:+.0f}% "
        f"({worst['experiment']}), within 50%: {within}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
