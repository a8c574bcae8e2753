"""The traced time model against litgpt's published LoRA times: each row of litgpt's resource table (1x
A100-SXM4-40GB, finetune/lora.py, minutes per 1,000 iterations at micro batch 1, 2 and 4, with and without
--quantize bnb.nf4; the rows, their source and the settings read from it are in lab_helpers/planning/planner/published.py)
predicted from the row's settings.

    python benchmarks/planner_time_published.py > benchmarks/planner_time_published.out.txt

Each model is litgpt's own ``Config.from_name``, traced on fake tensors (no weights, no network): LoRA r 8 on the
query and value, bf16-true, a global batch of 128, AdamW (weight decay 0.01) or, quantized, PagedAdamW.

Lengths: a micro-batch is padded to its longest sample, drawn at random with replacement, so the time follows the
expected longest of k samples (``timing.mean_padded_length``). Alpaca's lengths in Llama 2 tokens are read off the
histogram litgpt publishes (tutorials/images/prepare_dataset/alpaca.jpg, added in 29de2828, 2023-09-27, labelled
"Min: 42, Max: 1304, Median: 110"): each pixel column's bar height, with x calibrated on the axis ticks and the
three marked lines; kept here as 50 quantiles. StableLM Alpha's tokenizer: the same shape times 96/110, the
median litgpt gave for it (tutorials/oom.md at 2fc9bf16: "min(lengths)=35, max(lengths)=1034,
mean(lengths)=110.52..., median(lengths)=96"). phi-1.5 (CodeGen's BPE; nothing published): StableLM's times
1044/1034, the ratio of the two tokenizers' longest samples in resource-tables.md.

Fitted, and only these: the matmul and bandwidth efficiencies of the roofline, to the device busy time of the
lab's profiled H200 records (``timing.fit_efficiencies``; the table has no profile, so no row fits them); the
per-launch host cost, a property of the node (the table's A100 host, PyTorch 2.1), to the *other* rows
(leave-one-out): the median of what each host-bound row implies (``timing.host_bound_launch_cost``, the rule
``fit_launch_cost`` applies to the lab's records).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from litgpt import Config  # noqa: E402

from lab_helpers.planning.planner import TrainingSpec  # noqa: E402
from lab_helpers.planning.planner.published import (  # noqa: E402
    LITGPT_LORA_A100_GLOBAL_BATCH,
    LITGPT_LORA_A100_GPU,
    LITGPT_LORA_A100_LORA,
    LITGPT_LORA_A100_PRECISION,
    LITGPT_LORA_A100_ROWS,
    LITGPT_LORA_A100_SOURCE,
)

ROOT = Path(__file__).resolve().parent.parent
# The table ran Lit-GPT 0.1.0 and bitsandbytes 0.41.1; the oldest releases the planner models behave the same where
# they differ from today's (no StableEmbedding for QLoRA; MatMul4Bit keeps its input)
SOFTWARE = {"litgpt_version": "0.4.0", "bitsandbytes_version": "0.42.0"}
# Alpaca sample lengths in Llama 2 tokens (prompt, response, EOS): the 1st, 3rd, ..., 99th percentiles of litgpt's
# histogram (see the docstring; the quantiles' median 108.5 against the published 110, their range 52-312 of 42-1304)
LLAMA2_ALPACA_QUANTILES = (
    *(52, 57, 60, 63, 66, 68, 71, 73, 75, 77, 78, 80, 82, 83, 85, 87, 88, 90, 92, 94, 96, 98, 101, 104, 107),
    *(110, 114, 117, 121, 124, 127, 131, 134, 138, 141, 145, 149, 153, 157, 161, 166, 171, 177, 183, 191, 200),
    *(212, 227, 253, 312),
)
TOKENIZER_SCALE = {"Llama": 1.0, "StableLM": 96 / 110, "phi": 96 / 110 * 1044 / 1034}
STABLELM_PUBLISHED_MEAN = 110.52


def sample_lengths(model: str) -> list[int]:
    scale = next(v for k, v in TOKENIZER_SCALE.items() if model.startswith(k))
    return [round(n * scale) for n in LLAMA2_ALPACA_QUANTILES]


def row_spec(row) -> TrainingSpec:
    from lab_helpers.planning.planner.timing import mean_padded_length

    config = Config.from_name(row.litgpt_name)
    seq = mean_padded_length(sample_lengths(row.model), row.micro_batch_size, config.block_size)
    return TrainingSpec(
        **SOFTWARE,
        model_config=config,
        method="qlora" if row.quantize else "lora",
        precision=LITGPT_LORA_A100_PRECISION,
        micro_batch_size=row.micro_batch_size,
        seq_len=seq,
        lora=LITGPT_LORA_A100_LORA,
        quantize=row.quantize,
        gradient_accumulation_iters=LITGPT_LORA_A100_GLOBAL_BATCH // row.micro_batch_size,
        optimizer_kwargs={"weight_decay": 0.01},
    )


def main() -> int:
    from lab_helpers.planning.planner.calibration import (
        DeviceEfficiency,
        fit_efficiencies,
        host_bound_launch_cost,
        traced_ops,
    )
    from lab_helpers.planning.planner.timing import predict_time
    from lab_helpers.planning.planner.tracer import trace
    from lab_helpers.record.records import read_records

    print("$ python benchmarks/planner_time_published.py")
    print(f"# {LITGPT_LORA_A100_SOURCE}: {len(LITGPT_LORA_A100_ROWS)} rows with a time")
    h200 = read_records(ROOT / "reference_results" / "h200-141gb.jsonl")
    eff: DeviceEfficiency = fit_efficiencies(h200)
    print(f"# efficiencies: matmul {eff.matmul:.2f}, bandwidth {eff.bandwidth:.2f}, {eff.source}")
    stablelm = sample_lengths("StableLM")
    print(
        f"# Alpaca lengths: Llama 2 mean {statistics.mean(LLAMA2_ALPACA_QUANTILES):.1f} tokens; StableLM "
        f"{statistics.mean(stablelm):.1f} (published {STABLELM_PUBLISHED_MEAN}); phi-1.5 "
        f"{statistics.mean(sample_lengths('phi')):.1f}"
    )
    specs = [row_spec(row) for row in LITGPT_LORA_A100_ROWS]
    implied = []  # the per-launch cost each row implies alone, where it is host-bound
    for row, spec in zip(LITGPT_LORA_A100_ROWS, specs, strict=True):
        ops = traced_ops(spec, spec.seq_len)
        cost = host_bound_launch_cost(
            row.seconds_per_iteration, ops, spec.gradient_accumulation_iters, LITGPT_LORA_A100_GPU, eff
        )
        implied.append(cost)
    checks = sum(
        trace(spec).trainable_param_numel == row.trainable_parameters
        for row, spec in zip(LITGPT_LORA_A100_ROWS, specs, strict=True)
    )
    print(f"# trainable parameters as published: {checks} of {len(specs)} rows (LoRA r 8 on query and value)")
    print(
        "# ms per iteration (one micro-batch; the optimizer step's share included); seq: expected padded length; "
        "launch: the per-launch cost fitted to the other rows / what this row implies alone"
    )
    print(
        f"{'model':<18} {'quantize':<8} {'mb':>2} {'seq':>4} {'measured':>8} {'predicted':>9} {'error':>6} "
        f"{'host':>6} {'device':>6} {'bound':<6} {'kernels':>7} {'launch us':>12}"
    )
    errors = []
    for i, (row, spec) in enumerate(zip(LITGPT_LORA_A100_ROWS, specs, strict=True)):
        others = [c for j, c in enumerate(implied) if j != i and c is not None]
        cost = statistics.median(others)
        plan = predict_time(
            spec,
            gpu_name=LITGPT_LORA_A100_GPU,
            seq_len=spec.seq_len,
            launch_cost_s=cost,
            launch_cost_source=f"the median of {len(others)} other host-bound rows",
            device_efficiency=eff,
        )
        predicted = plan.step_s / plan.gradient_accumulation_iters
        error = (predicted - row.seconds_per_iteration) / row.seconds_per_iteration * 100
        errors.append((abs(error), error, row))
        alone = f"{implied[i] * 1e6:.1f}" if implied[i] is not None else "-"
        print(
            f"{row.model:<18} {row.quantize or '-':<8} {row.micro_batch_size:>2} {spec.seq_len:>4} "
            f"{row.seconds_per_iteration * 1e3:>8.1f} {predicted * 1e3:>9.1f} {error:>+5.0f}% "
            f"{plan.host_ms_per_micro_batch:>6.1f} {plan.device_ms_per_micro_batch:>6.1f} {plan.time_bound:<6} "
            f"{plan.kernels_per_micro_batch:>7.0f} {cost * 1e6:>5.1f} / {alone:>4}"
        )
    median = statistics.median(e for e, _, _ in errors)
    worst = max(errors, key=lambda e: e[0])
    print(
        f"compared {len(errors)}: median |error| {median:.0f}%, worst {worst[1]:+.0f}% ({worst[2].model}, "
        f"{worst[2].quantize or 'no quantize'}, micro batch {worst[2].micro_batch_size}); "
        f"within 25%: {sum(e <= 25 for e, _, _ in errors)}; target median within 25%: "
        f"{'met' if median <= 25 else 'MISSED'}"
    )
    implied_by_model: dict[str, list[str]] = {}
    per_block: dict[str, str] = {}
    for row, spec, cost in zip(LITGPT_LORA_A100_ROWS, specs, implied, strict=True):
        if cost is not None:
            implied_by_model.setdefault(row.model, []).append(f"{cost * 1e6:.0f}{'(nf4)' if row.quantize else ''}")
        if row.quantize is None and row.micro_batch_size == 1:
            per_block[row.model] = f"{row.seconds_per_iteration * 1e3 / spec.model_config.n_layer:.2f}"
    print("# what each host-bound row implies alone (us per traced kernel), and ms per block at micro batch 1:")
    for model, figures in implied_by_model.items():
        print(f"#   {model:<18} {' '.join(figures):<26} {per_block[model]} ms per block")
    print(NOTES.strip())
    return 0


NOTES = """
# Why one per-launch cost does not fit every model (inspected, not fitted): the Llama 2 rows imply 35-38 us per traced
# kernel, phi-1.5 and StableLM 52-61, while one block took the table's step 4.0-4.8 ms on all four models. Today's
# litgpt, the code the planner traces, costs the host 26-35 us per traced kernel on all four, in proportion to the
# kernels (benchmarks/host_cost_by_model_h200.out.txt, H200 node, torch 2.11, micro batch 1 at 120 tokens: phi-1.5
# 49.1 ms for 1,864 traced kernels, StableLM 42.1 ms for 1,279, Llama 2 7B 115.5 ms for 4,028, 13B 173.9 ms for 5,028).
# The table ran Lit-GPT 8641822: its LoRA QKV layer built its index tensor from a Python list and copied it to the GPU
# in every forward, a stream synchronisation per block, and its loss synchronised again (max(1, non_masked_elems));
# litgpt removed both in 47806045 ("Eliminate cuda syncs", 2024-04-29). Host time that is not kernels, and not in
# proportion to them across architectures, is outside this model.
# Also in the published time and not predicted: the sanity-check validation before training (100 forward passes and
# a 100-token sample) and the first iteration's longest sample; the fitted per-launch cost absorbs them. The nf4 rows:
# the trace's 4-bit stand-in makes each dequantized weight with no kernel of its own, where bitsandbytes launches one
# per matmul, forward and backward, writing the fp16 weight: their launches and device time fall short by that.
"""


if __name__ == "__main__":
    sys.exit(main())
