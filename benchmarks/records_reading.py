"""How long reading records takes, and how much memory. CPU time and
peak RSS of each child (os.wait4: that process alone), so a busy machine moves the wall time, not these.

    .venv/bin/python benchmarks/records_reading.py > benchmarks/records_reading.out.txt

Two kinds of records: the shipped ci-cpu records repeated (as a review measured: 100,000 took `results` 45.8 s and
5.8 GB, `compare` 35.5 s and 3.0 GB, a reference 67.6 s and 5.0 GB), and GPU-shaped ones: the shipped H200 and
H100 records, 8-44 timed iterations each, every record's iteration times and busy figure jittered so that no two
are alike (a class's term: each run's steady spread is bootstrapped on every read, and runs of one experiment on
one GPU are pooled by ``agree_within_noise``). ``compare --reference`` reads the same file as a shipped reference.
"""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab_helpers.record.records import read_records  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/records_reading.py > benchmarks/records_reading.out.txt"
MEMORY_TARGET_MB = 2048


def child(args: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS in MB) of ``python -m lab_helpers ARGS``."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "lab_helpers", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=REPO, env=env)  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"python -m lab_helpers {' '.join(args)} exited {process.returncode}")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - start, usage.ru_maxrss / 1024


def write_ci(path: Path, count: int) -> None:
    shipped = read_records(REPO / "reference_results" / "ci-cpu.jsonl")
    with open(path, "w") as fh:
        for i in range(count):
            fh.write(json.dumps({**shipped[i % len(shipped)], "run_id": f"r{i}", "timeline_path": None}) + "\n")


def write_gpu(path: Path, count: int) -> None:
    shipped = [*read_records(REPO / "reference_results" / "h200-141gb.jsonl"),
               *read_records(REPO / "reference_results" / "h100-80gb.jsonl")]  # fmt: skip
    draw = random.Random(1)
    with open(path, "w") as fh:
        for i in range(count):
            record = {**shipped[i % len(shipped)], "run_id": f"g{i}", "timeline_path": None}
            record["per_iteration"] = [
                {**row, "iter_time_s": row["iter_time_s"] * (1 + draw.uniform(-0.05, 0.05))}
                for row in record.get("per_iteration") or []
            ]
            if isinstance(record.get("gpu_busy_pct"), float):
                record["gpu_busy_pct"] = min(100.0, record["gpu_busy_pct"] * (1 + draw.uniform(-0.1, 0.1)))
            fh.write(json.dumps(record) + "\n")


def main() -> None:
    print(f"# {COMMAND}")
    took = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (5000, 20000):
            folder = Path(tmp) / str(count)
            folder.mkdir()
            write_ci(folder / "runs.jsonl", count)
            env = {**os.environ, "LAB_RESULTS": str(folder), "LAB_PROFILE": "ci"}
            took[count] = min(child(["results"], env)[0] for _ in range(2))
            print(f"{count:>6} records: {took[count]:.2f} s of CPU (best of 2)")
            (folder / "runs.jsonl").unlink()
    print(f"20,000 / 5,000: x{took[20000] / took[5000]:.2f} (linear: at most x5); 5,000 under 4 s: "
          f"{'yes' if took[5000] < 4 else 'NO'}")  # fmt: skip
    print()
    print("kind  records  command                    CPU s   wall s   peak RSS MB")
    commands = {"results": ["results"], "results --format csv": ["results", "--format", "csv"],
                "compare": ["compare"], "compare --reference": ["compare", "--reference", "bench"]}  # fmt: skip
    scale: dict[tuple[str, str, int], tuple[float, float, float]] = {}
    for kind, write in (("ci", write_ci), ("gpu", write_gpu)):
        for count in (20000, 100000):
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp) / "home"  # a lab home whose reference_results holds the file as "bench"
                (home / "reference_results").mkdir(parents=True)
                (home / "configs").symlink_to(REPO / "configs")
                results = Path(tmp) / "results"
                results.mkdir()
                write(results / "runs.jsonl", count)
                os.link(results / "runs.jsonl", home / "reference_results" / "bench.jsonl")
                env = {**os.environ, "LAB_RESULTS": str(results), "LAB_PROFILE": "ci", "LAB_HOME": str(home),
                       "OMP_NUM_THREADS": "1"}  # fmt: skip
                for name, args in commands.items():
                    figures = ["--out", str(Path(tmp) / "figures")] if args[0] == "compare" else []
                    scale[kind, name, count] = cpu, wall, rss = child([*args, *figures], env)
                    print(f"{kind:<5} {count:>7,}  {name:<24} {cpu:>6.1f}  {wall:>7.1f}  {rss:>12,.0f}", flush=True)
    print()
    for kind in ("ci", "gpu"):
        for name in commands:
            small, large = scale[kind, name, 20000], scale[kind, name, 100000]
            print(f"{kind:<4} {name:<24} 100,000 / 20,000 CPU: x{large[0] / small[0]:.2f} (linear: about x5); "
                  f"within {MEMORY_TARGET_MB:,} MB: {'yes' if large[2] <= MEMORY_TARGET_MB else 'NO'}")  # fmt: skip
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"# {machine}, Python {platform.python_version()}; a machine shared with other work: CPU time is steadier "
          "than wall time, both move by 10-20 %")  # fmt: skip


if __name__ == "__main__":
    main()
