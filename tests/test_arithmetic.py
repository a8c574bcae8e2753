"""The model-state arithmetic the notebooks print (lab_helpers.planning.arithmetic): one source for every figure."""

from __future__ import annotations

import pytest
from node_fixtures import node

from lab_helpers.planning import arithmetic
from lab_helpers.planning.arithmetic import GIB, model_states, trainable_bytes


def test_bytes_per_param_for_each_precision_and_optimizer():
    assert trainable_bytes("32-true").formula() == "4 + 4 + 8 = 16 B/param"
    assert trainable_bytes("bf16-true").total == 8
    mixed = trainable_bytes("bf16-mixed")
    assert (mixed.total, mixed.transient) == (16, 2)  # fp32 states; bf16 weight copies while a step runs
    assert trainable_bytes("16-mixed") == mixed  # V100's route costs the same memory
    assert trainable_bytes("bf16-true", "SGD").total == 4
    assert trainable_bytes("bf16-true", "SGD", {"momentum": 0.9}).total == 6
    assert trainable_bytes("bf16-true", "AdamW", paged=True).total == 12  # bnb paged AdamW: 32-bit states
    with pytest.raises(ValueError, match="precision"):
        trainable_bytes("fp8")


def test_one_figure_for_the_7b_in_01_and_02():
    """01's full-7b and 02's one-gpu are the same model states (they read 50 vs 52 GiB when typed by hand)."""
    full_7b, one_gpu = model_states("full-7b"), model_states("one-gpu")
    assert full_7b.gib == one_gpu.gib
    assert full_7b.gib == pytest.approx(full_7b.counts.total * 8 / GIB)
    assert 6.7e9 < full_7b.counts.total < 6.8e9  # open_llama_7b, counted on the meta device
    assert f"{full_7b.gib:.1f} GiB" in full_7b.markdown()


def test_lora_and_qlora_count_adapters_and_nf4_storage():
    lora, qlora = model_states("lora-7b"), model_states("qlora-7b")
    assert lora.counts.trainable == qlora.counts.trainable
    assert 0.005 < lora.counts.trainable / lora.counts.total < 0.02  # r=32 on every linear layer: about 1 %
    assert lora.frozen_per_param == 2
    assert 0.5 < qlora.frozen_per_param < 0.6  # NF4 packed 0.5 B + absmax, embeddings in bf16
    assert qlora.gib < lora.gib / 2


def test_deepspeed_offload_host_ram_is_16_bytes_per_param():
    counts = model_states("deepspeed-offload").counts
    assert arithmetic.offload_host_gib("deepspeed-offload") == pytest.approx(counts.trainable * 16 / GIB)


def test_bf16_over_tf32_is_about_2x_from_the_peak_table():
    text = arithmetic.bf16_over_fp32_text({"gpus": [{"name": "NVIDIA A100-SXM4-80GB"}]})
    assert text == "A100: bf16 312 vs TF32 156 dense TFLOP/s = 2.0x"
    assert "H100" in arithmetic.bf16_over_fp32_text(None)  # no GPU here: the reference GPUs


def test_a_v100_gets_the_arithmetic_and_peaks_of_the_precision_that_runs_there():
    """On a V100 node_plan runs LoRA in 16-mixed: the frozen base is fp32 (4 B/param, not bf16's 2), autocast
    copies it for the matmuls, and the speed ratio is fp16 against plain FP32 (no TF32 before Ampere)."""
    from lab_helpers import node_plan

    step = node_plan.decide("lora-1b", node("V100-32GB"), profile="gpu", predict=lambda e, o: _fits())
    route = model_states("lora-1b", overrides=step.overrides)
    assert step.overrides["precision"] == "16-mixed" and route.frozen_per_param == 4
    assert route.transient_gib == pytest.approx(route.counts.total * 2 / GIB)  # the frozen base copied too
    assert "× 4.00 B" in route.markdown() and model_states("lora-1b").frozen_per_param == 2
    text = arithmetic.bf16_over_fp32_text(node("V100-32GB"))
    assert text.startswith("V100 SXM2: no bf16") and "16-mixed" in text and "125 vs FP32 15.7" in text


def _fits():
    from types import SimpleNamespace

    return SimpleNamespace(gpu_used_gib=1.0, peak_alloc_gib=1.0)


def test_qlora_says_its_paged_optimizer_states_live_outside_pytorchs_allocator():
    text = model_states("qlora-7b").markdown()
    assert "CUDA managed (paged)" in text and "`max_memory_allocated` never sees them" in text
    assert "outside PyTorch's allocator" not in model_states("lora-7b").markdown()


@pytest.mark.slow
def test_parameter_counts_agree_with_the_planners_trace(ci_assets):
    """The meta-device count and the planner's traced model are the same model (ci stand-in: a fast trace)."""
    from lab_helpers.lab import predict_experiment

    for exp_id in ("baseline", "lora-1b"):
        plan = predict_experiment(exp_id, profile="ci")
        counts = model_states(exp_id, profile="ci").counts
        assert (counts.total, counts.trainable) == (plan.total_params, plan.trainable_params), exp_id
