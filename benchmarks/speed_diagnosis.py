"""Why a single-GPU run's micro-batch takes the time it does: host against device from its profile, and which
micro-batches paid for a sequence length the run had not seen before.

    python benchmarks/speed_diagnosis.py --records reference_results/gpu-chunks/h200-20261126-speed/runs.jsonl \
        [--traces DIR] > benchmarks/speed_diagnosis_h200.out.txt

Why: the H100 and H200 quick runs showed bf16 slower than fp32 and LoRA slower than full fine-tuning per
micro-batch, with the GPU mostly idle. Two causes are read off the records here, none typed:

1. *The host floor.* From a ``--trace-steps`` summary: kernels and aten ops launched per micro-batch, host time
   inside PyTorch ops against device busy time. When the host's share is larger, halving the device's work (bf16)
   or skipping weight gradients (LoRA) cannot shorten the micro-batch.
2. *New sequence lengths.* litgpt pads each micro-batch to its longest sample, so lengths vary. The trace shows the
   first attention call of some micro-batches taking tens of milliseconds on the host (cuDNN building an attention
   plan for a shape it has not seen; bf16 on Hopper only). This script rebuilds each micro-batch's padded length
   from the run's own recipe (the lab's tokenizer, litgpt's data module, quick mode's sampler), checks the rebuilt
   token counts against the record's, and splits the timed micro-batches into first-seen and repeated lengths.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab_helpers.config.iteration_times import timed_iterations  # noqa: E402
from lab_helpers.training.torch_trace import DEVICE_CATEGORIES  # noqa: E402

ATTENTION_OPS = ("aten::_cudnn_attention_forward", "aten::_cudnn_attention_backward",
                 "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
                 "aten::_flash_attention_forward", "aten::_flash_attention_backward")  # fmt: skip
PLAN_BUILD_MS = 5.0
"""An attention call that holds the host this long (normally ~0.1 ms) is building a plan: the cut-off used."""


def padded_lengths(record: dict, workdir: Path) -> tuple[list[int], list[int]]:
    """Each micro-batch's padded length and raw token count, in the order the run drew them (quick mode's sampler
    over the samples as the run's data module had them: ``scripts/rebuild_seq_lens.sample_lengths``)."""
    from lab_helpers.training.quick_mode import QuickOrderSampler
    from scripts.rebuild_seq_lens import sample_lengths

    train = record["config"]["train"]
    lengths = sample_lengths(record, workdir)
    accumulation = train["global_batch_size"] // train["micro_batch_size"]
    batches = list(QuickOrderSampler(lengths, batch_size=train["micro_batch_size"], accumulation=accumulation))
    return [max(lengths[i] for i in b) for b in batches], [sum(lengths[i] for i in b) for b in batches]


