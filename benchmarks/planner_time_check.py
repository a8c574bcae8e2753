"""The time model against measured runs: each finished record's time beside the planner's prediction
(lab_helpers.planning.planner.timing), every fitted figure taken from the *other* records (leave-one-out).

    python benchmarks/planner_time_check.py [--records FILE.jsonl] [--calibration FILE.jsonl ...]
    python benchmarks/planner_time_check.py > benchmarks/planner_time_check.out.txt
    python benchmarks/planner_time_check.py --records reference_results/h100-80gb.jsonl \
        --calibration reference_results/h200-141gb.jsonl > benchmarks/planner_time_check_h100.out.txt
    python benchmarks/planner_time_check.py --records reference_results/h200-141gb.jsonl \
        > benchmarks/planner_time_check_h200.out.txt

Why leave-one-out: a figure fitted to a run predicts that run exactly, which proves nothing.

On a GPU the model is the traced one: per micro-batch the larger of host time (kernels launched, counted in the
trace, x a per-launch host cost) and device time (the roofline of the traced ops), each micro-batch at its own
padded length where the record holds them, plus the optimizer step once per step. Three figures are fitted, and only these: the per-launch cost (to the host-bound records of the same
GPU, the node's figure) and the matmul and bandwidth efficiencies (to the device busy time of the records'
``--trace-steps`` summaries; the H100 records have none, so ``--calibration`` gives the H200's). Each row says
what its figures were fitted on.

What a row is compared with (``calibration.measured_step``): where a record holds each micro-batch's padded length
(``seq_lens``: the H200 records, not the H100's), the median of its timed micro-batches (a length-grouped run's
mean) at their own lengths; in bf16 on Hopper only those of a length the run had seen before, since a first-seen
length builds a cuDNN attention plan (100-150 ms of host a micro-batch), which the model adds apart
(``benchmarks/planner_padding_check.py`` checks it) and which no fitted figure may absorb. Elsewhere the record's
steady time (an iteration over 3x its run's median counts at the median).

On the CPU (reference_results/ci-cpu.jsonl, the default) the model is FLOPs / (measured matmul rate x fitted
MFU) + a fitted overhead per micro-batch, as before: there host and device are one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent


def basis_of(record: dict) -> str:
    """What a record's measured time is of (``calibration.measured_step``): its timed micro-batches on lengths seen
    before where the run builds attention plans, all its timed ones where it builds none (both read off the record's
    ``seq_lens``), else its steady mean (a record from before ``seq_lens``)."""
    from lab_helpers.config.iteration_times import timed_iterations
    from lab_helpers.planning.planner.calibration import builds_attention_plans, gpu_name_of, steady_micro_batches

    steady = steady_micro_batches(record)
    if steady is None:
        return "steady mean"
    timed = len(timed_iterations(record))
    if builds_attention_plans(record["config"].get("precision"), gpu_name_of(record)):
        return f"repeated {len(steady)}/{timed}"
    return f"all {timed} (no plans)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default=str(ROOT / "reference_results" / "ci-cpu.jsonl"))
    parser.add_argument(
        "--calibration",
        action="append",
        default=[],
        help="more records to fit to (never compared): the profiled records whose device time fits the efficiencies",
    )
    args = parser.parse_args(argv)
    from lab_helpers.hardware.cpu_speed import measure_cpu_rates
    from lab_helpers.planning.planner.calibration import CPU, device_key
    from lab_helpers.planning.planner.timing import predicted_vs_measured
    from lab_helpers.record.records import read_records

    def shown(path: str) -> Path:
        resolved = Path(path).resolve()
        return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved

    print(
        "$ python benchmarks/planner_time_check.py"
        + (f" --records {shown(args.records)}" if args.records != parser.get_default("records") else "")
        + "".join(f" --calibration {shown(path)}" for path in args.calibration)
    )
    records = read_records(Path(args.records))
    calibration = [record for path in args.calibration for record in read_records(Path(path))]
    on_cpu = any(device_key(r.get("device_name")) == CPU for r in records if r.get("status") == "ok")
    cpu_rates = measure_cpu_rates() if on_cpu else None
    basis = {id(record): basis_of(record) for record in records if record.get("status") == "ok"}
    ids = {id(record): record for record in records}
    rows = predicted_vs_measured(records, mfu_records=records + calibration, cpu_rates=cpu_rates)
    print(f"# {len(records)} records from {shown(args.records)}; every fitted figure of a row from the other records")
    if cpu_rates is not None:
        _cpu_table(rows, cpu_rates)
    else:
        _gpu_table(rows, records, basis, ids)
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


def _cpu_table(rows: list[dict], cpu_rates) -> None:
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


def _gpu_table(rows: list[dict], records: list[dict], basis: dict[int, str], ids: dict) -> None:
    by_experiment: dict[str, list[dict]] = {}
    for record in records:
        by_experiment.setdefault(str(record.get("experiment")), []).append(record)
    print(
        "# measured: ms per micro-batch, of the timed micro-batches that built no attention plan where the record "
        "holds their lengths (basis), else its steady mean; predicted: step / accumulation (the optimizer step's share "
        "included), at those micro-batches' lengths"
    )
    print(
        f"{'experiment':<12} {'prec':<10} {'mb':>3} {'acc':>3} {'measured':>9} {'basis':<18} {'predicted':>9} "
        f"{'error':>6} {'host':>7} {'device':>7} {'bound':<6} {'kernels':>7} {'prof.k':>7} {'prof.dev':>8}"
    )
    seen: dict[str, int] = {}
    fitted = []
    for row in rows:
        name = str(row["experiment"])
        record = by_experiment[name][seen.get(name, 0)]
        seen[name] = seen.get(name, 0) + 1
        summary = record.get("torch_profile_summary") or {}
        acc = row["gradient_accumulation_iters"]
        prof_k = f"{summary['kernels_per_step'] / acc:>7.0f}" if summary.get("kernels_per_step") else f"{'-':>7}"
        prof_d = (
            f"{summary['device_busy_ms_per_step'] / acc:>8.1f}"
            if summary.get("device_busy_ms_per_step")
            else f"{'-':>8}"
        )
        mb = record["config"]["train"]["micro_batch_size"]
        host, device = row["host_ms_per_micro_batch"], row["device_ms_per_micro_batch"]
        print(
            f"{name:<12} {row['precision']:<10} {mb:>3} {acc:>3} {row['measured_micro_batch_s'] * 1e3:>9.1f} "
            f"{basis.get(id(record), 'steady mean'):<18} {row['predicted_micro_batch_s'] * 1e3:>9.1f} "
            f"{row['error_pct']:>+5.0f}% "
            + (
                f"{host:>7.1f} {device:>7.1f} {row['time_bound']:<6} {row['kernels_per_micro_batch']:>7.0f}"
                if host is not None
                else f"{'-':>7} {'-':>7} {'flops':<6} {'-':>7}"
            )
            + f" {prof_k} {prof_d}"
        )
        if host is not None:
            fitted.append(row)
    print(
        "# host = kernels x per-launch cost; device = roofline of the traced ops; prof.k and prof.dev: kernels and "
        "device busy ms per micro-batch in the record's own profile (optimizer step's share included), for comparison"
    )
    print("# the fitted figures, per row (leave-one-out):")
    for row in fitted:
        print(
            f"  {row['experiment']:<12} per-launch {row['launch_cost_us']:5.1f} us ({row['launch_cost_source']}); "
            f"matmul {row['matmul_efficiency']:.2f}, bandwidth {row['bandwidth_efficiency']:.2f} "
            f"({row['efficiency_source']})"
        )


if __name__ == "__main__":
    sys.exit(main())
