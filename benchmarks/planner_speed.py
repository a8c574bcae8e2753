"""Speed and host memory of one planner prediction per model size (the lab's four llama-architecture models).

Each prediction runs in a fresh process so its peak resident memory (ru_maxrss) is its own: imports, fake
model, trace and bookkeeping included. Prints wall seconds, CPU seconds (user+sys, unaffected by other jobs on
a shared machine) and peak RSS. Targets: <= 30 s per prediction on a 2-core CPU, <= 2 GiB host memory.

Usage: python benchmarks/planner_speed.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = [
    ("1.1B", "TinyLlama-1.1B-intermediate-step-1431k-3T"),
    ("3B", "open_llama_3b"),
    ("7B", "open_llama_7b"),
    ("13B", "open_llama_13b"),
]
CASES = [  # (label, method, micro batch, lora) - the lab's heaviest single-GPU settings per method
    ("full bf16-true mb4", "full", 4),
    ("lora r32 all mb4", "lora", 4),
    ("qlora nf4 mb4", "qlora", 4),
]

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
from litgpt import Config
from lab_helpers.planner import TrainingSpec, predict
name, method, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
lora = {} if method == "full" else dict(lora_r=32, lora_alpha=16, lora_dropout=0.05, lora_query=True, lora_key=True,
    lora_value=True, lora_projection=True, lora_mlp=True, lora_head=True)
spec = TrainingSpec(Config.from_name(name), method, "bf16-true", mb, 512, lora=lora,
    quantize="bnb.nf4" if method == "qlora" else None, gradient_accumulation_iters=4)
plan = predict(spec)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
    "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak_gib": plan.peak_alloc_gib,
    "params": plan.total_params}))
"""


def main() -> int:
    print("# lab_helpers.planner speed: one prediction per process (imports included)")
    print(f"# host: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; other jobs may share the CPUs (see cpu s)")
    print(f"{'model':<6} {'case':<20} {'params':>8} {'wall s':>7} {'cpu s':>6} {'RSS GiB':>8} {'pred GiB':>9}")
    worst_wall = worst_cpu = worst_rss = 0.0
    for size, name in MODELS:
        for label, method, mb in CASES:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, name, method, str(mb)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if out.returncode != 0:
                print(f"{size:<6} {label:<20} failed: {out.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            worst_wall, worst_cpu, worst_rss = (
                max(worst_wall, r["wall_s"]),
                max(worst_cpu, r["cpu_s"]),
                max(worst_rss, r["rss_gib"]),
            )
            print(
                f"{size:<6} {label:<20} {r['params'] / 1e9:>7.2f}B {r['wall_s']:>7.1f} {r['cpu_s']:>6.1f}"
                f" {r['rss_gib']:>8.2f} {r['peak_gib']:>9.2f}"
            )
    print(f"\nworst: {worst_wall:.1f} s wall, {worst_cpu:.1f} s CPU, {worst_rss:.2f} GiB peak RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
