"""The cost of measuring: litgpt's own per-iteration time, plain ``litgpt finetune_*`` against the same recipe run by
the lab.

    python benchmarks/measurement_overhead.py --profile gpu --steps 12 small-batch full-7b \
        > benchmarks/measurement_overhead.out.txt

Why: the lab wraps litgpt (``child_litgpt``: a clock on the batches, peak-memory readings, an NVML sampler in the
parent), and a student must be able to trust that the wrapping does not change what it measures (the
target: within 1 %). Both runs get the same resolved recipe, file for file (same checkpoint, data, seed, so the
same batches in the same order); the lab runs in full mode (quick mode reorders batches, plain litgpt would not).
Compared is litgpt's own ``iter_time`` from its CSV log (``out/logs/**/metrics.csv``), median over the
micro-batches after the first optimizer step, plain first, then the lab, ``--repeat`` times; beside it each
run's wall time from launch to exit (the lab's includes its start-up: planner prediction, sampler, record).

On a CPU (``--profile ci``) this shows the code path only: there the lab also counts live tensor bytes
(``tensor_peak``; LAB_TENSOR_PEAK=0 turns it off), which costs time on purpose, and a GPU has no such counter:
``--tensor-peak both`` (the default on ci) runs the lab twice per try, counting on and off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_helpers.config.experiments import resolve, runnable_recipe  # noqa: E402
from lab_helpers.lab import run_experiment  # noqa: E402
from lab_helpers.record.run_record import per_iteration_rows  # noqa: E402


def steady_iteration_s(rows: list[dict], warmup_iterations: int) -> tuple[float, int]:
    """Median litgpt ``iter_time`` after the warm-up micro-batches, and how many it is the median of."""
    times = [row["iter_time_s"] for row in rows[warmup_iterations:] if row.get("iter_time_s") is not None]
    if not times:
        raise SystemExit(f"no iterations after the {warmup_iterations} of warm-up: give more --steps")
    return statistics.median(times), len(times)


def plain_litgpt(run, folder: Path) -> tuple[list[dict], float]:
    """``python -m litgpt <command> --config R`` on the lab's resolved recipe, nothing of the lab around it:
    its per-iteration rows and its wall time (s)."""
    folder.mkdir(parents=True)
    recipe_file = folder / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(runnable_recipe(run.recipe, out_dir=folder / "out"), sort_keys=False))
    start = time.perf_counter()
    with open(folder / "output.log", "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "litgpt", run.litgpt_command, "--config", str(recipe_file)],
            stdout=log, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"plain litgpt failed (exit {done.returncode}): see {folder / 'output.log'}")
    wall_s = time.perf_counter() - start
    return per_iteration_rows(folder), wall_s


def lab_run(exp_id: str, profile: str, overrides: dict, *, tensor_peak: bool) -> dict:
    """The same recipe run by the lab (full mode), live-tensor counting on or off (``LAB_TENSOR_PEAK``)."""
    os.environ["LAB_TENSOR_PEAK"] = "1" if tensor_peak else "0"  # the child inherits the launcher's environment
    [record] = run_experiment(exp_id, profile=profile, overrides=overrides, echo=False, summary=False, quick=False)
    if record["status"] != "ok":
        raise SystemExit(f"the lab's run of {exp_id} ended {record['status']}: {record.get('reason')}")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="+", metavar="EXPERIMENT", help="single-GPU experiment ids")
    parser.add_argument("--profile", default=os.environ.get("LAB_PROFILE") or "gpu", choices=("gpu", "ci"))
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of each run (the first is warm-up)")
    parser.add_argument("--repeat", type=int, default=1, help="plain, then lab, this many times per experiment")
    parser.add_argument("--tensor-peak", choices=("on", "off", "both"), default=None,
                        help="the lab's live-tensor counting (CPU only; default: both on ci, on on gpu)")
    args = parser.parse_args(argv)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.tensor_peak or
                                                                 ("both" if args.profile == "ci" else "on")]
    if args.steps < 2 or args.repeat < 1:
        parser.error("--steps must be >= 2 and --repeat >= 1")

    overrides = {"train.max_steps": args.steps, "train.lr_warmup_steps": 1, "train.log_interval": 1}
    print(f"# {' '.join(sys.argv)}")
    print(f"# profile {args.profile}, {args.steps} optimizer steps per run, first step excluded, medians of litgpt's "
          "iter_time; lab in full mode")  # fmt: skip
    print(f"{'experiment':<14}{'try':>4}{'tensor peak':>12}{'micro-batches':>15}{'plain ms':>11}{'lab ms':>10}"
          f"{'lab - plain':>13}{'plain wall s':>14}{'lab wall s':>12}")
    with tempfile.TemporaryDirectory(prefix="lab-overhead-") as tmp:
        for exp_id in args.experiments:
            run = resolve(exp_id, args.profile, overrides)
            accumulation = run.recipe["train"]["global_batch_size"] // run.recipe["train"]["micro_batch_size"]
            for attempt in range(1, args.repeat + 1):
                rows, plain_wall_s = plain_litgpt(run, Path(tmp) / f"{exp_id}-{attempt}")
                plain_s, n = steady_iteration_s(rows, accumulation)
                for counting in modes:
                    record = lab_run(exp_id, args.profile, overrides, tensor_peak=counting)
                    lab_s, _ = steady_iteration_s(record["per_iteration"], accumulation)
                    print(f"{exp_id:<14}{attempt:>4}{'on' if counting else 'off':>12}{n:>15}{plain_s * 1e3:>11.1f}"
                          f"{lab_s * 1e3:>10.1f}{(lab_s - plain_s) / plain_s:>+13.1%}{plain_wall_s:>14.1f}"
                          f"{record['wall_s']:>12.1f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
