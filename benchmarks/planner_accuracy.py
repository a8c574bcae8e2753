"""Accuracy of lab_helpers.planning.planner against measured peak memory.

Two sources of truth, printed one row per case with measured, predicted and error:

1. Real GPU runs of the lab's experiments (``torch.cuda.max_memory_allocated``), read from run records when a
   results file is given (``--records results/runs.jsonl``); rows say which GPU measured them.
2. Published figures: the single-GPU (1xA10G) rows of litgpt's config-hub benchmark table
   (Lightning-AI/litgpt, config_hub/finetune/README.md, "Peak memory"). litgpt prints that figure as
   ``torch.cuda.max_memory_allocated() / 1e9`` (GB = 10^9 bytes, see litgpt.utils.create_finetuning_performance_report),
   over the whole process (checkpoint load and quantization, validation, example generation), so it is compared with
   the planner's whole-run peak ``whole_run_peak_alloc_gib * 2^30 / 10^9``; the training loop's own peak (what the
   lab records as ``peak_alloc_gib``) is printed beside it. Recipe settings that matter for memory (LoRA rank and
   layers, micro-batch, precision, quantize) are from the recipe files in config_hub/finetune/*/. Every row is
   predicted from its recipe settings with no per-row flags, for the software the table was measured with: litgpt
   0.4.x, which pinned bitsandbytes==0.42.0 (``TABLE_SOFTWARE``). Two things those releases did differently matter
   to QLoRA alone: bitsandbytes < 0.43.2 kept each 4-bit layer's input on the autograd node until the graph died,
   and litgpt < 0.5.0 had no ``StableEmbedding``. The "installed" column predicts the same QLoRA recipe with
   what the lab installs (bitsandbytes >=0.45.2,<0.50, litgpt 0.5.13), as ``plan`` does for a user: information
   only, not in the statistics. Alpaca2k has samples longer than 512 tokens, so the worst-case batch is padded to
   ``max_seq_length`` = 512; the recipes validate and generate an example every ``eval.interval``.

Usage: python benchmarks/planner_accuracy.py [--records RUNS.jsonl] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litgpt import Config  # noqa: E402

from lab_helpers.config.record_schema import GIB
from lab_helpers.planning.planner import TrainingSpec, predict  # noqa: E402

A10G_USABLE_GIB = 22.0  # 24 GB A10G: 22.35 GiB total as reported by CUDA


def lora(r: int, alpha: int = 16, dropout: float = 0.05, all_layers: bool = False, head: bool = False) -> dict:
    return dict(
        lora_r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        lora_query=True,
        lora_key=all_layers,
        lora_value=True,
        lora_projection=all_layers,
        lora_mlp=all_layers,
        lora_head=head,
    )


QV32 = lora(32)  # falcon-7b, llama-2-7b, llama-3(.1)-8b, mistral-7b(-v0.2), stablelm-3b recipes
ALL32 = lora(32, all_layers=True, head=True)  # tiny-llama
ALL8 = lora(8, all_layers=True, head=True)  # phi-2, phi-3
GEMMA2B = lora(8, dropout=0.1, all_layers=True, head=True)
GEMMA_Q16 = lora(16, dropout=0.1, all_layers=True, head=True)  # gemma-7b, gemma-2-9b qlora

# The software behind every row: litgpt's pyproject.toml pinned bitsandbytes==0.42.0 at each commit that added
# rows (5895df10, 2024-04-26, litgpt 0.4.0.dev0, to fd71063c, 2024-07-24, litgpt 0.4.5); what the planner models is
# the same across 0.4.x.
TABLE_SOFTWARE = {"bitsandbytes_version": "0.42.0", "litgpt_version": "0.4.0"}

# (recipe, litgpt model name, method, micro batch, global batch, lora, published peak GB on 1xA10G or "OOM")
PUBLISHED = [
    ("falcon-7b/lora", "falcon-7b", "lora", 1, 8, QV32, 16.69),
    ("falcon-7b/qlora", "falcon-7b", "qlora", 1, 8, QV32, 9.44),
    ("gemma-2b/lora", "gemma-2b", "lora", 2, 6, GEMMA2B, 12.62),
    ("gemma-2b/qlora", "gemma-2b", "qlora", 2, 6, GEMMA2B, 11.58),
    ("gemma-7b/qlora", "gemma-7b", "qlora", 1, 6, GEMMA_Q16, 17.18),
    ("gemma2-9b/qlora", "gemma-2-9b", "qlora", 1, 6, GEMMA_Q16, 20.92),
    ("llama-2-7b/lora", "Llama-2-7b-hf", "lora", 2, 8, QV32, 19.77),
    ("llama-2-7b/qlora", "Llama-2-7b-hf", "qlora", 2, 8, QV32, 13.68),
    ("llama-3-8b/lora", "Meta-Llama-3-8B", "lora", 1, 8, QV32, 19.73),
    ("llama-3-8b/qlora", "Meta-Llama-3-8B", "qlora", 2, 8, QV32, 17.41),
    ("llama-3.1-8b/lora", "Meta-Llama-3.1-8B", "lora", 1, 8, QV32, 19.73),
    ("llama-3.1-8b/qlora", "Meta-Llama-3.1-8B", "qlora", 2, 8, QV32, 17.41),
    ("mistral-7b-v0.2/lora", "Mistral-7B-v0.2", "lora", 2, 8, QV32, 20.66),
    ("mistral-7b-v0.2/qlora", "Mistral-7B-v0.2", "qlora", 2, 8, QV32, 14.29),
    ("mistral-7b/lora", "Mistral-7B-v0.1", "lora", 2, 8, QV32, 20.66),
    ("mistral-7b/qlora", "Mistral-7B-v0.1", "qlora", 2, 8, QV32, 14.29),
    ("phi-2/lora", "phi-2", "lora", 4, 8, ALL8, 13.98),
    ("phi-2/qlora", "phi-2", "qlora", 4, 8, ALL8, 14.27),
    ("phi-3/lora", "Phi-3-mini-4k-instruct", "lora", 4, 8, ALL8, 19.75),
    ("phi-3/qlora", "Phi-3-mini-4k-instruct", "qlora", 4, 8, ALL8, 19.13),
    ("stablelm-base-alpha-3b/lora", "stablelm-base-alpha-3b", "lora", 1, 8, QV32, 8.58),
    ("stablelm-base-alpha-3b/qlora", "stablelm-base-alpha-3b", "qlora", 1, 8, QV32, 5.24),
    ("tiny-llama/full", "tiny-llama-1.1b", "full", 4, 32, {}, 14.10),
    ("tiny-llama/lora", "tiny-llama-1.1b", "lora", 8, 8, ALL32, 13.50),
    ("tiny-llama/qlora", "tiny-llama-1.1b", "qlora", 8, 8, ALL32, 16.24),
    # verdict-only rows: the table reports OOM on one 24 GB A10G
    ("gemma-7b/lora", "gemma-7b", "lora", 1, 6, GEMMA_Q16, "OOM"),
    ("gemma2-9b/lora", "gemma-2-9b", "lora", 1, 6, GEMMA_Q16, "OOM"),
    ("llama-3.1-8b/full", "Meta-Llama-3.1-8B", "full", 4, 64, {}, "OOM"),
]
# Left out of the statistics, with the reason printed: a figure no run of that recipe can produce.
IMPLAUSIBLE = {
    "phi-3/full": (
        "Phi-3-mini-4k-instruct",
        "full",
        4,
        8,
        {},
        17.01,
        "3.8B parameters in bf16 with AdamW need >= 28 GiB for weights, gradients and moments alone",
    ),
}


def spec_for(name: str, method: str, micro: int, global_bs: int, lora_cfg: dict, gpu_gib: float | None):
    """The recipe as ``plan`` reads it, run with the table's software: nothing set that its recipe would not set."""
    return TrainingSpec(
        **TABLE_SOFTWARE,
        model_config=Config.from_name(name),
        method=method,  # type: ignore[arg-type]
        precision="bf16-true",
        micro_batch_size=micro,
        seq_len=512,
        optimizer="AdamW",
        lora=lora_cfg,
        quantize="bnb.nf4" if method == "qlora" else None,
        gradient_accumulation_iters=max(1, global_bs // micro),
        gpu_memory_gib=gpu_gib,
        generate_example=True,  # the config-hub recipes generate an example at every eval.interval
        max_new_tokens=100,
    )


def published_rows(only: str | None) -> tuple[list[float], list[float], int, int]:
    """Rows of the published table; returns (whole-run errors, QLoRA whole-run errors, OOM verdicts right, total)."""

    errors: list[float] = []
    qlora_errors: list[float] = []
    verdicts_ok = verdicts = 0
    print("## Published figures: litgpt config-hub table, single A10G (24 GB), litgpt's GB = 1e9 bytes")
    print("## measured = max_memory_allocated over the whole process; loop = the training loop's predicted peak")
    print(
        f"{'recipe':<30} {'measured GB':>11} {'whole GB':>9} {'error':>8} {'loop GB':>8} {'installed':>9} {'s':>5}"
        "  whole-run peak phase"
    )
    for recipe, name, method, micro, gbs, lcfg, measured in PUBLISHED:
        if only and only not in recipe:
            continue
        t0 = time.perf_counter()
        spec = spec_for(name, method, micro, gbs, lcfg, A10G_USABLE_GIB)
        plan = predict(spec)
        secs = time.perf_counter() - t0
        whole_gb = plan.whole_run_peak_alloc_gib * GIB / 1e9
        loop_gb = plan.peak_alloc_gib * GIB / 1e9
        installed = ""
        if method == "qlora":
            now = predict(dataclasses.replace(spec, bitsandbytes_version=None, litgpt_version=None))
            installed = f"{now.whole_run_peak_alloc_gib * GIB / 1e9:.2f}"
        if measured == "OOM":
            verdicts += 1
            ok = plan.fits is False
            verdicts_ok += ok
            verdict = "will OOM" if plan.fits is False else "fits"
            print(
                f"{recipe:<30} {'OOM':>11} {whole_gb:>9.2f} {'':>8} {loop_gb:>8.2f} {installed:>9} {secs:>5.1f}"
                f"  verdict on 22 GiB: {verdict} ({'agrees' if ok else 'DISAGREES'})"
            )
            continue
        err = (whole_gb - measured) / measured
        errors.append(err)
        if method == "qlora":
            qlora_errors.append(err)
        print(
            f"{recipe:<30} {measured:>11.2f} {whole_gb:>9.2f} {err:>+8.1%} {loop_gb:>8.2f} {installed:>9} {secs:>5.1f}"
            f"  {plan.whole_run_peak_phase}"
        )
    for recipe, (name, method, micro, gbs, lcfg, measured, why) in IMPLAUSIBLE.items():
        if only and only not in recipe:
            continue
        plan = predict(spec_for(name, method, micro, gbs, lcfg, None))
        whole_gb = plan.whole_run_peak_alloc_gib * GIB / 1e9
        print(f"{recipe:<30} {measured:>11.2f} {whole_gb:>9.2f} {'excluded':>8}  ({why})")
    return errors, qlora_errors, verdicts_ok, verdicts


RECORD_PAIRS = (  # (label, measured field, predicted field)
    ("loop", "peak_alloc_gib", "predicted_peak_alloc_gib"),
    ("whole", "peak_alloc_whole_run_gib", "predicted_peak_alloc_whole_run_gib"),
)


def record_rows(path: Path, finished: list[dict]) -> dict[str, list[float]]:
    """Rows from the lab's finished run records (read from ``path``): a measured peak and a stored prediction, with
    the GPU's name. Training-loop and whole-run peaks each, where the record has them (records before the
    whole-run fields existed have the loop's only)."""
    errors: dict[str, list[float]] = {label: [] for label, _, _ in RECORD_PAIRS}
    print(f"\n## Lab runs measured on a GPU ({path})")
    print(f"{'experiment':<24} {'gpu':<28} {'peak':<6} {'measured GiB':>12} {'predicted GiB':>13} {'error':>8}")
    for rec in finished:
        gpu = str(rec.get("device_name") or rec.get("gpu_name") or "?")[:28]
        label = str(rec.get("experiment", "?")) + (
            f" r{rec.get('rank', 0)}" if (rec.get("world_size") or 1) > 1 else ""
        )
        for which, measured_key, predicted_key in RECORD_PAIRS:
            measured, predicted = rec.get(measured_key), rec.get(predicted_key)
            if not measured or not predicted:
                continue
            err = (predicted - measured) / measured
            errors[which].append(err)
            print(f"{label:<24} {gpu:<28} {which:<6} {measured:>12.2f} {predicted:>13.2f} {err:>+8.1%}")
    return errors


def qlora_version_rows(path: Path, finished: list[dict]) -> None:
    """Which bitsandbytes a GPU's QLoRA runs behaved like: each ok QLoRA record's run predicted again with the
    same settings (``predict.planner_inputs`` of the record's experiment, profile and overrides), with the
    bitsandbytes the record names, and with 0.42 (each 4-bit layer's input kept until the graph dies)."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.planner import spec_from_recipe
    from lab_helpers.planning.predict import planner_inputs

    rows = [rec for rec in finished if rec.get("method") == "qlora" and rec.get("peak_alloc_gib")]
    if not rows:
        return
    print(f"\n## QLoRA on a GPU: the measured peak against each bitsandbytes behaviour ({path})")
    print(
        f"{'experiment':<12} {'bitsandbytes':<14} {'measured GiB':>12} {'as recorded':>12} {'error':>7}"
        f" {'as 0.42':>8} {'error':>7}"
    )
    for rec in rows:
        run = resolve(rec["experiment"], rec.get("profile", "gpu"), rec.get("overrides") or {}, check_files=False)
        inputs = planner_inputs(run, None, device="cuda")
        spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
        measured = rec["peak_alloc_gib"]
        version = (rec.get("environment") or {}).get("bitsandbytes")
        recorded = predict(dataclasses.replace(spec, bitsandbytes_version=version)).peak_alloc_gib
        old = predict(dataclasses.replace(spec, bitsandbytes_version="0.42.0")).peak_alloc_gib
        version = str(version or "?")
        print(
            f"{rec['experiment']:<12} {version:<14} {measured:>12.2f} {recorded:>12.2f} "
            f"{(recorded - measured) / measured:>+7.1%} {old:>8.2f} {(old - measured) / measured:>+7.1%}"
        )


H100_GIB = 79.1  # an 80 GB H100 as CUDA reports it; LAB.md's "expected on one 80 GB GPU"


def lab_matrix_rows() -> tuple[int, int]:
    """The lab's own experiments (configs/experiments/*.yaml on the gpu profile) predicted for an 80 GB GPU,
    with LAB.md's expected verdict where it states one (fits / OOM) and its comparisons between experiments."""
    import yaml

    from lab_helpers.planning.planner import plan_recipe

    root = Path(__file__).resolve().parents[1]
    profiles = yaml.safe_load((root / "configs/profiles.yaml").read_text())
    models = profiles["gpu"]["models"]
    print("## The lab's experiment matrix (gpu profile) on one 80 GB GPU per rank: no GPU here, verdicts only")
    print(f"{'experiment':<18} {'pred alloc GiB':>14} {'pred used GiB':>13} {'host GiB':>8}  verdict   LAB.md expects")
    plans: dict[str, object] = {}
    agree = total = 0
    for name in ("single", "multi"):
        experiments = yaml.safe_load((root / f"configs/experiments/{name}.yaml").read_text())
        for exp_id, exp in experiments.items():
            if not isinstance(exp, dict) or "model" not in exp:
                continue
            overrides = dict(exp.get("set") or {})
            overrides.update((exp.get("set_by_profile") or {}).get("gpu") or {})
            recipe = root / "configs/gpu" / models[exp["model"]] / f"{exp['method']}.yaml"
            devices = exp.get("devices", 1)
            devices = 4 if devices == "all" else int(devices) * int(exp.get("num_nodes", 1))
            options = exp.get("options") or {}
            try:
                plan = plan_recipe(
                    recipe,
                    overrides=overrides,
                    devices=devices,
                    strategy=exp.get("strategy", "single"),
                    offload_optimizer=bool(options.get("offload_optimizer")),
                    gpu_memory_gib=H100_GIB,
                    fsdp_wrap_blocks=options.get("wrap", "block") == "block",
                )
            except Exception as err:  # noqa: BLE001 - reported, not fatal
                print(f"{exp_id:<18} no prediction: {err}")
                continue
            plans[exp_id] = plan
            expect = str(exp.get("expect", ""))
            verdict = "fits" if plan.fits else "OOM"
            check = ""
            if expect.lower().startswith(("oom", "fits")):
                total += 1
                ok = expect.lower().startswith("oom") == (plan.fits is False)
                agree += ok
                check = "agrees" if ok else "DISAGREES"
            print(
                f"{exp_id:<18} {plan.peak_alloc_gib:>14.2f} {plan.gpu_used_gib:>13.2f} {plan.host_gib:>8.1f}  "
                f"{verdict:<8}  {expect} {check}"
            )
    relations = [
        # LAB.md says "same memory"; accumulation in fact keeps one gradient copy through the next micro-batch
        ("grad-accum ~ small-batch", "grad-accum", "small-batch", lambda a, b: abs(a - b) / b < 0.05),
        ("bf16-true < small-batch (fp32)", "bf16-true", "small-batch", lambda a, b: a < b),
        ("bf16-mixed > bf16-true", "bf16-mixed", "bf16-true", lambda a, b: a > b),
        ("qlora-7b < lora-7b", "qlora-7b", "lora-7b", lambda a, b: a < b),
        ("lora-7b < full-7b", "lora-7b", "full-7b", lambda a, b: a < b),
        ("fsdp < ddp (per GPU)", "fsdp", "ddp", lambda a, b: a < b),
        ("fsdp-bs8 > fsdp", "fsdp-bs8", "fsdp", lambda a, b: a > b),
    ]
    for label, a, b, rel in relations:
        if a in plans and b in plans:
            total += 1
            ok = rel(plans[a].peak_alloc_gib, plans[b].peak_alloc_gib)
            agree += ok
            why = ""
            if not ok and a == "grad-accum":
                why = (
                    " (the planner says accumulation keeps the gradients, "
                    f"{plans[a].breakdown_gib['gradients']:.2f} GiB, through the next micro-batch)"
                )
            print(
                f"  {label:<32} {plans[a].peak_alloc_gib:7.2f} vs {plans[b].peak_alloc_gib:7.2f} GiB: "
                f"{'agrees' if ok else 'DISAGREES'}{why}"
            )
    return agree, total


def stats(label: str, errors: list[float]) -> None:
    if not errors:
        print(f"{label}: no rows")
        return
    abs_errors = [abs(e) for e in errors]
    print(
        f"{label}: {len(errors)} cases, median |error| {statistics.median(abs_errors):.1%}, "
        f"worst |error| {max(abs_errors):.1%}, mean signed error {statistics.mean(errors):+.1%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=None, help="run records (JSON lines) with measured peaks")
    parser.add_argument("--only", default=None, help="run only recipes containing this text")
    args = parser.parse_args()
    print("# lab_helpers.planning.planner accuracy")
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"# host: {'GPU ' + gpu if gpu else 'no GPU in this session: only published figures are compared'}")
    print()
    errors, qlora_errors, ok, total = published_rows(args.only)
    print()
    stats("published figures (whole run)", errors)
    stats("of which QLoRA", qlora_errors)
    if total:
        print(f"OOM verdicts: {ok}/{total} agree with the table")
    if not args.only:
        print()
        agree, total = lab_matrix_rows()
        print(f"lab matrix: {agree}/{total} stated expectations agree with the predictions")
    if args.records:
        from lab_helpers.record.records import read_records

        finished = [rec for rec in read_records(args.records) if rec.get("status") == "ok"]
        lab = record_rows(args.records, finished)
        print()
        stats("lab GPU runs, training loop", lab["loop"])
        stats("lab GPU runs, whole run", lab["whole"])
        qlora_version_rows(args.records, finished)
    return 0


if __name__ == "__main__":
    sys.exit(main())
