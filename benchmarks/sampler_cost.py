"""What the timeline sampler costs the run it measures: host CPU taken per second of run, PSS read every sample
(as before) against PSS once a second with RSS growth between (``ProcessTreeMemory``).

    python benchmarks/sampler_cost.py --ranks 2 --seconds 10 > benchmarks/sampler_cost.out.txt

Why: the sampler runs in the launcher beside the run, on the same cores. Reading a process's PSS makes the kernel
walk its page tables; for a process that has imported torch, Lightning and litgpt that is milliseconds, and the
sampler reads every process of the run's tree every 150 ms. Each "rank" here is a Python that imported them and
sleeps; the sampler's CPU is this process's CPU time while its main thread sleeps.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_helpers.launch.sampler import TimelineSampler  # noqa: E402

RANK = "import sys, torch, lightning, litgpt; print('ready', flush=True); sys.stdin.readline()"


def per_read_ms(proc: psutil.Process, read, count: int) -> float:
    start = time.process_time()
    for _ in range(count):
        read(proc)
    return (time.process_time() - start) / count * 1000


def sampler_cpu_pct(root_pid: int, seconds: float, pss_every_s: float) -> tuple[float, int]:
    """CPU of the sampler thread, in % of one core, and the samples it took."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.process_time()
        with TimelineSampler(Path(folder) / "t.csv", root_pid=root_pid, pss_every_s=pss_every_s) as sampler:
            time.sleep(seconds)
        used = time.process_time() - start
    return 100 * used / seconds, sampler.summary.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes in the run's tree")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling time per mode")
    args = parser.parse_args()
    # the ranks are children of one root, as a run's ranks are of its first process
    spawn = (
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-c', {RANK!r}], stdin=subprocess.PIPE) for _ in range({args.ranks})]\n"
        "sys.stdin.readline()\n"
    )
    root = subprocess.Popen([sys.executable, "-c", spawn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(args.ranks):
            assert root.stdout.readline().strip() == "ready"
        tree = psutil.Process(root.pid).children()
        rank = tree[0]
        print(
            f"# {sys.argv[0]} --ranks {args.ranks} --seconds {args.seconds:g}; python {platform.python_version()}, "
            f"{psutil.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
        )
        print(f"# one rank: RSS {rank.memory_info().rss / 2**20:.0f} MiB, {len(rank.memory_maps())} mapped files")
        print(f"PSS read (memory_full_info): {per_read_ms(rank, lambda p: p.memory_full_info(), 50):6.2f} ms CPU")
        print(f"RSS read (memory_info):      {per_read_ms(rank, lambda p: p.memory_info(), 500):6.2f} ms CPU")
        walk = per_read_ms(psutil.Process(root.pid), lambda p: p.children(recursive=True), 100)
        print(f"tree walk (children):        {walk:6.2f} ms CPU")
        print(f"sampler at 150 ms over {args.ranks} ranks + their root, % of one core taken from the run:")
        for label, every in (("PSS every sample (before)", 0.0), ("PSS once a second (now)", 1.0)):
            pct, samples = sampler_cpu_pct(root.pid, args.seconds, every)
            print(f"  {label:<27} {pct:5.1f} %  ({samples} samples)")
    finally:
        for proc in psutil.Process(root.pid).children(recursive=True):
            proc.kill()
        root.kill()


if __name__ == "__main__":
    main()
