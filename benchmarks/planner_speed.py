"""Speed and host memory of planner predictions per model size (the lab's four llama-architecture models).

Each case runs in a fresh process so its peak resident memory (ru_maxrss) is its own. Printed apart: the imports
(torch, litgpt and Lightning: paid once per process, by the CLI and by a notebook alike), one prediction (fake
model, traces, bookkeeping), a batch-size search -- the same model at micro-batch 1..10 -- after that first
prediction, and, in a second fresh process, what ``plan --fit --gpu-memory-gib 80`` does (``planner.fit``: the
largest micro batch, the longest sequence, and the alternatives when nothing fits), imports not counted. Wall
seconds and CPU seconds (user+sys: unaffected by other jobs sharing the machine). Targets on a 2-core
CPU: one prediction < 10 s, a ``--fit`` search < 30 s.

Usage: python benchmarks/planner_speed.py [--only SUBSTRING]
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
import dataclasses, json, resource, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
from litgpt import Config
from lab_helpers.planning.planner import TrainingSpec, predict
t1 = time.perf_counter(); c1 = time.process_time()
name, method, mb, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lora = {} if method == "full" else dict(lora_r=32, lora_alpha=16, lora_dropout=0.05, lora_query=True, lora_key=True,
    lora_value=True, lora_projection=True, lora_mlp=True, lora_head=True)
spec = TrainingSpec(Config.from_name(name), method, "bf16-true", mb, 512, lora=lora,
    quantize="bnb.nf4" if method == "qlora" else None, gradient_accumulation_iters=4)
if mode == "fit":
    from lab_helpers.planning.planner import fit
    result = fit(spec, gpu_memory_gib=80.0)
    t2 = time.perf_counter(); c2 = time.process_time()
    print(json.dumps({"fit_wall_s": t2 - t1, "fit_cpu_s": c2 - c1, "predictions": result.predictions,
        "max_micro_batch": result.max_micro_batch_size, "cheapest": result.cheapest.change if result.cheapest else None}))
    sys.exit(0)
plan = predict(spec)
t2 = time.perf_counter(); c2 = time.process_time()
for batch in range(1, 11):
    if batch != mb:
        predict(dataclasses.replace(spec, micro_batch_size=batch))
t3 = time.perf_counter(); c3 = time.process_time()
print(json.dumps({"import_s": t1 - t0, "wall_s": t2 - t1, "cpu_s": c2 - c1, "search_wall_s": t3 - t2,
    "search_cpu_s": c3 - c2, "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    "peak_gib": plan.peak_alloc_gib, "params": plan.total_params}))
"""


def _child(name: str, method: str, mb: int, mode: str) -> dict | str:
    """One case in a fresh process: its figures, or the last line of its error."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, method, str(mb), mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only cases whose model or case label contains this text")
    args = parser.parse_args()
    print(
        "# lab_helpers.planning.planner speed: one process per case; imports, one prediction, then micro-batch 1..10;"
        " then plan --fit on 80 GiB in a fresh process"
    )
    print(f"# host: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; other jobs may share the CPUs (see cpu s)")
    print(
        f"{'model':<6} {'case':<20} {'params':>8} {'import s':>8} {'predict wall s':>14} {'cpu s':>6}"
        f" {'search(9) wall s':>16} {'cpu s':>6} {'RSS GiB':>8} {'pred GiB':>9} {'fit wall s':>10} {'cpu s':>6}"
        f" {'preds':>5}  fit on 80 GiB"
    )
    worst = dict.fromkeys(
        ("wall_s", "cpu_s", "search_wall_s", "search_cpu_s", "rss_gib", "import_s", "fit_wall_s", "fit_cpu_s"), 0.0
    )
    for size, name in MODELS:
        for label, method, mb in CASES:
            if args.only and args.only not in f"{size} {label}":
                continue
            r = _child(name, method, mb, "predict")
            if isinstance(r, str):
                print(f"{size:<6} {label:<20} failed: {r}")
                continue
            f = _child(name, method, mb, "fit")
            if isinstance(f, str):
                print(f"{size:<6} {label:<20} --fit failed: {f}")
                continue
            r.update(f)
            worst = {k: max(v, r[k]) for k, v in worst.items()}
            fit_answer = f"mb {r['max_micro_batch']}" if r["max_micro_batch"] else f"none; {r['cheapest']}"
            print(
                f"{size:<6} {label:<20} {r['params'] / 1e9:>7.2f}B {r['import_s']:>8.1f} {r['wall_s']:>14.1f}"
                f" {r['cpu_s']:>6.1f} {r['search_wall_s']:>16.1f} {r['search_cpu_s']:>6.1f} {r['rss_gib']:>8.2f}"
                f" {r['peak_gib']:>9.2f} {r['fit_wall_s']:>10.1f} {r['fit_cpu_s']:>6.1f} {r['predictions']:>5}"
                f"  {fit_answer}"
            )
    print(
        f"\nworst: one prediction {worst['wall_s']:.1f} s wall ({worst['cpu_s']:.1f} s CPU); a search of 9 more batch"
        f" sizes {worst['search_wall_s']:.1f} s wall ({worst['search_cpu_s']:.1f} s CPU); imports"
        f" {worst['import_s']:.1f} s wall; {worst['rss_gib']:.2f} GiB peak RSS; --fit {worst['fit_wall_s']:.1f} s wall"
        f" ({worst['fit_cpu_s']:.1f} s CPU)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