def trace_rows(path: Path) -> list[dict]:
    """Per micro-batch of a trace: wall, the longest attention call on the host, device busy (ms)."""
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    starts = sorted(e["ts"] for e in events if e["name"].startswith("enumerate(DataLoader)"))
    rows = []
    for a, b in zip(starts, starts[1:], strict=False):
        inside = [e for e in events if a <= e["ts"] < b]
        attention = [e["dur"] / 1e3 for e in inside if e["name"] in ATTENTION_OPS]
        device_ms = sum(e["dur"] / 1e3 for e in inside if e.get("cat") in DEVICE_CATEGORIES)
        rows.append({"wall_ms": (b - a) / 1e3, "attention_max_ms": max(attention, default=0.0),
                     "attention_calls": len(attention), "device_ms": device_ms})  # fmt: skip
    return rows


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:7.1f}" if values else "    n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True, help="a runs.jsonl of gpu-profile quick runs")
    parser.add_argument("--traces", type=Path, default=None, help="folder of trace-<run_id>.json.gz files")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get("status") == "ok" and r.get("per_iteration") and r.get("world_size") == 1]
    print(f"# {' '.join(sys.argv)}")
    gpu = {r["environment"]["gpu_names"][0] for r in records if r.get("environment")}
    print(f"# {len(records)} single-GPU records on {', '.join(sorted(gpu))}; times are litgpt's iter_time of the timed "
          "micro-batches (warm-up and profiled ones left out)")  # fmt: skip

    print("\n## 1. Host against device, per micro-batch, from the --trace-steps summaries")
    print(f"{'run':<13}{'mb':>4}{'kernels':>9}{'aten ops':>10}{'host ops ms':>13}{'device ms':>11}{'wall ms':>9}"
          f"{'device idle':>13}")  # fmt: skip
    for r in records:
        s = r.get("torch_profile_summary")
        if not s:
            continue
        train = r["config"]["train"]
        per = train["global_batch_size"] // train["micro_batch_size"]  # micro-batches per optimizer step
        print(f"{r['experiment']:<13}{train['micro_batch_size']:>4}{s['kernels_per_step'] / per:>9.0f}"
              f"{s['aten_ops_per_step'] / per:>10.0f}{s['host_op_ms_per_step'] / per:>13.1f}"
              f"{s['device_busy_ms_per_step'] / per:>11.1f}{s['wall_ms_per_step'] / per:>9.1f}"
              f"{s['device_idle_pct']:>12.0f}%")  # fmt: skip

    print("\n## 2. Timed micro-batches of a sequence length the run had not seen before, against repeated lengths")
    print(f"{'run':<13}{'precision':<11}{'mb':>4}{'rebuilt':>9}{'timed':>7}{'new len':>9}{'new ms':>8}"
          f"{'repeat ms':>11}{'all ms':>8}{'record ms':>11}  bound, gpu busy")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="speed-diagnosis-") as tmp:
        for r in records:
            padded, tokens = padded_lengths(r, Path(tmp))
            cumulative = [row.get("tokens") for row in r["per_iteration"]]
            recorded = (
                [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)] if None not in cumulative else []
            )
            exact = recorded == tokens[: len(recorded)]
            seen, new_ms, repeat_ms = set(), [], []
            timed = dict(timed_iterations(r))
            for iteration, length in enumerate(padded[: len(r["per_iteration"])], start=1):
                if iteration in timed:
                    (repeat_ms if length in seen else new_ms).append(timed[iteration])
                seen.add(length)
            print(f"{r['experiment']:<13}{r['config']['precision']:<11}{r['config']['train']['micro_batch_size']:>4}"
                  f"{'exact' if exact else 'DIFFERS':>9}{len(timed):>7}{len(new_ms):>9}{median_ms(new_ms):>8}"
                  f"{median_ms(repeat_ms):>11}{median_ms(list(timed.values())):>8}"
                  f"{r['iter_median_s'] * 1e3:>11.1f}  {r.get('bound')}, {r.get('gpu_busy_pct'):.0f} %")  # fmt: skip

    if args.traces:
        print(
            f"\n## 3. In the traces: micro-batches whose longest attention call held the host over {PLAN_BUILD_MS:g} ms"
        )
        for r in records:
            path = args.traces / f"trace-{r['run_id']}.json.gz"
            if not path.exists():
                continue
            rows = trace_rows(path)
            slow = [x for x in rows if x["attention_max_ms"] > PLAN_BUILD_MS]
            fast = [x for x in rows if x["attention_max_ms"] <= PLAN_BUILD_MS]
            plan_ms = ", ".join(f"{x['attention_max_ms']:.0f}" for x in slow) or "-"
            slow_wall = ", ".join(f"{x['wall_ms']:.0f}" for x in slow) or "-"
            fast_wall = statistics.median([x["wall_ms"] for x in fast]) if fast else float("nan")
            fast_device = statistics.median([x["device_ms"] for x in fast]) if fast else float("nan")
            print(f"{r['experiment']:<13} {len(rows)} micro-batches traced; {len(slow)} with a plan build (longest "
                  f"attention call {plan_ms} ms; their wall {slow_wall} ms); the others' median wall {fast_wall:.0f} ms, "
                  f"device {fast_device:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
