"""Each lever predicted before it runs: ``plan`` takes an experiment id and plans it as it runs;
the time model takes the levers' launches and plan builds off (``planner.levers``), the sampler's micro-batches are
padded as the run pads them, and each part of a prediction names where it comes from.

Fast tests give the hardware figures and a block's launch counts (``GIVEN``: a stand-in for the measurement, so the
arithmetic is exact); the slow one measures a real compiled block on this CPU (``compile_launches``) and plans the
compiled run through the command, on the ci and the gpu profile.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lab_helpers.config.experiments import resolve
from lab_helpers.hardware.cpu_speed import CpuRates
from lab_helpers.planning.planner import spec_from_recipe
from lab_helpers.planning.planner.calibration import DeviceEfficiency, traced_ops
from lab_helpers.planning.planner.levers import CompiledBlock, Levers, block_kernels
from lab_helpers.planning.planner.timing import predict_time
from lab_helpers.present.plan_command import main, padded_pass
from lab_helpers.record.records import read_records
from lab_helpers.training.data_lengths import batch_padding

ROOT = Path(__file__).resolve().parent.parent
LORA = ROOT / "configs" / "ci" / "ci-llama-xs" / "lora.yaml"
H100 = "NVIDIA H100 80GB HBM3"
EFF = DeviceEfficiency(0.5, 0.5, "given", ("H100",))
GIVEN = CompiledBlock(75, 99, 28, 36, "given for the test")  # a block's launches: eager 174, compiled 64
RATES = CpuRates(matmul_flops_per_s=20e9, adam_params_per_s=10e6)
LENGTHS = [37, 90, 130, 64, 200, 310, 45, 128, 511, 77, 250, 199, 61, 400, 12, 140, 260, 96, 333, 180]


def _gpu(levers: Levers, **options):
    spec = spec_from_recipe(LORA, device="cuda")
    return spec, predict_time(spec, gpu_name=H100, launch_cost_s=30e-6, device_efficiency=EFF, levers=levers, **options)


def test_compiled_blocks_take_the_measured_share_of_the_blocks_launches_off_the_host(ci_assets):
    """A block's traced launches (the step at two blocks less the step at one) shrink by the block's compiled /
    eager factor, every block; with CUDA graphs they become two replays a block. The device's work stays."""
    spec, eager = _gpu(Levers())
    _, compiled = _gpu(Levers(compiled=GIVEN))
    _, graphs = _gpu(Levers(compiled=GIVEN, cuda_graphs=True))
    per_block, blocks = block_kernels(spec, spec.seq_len), spec.model_config.n_layer
    assert per_block > 0 and eager.kernels_per_micro_batch == traced_ops(spec, spec.seq_len).kernels_per_micro_batch()
    assert GIVEN.factor == pytest.approx(64 / 174)
    saved = blocks * per_block * (1 - GIVEN.factor)
    assert compiled.kernels_per_micro_batch == pytest.approx(eager.kernels_per_micro_batch - saved)
    assert compiled.launches_saved_per_micro_batch == pytest.approx(saved)
    assert eager.host_ms_per_micro_batch - compiled.host_ms_per_micro_batch == pytest.approx(saved * 30e-6 * 1e3)
    assert compiled.device_ms_per_micro_batch == pytest.approx(eager.device_ms_per_micro_batch)
    assert graphs.kernels_per_micro_batch == pytest.approx(eager.kernels_per_micro_batch - blocks * (per_block - 2))
    assert compiled.compile_factor == pytest.approx(GIVEN.factor) and eager.compile_factor is None
    assert any("compiled blocks" in note for note in compiled.notes)
    assert "a model" in graphs.sources["CUDA graphs"] and "CUDA graphs" not in compiled.sources
    assert compiled.sources["compile factor"].startswith("given for the test; carried over to the NVIDIA H100")
    assert compiled.sources["device efficiencies"].startswith("carried from the H100's profiles")


