"""The "Beyond the course" experiments run for real on the ci profile (slow: each starts training processes).

Activation checkpointing runs through litgpt's own loop with the lab's per-block wrap and is measured as live
tensor bytes (``peak_tensor_gib``), the quantity the planner predicts on a CPU; 8-bit AdamW needs bitsandbytes'
CUDA kernels and is recorded as skipped on a CPU. ``fsdp-grad-op`` and ``deepspeed-zero2-offload`` are run by
notebook 02 in CI, whose last cell (``check_records``) checks each rank's record, strategy included.
"""

from __future__ import annotations

import pytest
import torch

from lab_helpers.lab import predict_experiment, run_experiment

pytestmark = pytest.mark.slow


def test_act_ckpt_measures_what_the_planner_predicts_and_less_than_without(ci_assets, results):
    [record] = run_experiment("act-ckpt", profile="ci", echo=False)
    assert record["status"] == "ok", record.get("error")
    assert record["peak_tensor_gib"] == pytest.approx(record["predicted_peak_alloc_gib"], rel=0.10)
    without = predict_experiment("full-7b", profile="ci")
    # the saving is the activations: measured below full-7b's prediction by most of its activations
    assert record["peak_tensor_gib"] < without.peak_alloc_gib - without.breakdown_gib["activations"] / 2
    log = (results / record["log_path"]).read_text()
    assert "lab: activation checkpointing on" in log


def test_eight_bit_adamw_is_recorded_as_skipped_on_a_cpu(ci_assets, results):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    [record] = run_experiment("adamw-8bit", profile="ci", echo=False)
    assert record["status"] == "skipped" and "8-bit AdamW" in record["reason"]


def test_fill_gpu_runs_the_micro_batch_the_planner_chose_predicted_before_it_ran(ci_assets, results):
    """On a CPU the budget is this host's available RAM: the tiny ci model fits the whole global batch (16) in one
    micro-batch. The record says so (overrides, config), carries the planner's prediction for that batch, and the
    measured live tensors match it as every ci run does; its pair lora-1b is predicted smaller (activations)."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.predict import fill_gpu_for

    chosen, _ = fill_gpu_for(resolve("fill-gpu", "ci", check_files=False), device="cpu")
    assert chosen == {"train.micro_batch_size": 16}
    [record] = run_experiment("fill-gpu", profile="ci", echo=False)
    assert record["status"] == "ok", record.get("error")
    assert record["overrides"]["train.micro_batch_size"] == 16 == record["config"]["train"]["micro_batch_size"]
    assert record["config"]["train"]["global_batch_size"] == 16  # accumulation 1 keeps the global batch
    assert record["predicted_peak_alloc_gib"] == pytest.approx(
        predict_experiment("fill-gpu", profile="ci", overrides=chosen).peak_alloc_gib
    )
    assert record["peak_tensor_gib"] == pytest.approx(record["predicted_peak_alloc_gib"], rel=0.10)
    assert record["predicted_peak_alloc_gib"] > predict_experiment("lora-1b", profile="ci").peak_alloc_gib
