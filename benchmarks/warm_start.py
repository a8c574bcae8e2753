"""What the warm start saves: one launcher runs the same experiment N times, every run cold, then warm.

    python benchmarks/warm_start.py --profile ci --runs 4 grad-accum > benchmarks/warm_start.out.txt

Why: a ci-profile run trains for about a second and spent 6-9 s importing torch, Lightning and litgpt; the
notebooks and the test suite start ~60 such runs. ``warm_start`` forks a launcher's later runs from a Python that
imported them once. Each figure is the run's ``wall_s`` (launch to exit, as recorded), and its ``train_s``
beside it: the training itself must not change. The first warm-mode run is cold (a launcher's first run always
is) and the second includes the server's imports; the runs after that show the steady saving.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_helpers.lab import run_experiment  # noqa: E402
from lab_helpers.launch import warm_start  # noqa: E402


def runs(experiment: str, profile: str, count: int, *, warm: bool) -> list[dict]:
    """``count`` runs from one launcher (this process), with a fresh ``WarmStarter``."""
    os.environ[warm_start.WARM_START_ENV] = "1" if warm else "0"
    warm_start._starter = warm_start.WarmStarter()
    try:
        return [run_experiment(experiment, profile=profile, echo=False, summary=False)[0] for _ in range(count)]
    finally:
        warm_start._starter.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3: the first is cold and the second starts the server")
    os.environ.setdefault("LAB_RESULTS", tempfile.mkdtemp(prefix="lab-warm-start-"))
    print(f"$ python benchmarks/warm_start.py --profile {args.profile} --runs {args.runs} {args.experiment}")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}, OMP_NUM_THREADS={threads}"
    )
    print(f"{'mode':<5} {'run':>3} {'start':<5} {'status':<6} {'wall_s':>7} {'train_s':>7}")
    steady: dict[str, list[float]] = {}
    for warm in (False, True):
        mode = "warm" if warm else "cold"
        for number, record in enumerate(runs(args.experiment, args.profile, args.runs, warm=warm), start=1):
            print(
                f"{mode:<5} {number:>3} {record['process_start'] or '-':<5} {record['status']:<6} "
                f"{record['wall_s']:>7.2f} {record['train_s'] or float('nan'):>7.2f}"
            )
            if number >= 3:
                steady.setdefault(mode, []).append(record["wall_s"])
    cold, warm_ = statistics.median(steady["cold"]), statistics.median(steady["warm"])
    print(
        f"median wall_s of runs 3..{args.runs}: cold {cold:.2f} s, warm {warm_:.2f} s, saved {cold - warm_:.2f} s a run"
    )


if __name__ == "__main__":
    main()