def _bf16_record(seconds: list[float], lengths: list[int]) -> dict:
    """A one-GPU bf16 record on Hopper: its first micro-batch of each length built an attention plan."""
    return {
        "status": "ok", "experiment": "built", "device_name": H100, "world_size": 1, "warmup_iterations": 1,
        "iterations": len(seconds) - 1, "train_s": sum(seconds[1:]), "seq_lens": lengths,
        "per_iteration": [{"iter": i + 1, "iter_time_s": s} for i, s in enumerate(seconds)],
        "config": {"precision": "bf16-true", "train": {"micro_batch_size": 2, "global_batch_size": 2}},
    }  # fmt: skip


def test_flash_attention_builds_no_plan_per_first_seen_length(ci_assets):
    """bf16 on Hopper: torch's choice (cuDNN) adds a plan build per first-seen length; flash adds none."""
    records = [_bf16_record([0.9, 0.1, 0.3, 0.3, 0.1, 0.1, 0.1, 0.1], [32, 32, 48, 64, 32, 48, 64, 48])] * 2
    spec = dataclasses.replace(spec_from_recipe(LORA, device="cuda"), precision="bf16-true")
    given = {"gpu_name": H100, "launch_cost_s": 1e-6, "device_efficiency": EFF, "records": records}
    lengths = [16, 32, 16, 32]
    cudnn = predict_time(spec, batch_lengths=lengths, levers=Levers(), **given)
    flash = predict_time(spec, batch_lengths=lengths, levers=Levers(attention_backend="flash"), **given)
    assert cudnn.plan_build_ms == pytest.approx(200) and "plan build" in cudnn.sources
    assert flash.plan_build_ms is None and "plan build" not in flash.sources
    assert cudnn.micro_batch_s == pytest.approx(flash.micro_batch_s + 0.2 * 2 / 4)
    assert any("attention backend flash: no cuDNN plan build" in note for note in flash.notes)


def test_padding_to_64_leaves_fewer_lengths_for_more_padded_tokens():
    """The sampler's micro-batches padded as the training process pads them (recipe_defaults.padded_length):
    to a multiple of 64 (never past the longest sample), or all to the longest sample."""
    batches = batch_padding(LENGTHS, micro_batch_size=2, max_seq_length=512)
    limit = max(LENGTHS)
    plain, plain_tokens = padded_pass(batches, None, limit)
    by_64, tokens_64 = padded_pass(batches, 64, limit)
    fixed, tokens_max = padded_pass(batches, "max", limit)
    assert plain == list(batches.batch_lengths) and plain_tokens == batches.tokens_padded
    assert all(n % 64 == 0 or n == limit for n in by_64) and all(p >= n for p, n in zip(by_64, plain, strict=True))
    assert len(set(by_64)) < len(set(plain)) and tokens_64 > plain_tokens
    assert set(fixed) == {limit} and tokens_max == limit * len(LENGTHS) > tokens_64


def test_a_cpu_prediction_counts_its_launches_and_its_overhead_shrinks_with_them(ci_assets):
    """On a CPU one core is host and device: the ci records' fitted overhead per micro-batch is the host's part,
    and compiled blocks shrink it in proportion to the launches they take off."""
    spec = spec_from_recipe(LORA, device="cpu")
    records = read_records(ROOT / "reference_results" / "ci-cpu.jsonl")
    plain = predict_time(spec, records=records, cpu_rates=RATES)
    eager = predict_time(spec, records=records, cpu_rates=RATES, levers=Levers())
    compiled = predict_time(spec, records=records, cpu_rates=RATES, levers=Levers(compiled=GIVEN))
    assert plain.kernels_per_micro_batch is None and eager.step_s == pytest.approx(plain.step_s)
    kernels = traced_ops(spec, spec.seq_len).kernels_per_micro_batch()
    assert eager.kernels_per_micro_batch == kernels and eager.host_ms_per_micro_batch == pytest.approx(
        plain.overhead_s * 1e3
    )
    share = compiled.kernels_per_micro_batch / kernels
    assert share == pytest.approx(1 - compiled.launches_saved_per_micro_batch / kernels) and share < 1
    assert compiled.host_ms_per_micro_batch == pytest.approx(eager.host_ms_per_micro_batch * share)
    assert compiled.device_ms_per_micro_batch == pytest.approx(eager.device_ms_per_micro_batch)
    assert compiled.time_bound is None and "add up" in compiled.split()
    assert compiled.sources["compute rate"].startswith("measured on this machine")
    assert compiled.sources["MFU and host overhead"].startswith("carried from records")


