"""Expected minutes per single-GPU experiment, full and quick mode, on a named GPU: a prediction, not a measurement.

    python benchmarks/quick_mode_minutes.py [--gpu "NVIDIA H100 80GB HBM3"] [--mfu 0.35] > benchmarks/quick_mode_minutes.out.txt

Why: a session with a GPU has minutes, not hours, and a student's lease is 2-3 hours; both need to know before
starting whether a section fits. No GPU has run the lab yet, so these figures are *computed* from the lab's own
parts -- the experiment matrix as resolved for the gpu profile, the quick-mode step count, litgpt's model
configs, ``flops.train_flops_per_step`` and the lab's dense peak table -- under the assumptions printed with them
(an MFU, a checkpoint read rate, a fixed start-up). Every micro-batch is counted at the recipe's full
``max_seq_length`` (batches are padded to their longest sample, so this is an upper bound on the arithmetic).
Measured times replace these once GPU records exist (``reference_results/``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from litgpt import Config  # noqa: E402

from lab_helpers.config.experiments import load_experiments, resolve  # noqa: E402
from lab_helpers.hardware.gpu_peaks import dense_peak_flops  # noqa: E402
from lab_helpers.planning.arithmetic import count_params  # noqa: E402
from lab_helpers.planning.flops import train_flops_per_step  # noqa: E402
from lab_helpers.training.quick_mode import quick_overrides  # noqa: E402

STARTUP_S = 30.0
"""Python, torch, litgpt and Lightning imports, the data set's tokenisation and the sanity validation."""
CHECKPOINT_READ_GB_PER_S = 1.0
"""Reading (and, for QLoRA, quantising) the 16-bit checkpoint from a local NVMe disk, GB/s."""
CHECKPOINT_BYTES_PER_PARAM = 2


def experiment_rows(gpu: str, mfu: float) -> list[dict]:
    """Per experiment: start-up and load seconds, seconds per micro-batch, micro-batches in full and quick mode."""
    rows = []
    for exp_id, experiment in load_experiments("single").items():
        run = resolve(exp_id, "gpu", check_files=False)
        train = run.recipe["train"]
        name = Path(run.recipe["checkpoint_dir"]).name
        precision = run.recipe.get("precision") or "32-true"
        row = {"id": exp_id, "model": name, "precision": precision, "steps": [train["max_steps"]], "peak": None}
        row["steps"].append(quick_overrides(train, ranks=1).get("train.max_steps", train["max_steps"]))
        rows.append(row)
        row["peak"] = dense_peak_flops(gpu, precision)
        if row["peak"] is None:
            continue
        flops = train_flops_per_step(
            Config.from_name(name),
            method=experiment.method,
            lora={k: v for k, v in run.recipe.items() if k.startswith("lora_")},
            micro_batch_size=train["micro_batch_size"],
            seq_len=train["max_seq_length"],
        )
        params = count_params(run.recipe["checkpoint_dir"]).total
        row["load_s"] = STARTUP_S + params * CHECKPOINT_BYTES_PER_PARAM / (CHECKPOINT_READ_GB_PER_S * 1e9)
        row["iteration_s"] = flops / (row["peak"] * mfu)
        accumulation = train["global_batch_size"] // train["micro_batch_size"]
        row["iterations"] = [1 if experiment.expect == "oom" else steps * accumulation for steps in row["steps"]]
        row["minutes"] = [(row["load_s"] + n * row["iteration_s"]) / 60 for n in row["iterations"]]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="a GPU name as NVML reports it")
    parser.add_argument("--mfu", type=float, default=0.35, help="assumed model FLOPs utilisation (0-1)")
    args = parser.parse_args(argv)
    if not 0 < args.mfu <= 1:
        parser.error(f"--mfu must be in (0, 1]; got {args.mfu}")

    print(f"# command: python benchmarks/quick_mode_minutes.py --gpu {args.gpu!r} --mfu {args.mfu}")
    print(
        f"# PREDICTED, not measured: assumed MFU {args.mfu:.0%}, start-up {STARTUP_S:.0f} s, checkpoint read "
        f"{CHECKPOINT_READ_GB_PER_S:.1f} GB/s, every micro-batch at max_seq_length; an expected OOM ends after "
        f"loading and one micro-batch"
    )
    header = (
        f"{'experiment':<14} {'model':<42} {'precision':<10} {'full steps':>10} {'quick steps':>11} "
        f"{'full min':>8} {'quick min':>9}"
    )
    print(header)
    print("-" * len(header))
    rows = experiment_rows(args.gpu, args.mfu)
    for row in rows:
        if row["peak"] is None:
            print(f"{row['id']:<14} {row['model']:<42} {row['precision']:<10} no dense peak for this GPU/precision")
            continue
        print(
            f"{row['id']:<14} {row['model']:<42} {row['precision']:<10} {row['steps'][0]:>10} {row['steps'][1]:>11} "
            f"{row['minutes'][0]:>8.1f} {row['minutes'][1]:>9.1f}"
        )
    timed = [row for row in rows if row["peak"] is not None]
    full, quick = (sum(row["minutes"][i] for row in timed) for i in (0, 1))
    loading = sum(row["load_s"] for row in timed) / 60
    print("-" * len(header))
    print(f"{'section':<14} {'':<42} {'':<10} {'':>10} {'':>11} {full:>8.1f} {quick:>9.1f}")
    print(
        f"# quick mode: {quick:.1f} of {full:.1f} predicted minutes; start-up and checkpoint loading are "
        f"{loading:.1f} min of the quick pass ({math.ceil(100 * loading / quick)}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
