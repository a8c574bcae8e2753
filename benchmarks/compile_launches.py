"""What compiling a transformer block does to its kernel launches, measured on this CPU, and what the time model
makes of it for the ``compile`` lever: the factor ``plan --time`` applies, measured here fresh (not from
the cache), and the H200's profiled kernels beside the traced ones it is applied to.

    python benchmarks/compile_launches.py > benchmarks/compile_launches.out.txt

Why: the host's time per micro-batch is kernels launched x a per-launch cost, and how many launches compiling
removes is inductor's fusion, which no table says. ``lab_helpers.planning.compile_launches.measure`` counts one real
litgpt Block of the ci profile's model, eager (every aten op, classified as the planner classifies traced ops) and
compiled by inductor on the CPU (a profile of what the compiled graphs call: generated kernels and the aten ops they
call); ``plan`` carries the factor to a GPU's prediction and says so. Section 3 is what can be checked against a
GPU today: the H200's profiles count an eager step's kernels; no compiled run has been profiled there yet.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # each compile from scratch: the first ask's cost
PLANNED = (("lora-1b", "compile: lora-1b with options {compile: blocks}"), ("small-batch", "a full fine-tune's block"))
GPU = "NVIDIA H200"


def spec_of(exp_id: str, profile: str, device: str):
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.planner.spec import spec_from_recipe
    from lab_helpers.planning.predict import planner_inputs

    inputs = planner_inputs(resolve(exp_id, profile, check_files=False), None, device=device)
    return spec_from_recipe(inputs.pop("recipe"), **inputs)


def main() -> int:
    import torch

    from lab_helpers.planning.compile_launches import measure

    print("$ python benchmarks/compile_launches.py")
    print(f"# torch {torch.__version__}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} threads")
    print("\n## 1. One block, eager and compiled (inductor on this CPU), launches per micro-batch")
    measured = {}
    for exp_id, what in PLANNED:
        spec = spec_of(exp_id, "ci", "cpu")
        started = time.perf_counter()
        block = measure(spec)
        seconds = time.perf_counter() - started
        measured[exp_id] = block
        print(f"{exp_id} on ci ({what}): {block.describe()}")
        print(f"  forward {block.eager_forward:.0f} -> {block.compiled_forward:.0f}, backward {block.eager_backward:.0f} "
              f"-> {block.compiled_backward:.0f}; measured in {seconds:.0f} s, compilation from scratch included; {block.source}")  # fmt: skip
    print("\n## 2. What plan --time predicts with it (lora-1b against compile)")
    _predictions(measured["lora-1b"])
    print("\n## 3. The H200's profiles: eager kernels counted there, traced here, and compiled as predicted")
    _h200(measured)
    return 0


def _predictions(block) -> None:
    from lab_helpers.config.paths import reference_dir
    from lab_helpers.hardware.cpu_speed import measure_cpu_rates
    from lab_helpers.planning.planner.levers import Levers
    from lab_helpers.planning.planner.timing import predict_time
    from lab_helpers.record.records import read_records

    records = [r for path in sorted(reference_dir().glob("*.jsonl")) for r in read_records(path)]  # shipped only
    for profile, device, gpu in (("ci", "cpu", None), ("gpu", "cuda", GPU)):
        spec = spec_of("lora-1b", profile, device)
        rates = measure_cpu_rates() if device == "cpu" else None
        for name, levers in (("lora-1b", Levers()), ("compile", Levers(compiled=block))):
            plan = predict_time(spec, gpu_name=gpu, records=records, cpu_rates=rates, levers=levers)
            bound = plan.time_bound or "host + compute (one core)"
            print(f"{profile:<3} {name:<8} {plan.kernels_per_micro_batch:7,.0f} launches per micro-batch, host "
                  f"{plan.host_ms_per_micro_batch:6.1f} ms, device {plan.device_ms_per_micro_batch:5.1f} ms, "
                  f"{bound}, step {plan.step_s:.3f} s on {plan.device_name} at {plan.seq_len} tokens")  # fmt: skip
    print(
        "# fitted to the shipped records only (reference_results/*.jsonl). ci: the host time is the ci records' fitted"
    )
    print(
        "# overhead per micro-batch, in proportion to the launches; gpu: the per-launch cost and efficiencies are fitted"
    )
    print("# to the H200's records (carried here), at the worst-case 512 tokens (the gpu data is not on this machine)")


def _h200(measured: dict) -> None:
    from lab_helpers.planning.planner.calibration import profiled_length, record_spec, traced_ops
    from lab_helpers.planning.planner.levers import Levers, launches_saved
    from lab_helpers.record.records import read_records

    for record in read_records(ROOT / "reference_results" / "h200-141gb.jsonl"):
        summary = record.get("torch_profile_summary")
        if not summary or record.get("status") != "ok":
            continue
        spec = record_spec(record)
        length = profiled_length(record) or spec.seq_len
        ops = traced_ops(spec, length)
        accumulation = spec.gradient_accumulation_iters
        traced = accumulation * ops.kernels_per_micro_batch() + ops.kernels_per_optimizer_step()
        block = measured["small-batch" if spec.method == "full" else "lora-1b"]  # its own kind of block
        saved, _ = launches_saved(spec, length, Levers(compiled=block))
        print(f"{record['experiment']:<12} {spec.method:<4} {spec.precision:<9} at {length} tokens: profiled "
              f"{summary['kernels_per_step']:,.0f} kernels and {summary['aten_ops_per_step']:,.0f} aten ops a step; "
              f"traced {traced:,.0f} ({traced / summary['kernels_per_step']:.0%} of profiled); blocks compiled "
              f"-> {traced - accumulation * saved:,.0f} predicted")  # fmt: skip
    print("# each with the factor of its kind of block from section 1 (LoRA: lora-1b's; full: small-batch's)")


if __name__ == "__main__":
    sys.exit(main())