def test_a_name_that_is_neither_a_file_nor_an_experiment_is_one_line(capsys):
    assert main(["lora-1", "--profile", "ci"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a recipe file nor an experiment id (did you mean 'lora-1b'?)" in err
    assert main(["configs/ci/nothing.yaml"]) == 2
    assert "recipe file not found" in capsys.readouterr().err
    assert main(["lora-1b", "--profile", "ci", "--devices", "2"]) == 2  # it is planned as it runs
    assert "--devices belongs to a recipe file" in capsys.readouterr().err
    assert main([str(LORA), "--profile", "ci"]) == 2


def test_an_experiment_is_planned_as_predict_experiment_plans_it(ci_assets, capsys):
    """The experiment's recipe for the profile, its ``set`` and ``--set``: the spec lab.predict_experiment asks."""
    from lab_helpers.planning.predict import predict_experiment

    assert main(["lora-1b", "--profile", "ci", "--json", "--set", "train.micro_batch_size=2"]) == 0
    planned = json.loads(capsys.readouterr().out)
    expected = predict_experiment("lora-1b", profile="ci", overrides={"train.micro_batch_size": 2}, device="cpu")
    assert planned["peak_alloc_gib"] == expected.peak_alloc_gib and planned["micro_batch_size"] == 2
    assert planned["experiment"] == {"id": "lora-1b", "profile": "ci", "options": {}, "batches": None}
    assert planned["precision"] == resolve("lora-1b", "ci", check_files=False).recipe["precision"]


def test_a_notebook_asks_what_the_command_prints(ci_assets):
    """``experiment_time``: the command's time prediction of an experiment, the pass's batches beside it."""
    from lab_helpers.present.plan_command import experiment_time

    plan, why, batches = experiment_time("small-batch", profile="ci", sets=["train.micro_batch_size=2"])
    assert why == "" and plan.micro_batch_size == 2 and plan.kernels_per_micro_batch > 0
    assert batches["micro_batches"] > 0 and batches["distinct_lengths"] >= 1
    assert batches["tokens_padded"] >= batches["tokens"] and batches["pad_multiple"] is None
    assert set(plan.sources) >= {"kernels per micro-batch", "compute rate", "MFU and host overhead"}


@pytest.mark.slow  # compiles one block with inductor on the CPU (~30 s on 2 cores, kept on disk after) and plans
def test_the_compiled_experiment_is_predicted_with_fewer_launches_from_a_measured_factor(ci_assets, capsys):
    """compile against its pair, lora-1b, on both profiles: fewer launches and less host time, the factor measured
    on this machine (CPU inductor), carried to the GPU's prediction, and every source named."""
    from lab_helpers.planning.compile_launches import compiled_block
    from lab_helpers.planning.predict import planner_inputs

    run = resolve("lora-1b", "ci", check_files=False)
    inputs = planner_inputs(run, None, device="cpu")
    spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
    block = compiled_block(spec)
    assert block.source.startswith("measured on this machine (CPU inductor")
    assert block.compiled_forward < block.eager_forward and block.compiled_backward < block.eager_backward
    assert compiled_block(spec) == block  # kept on disk: measured once
    for profile in ("ci", "gpu"):
        plans = {}
        for exp_id in ("lora-1b", "compile"):
            assert main([exp_id, "--profile", profile, "--time", "--json"]) == 0
            plans[exp_id] = json.loads(capsys.readouterr().out)["time"]
        eager, compiled = plans["lora-1b"], plans["compile"]
        assert compiled["kernels_per_micro_batch"] < eager["kernels_per_micro_batch"]
        assert compiled["host_ms_per_micro_batch"] < eager["host_ms_per_micro_batch"]
        assert compiled["compile_factor"] == pytest.approx(block.factor) and eager["compile_factor"] is None
        source = compiled["sources"]["compile factor"]
        assert source.startswith("measured on this machine (CPU inductor")
        assert ("carried over to the NVIDIA" in source) == (profile == "gpu")
        if profile == "gpu":
            assert compiled["sources"]["device efficiencies"].startswith("carried from the H200")
