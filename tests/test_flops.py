"""FLOPs counted on the real litgpt model, the dense peak table and the MFU."""

from __future__ import annotations

import pytest
import torch
from litgpt import Config

from lab_helpers.hardware.gpu_peaks import dense_peak_flops, find_gpu, known_gpus, precision_unit
from lab_helpers.planning import flops


def _tiny_llama(**overrides) -> Config:
    settings = dict(
        name="tiny-llama",
        block_size=256,
        vocab_size=512,
        padded_vocab_size=512,
        n_layer=2,
        n_head=4,
        n_embd=128,
        n_query_groups=4,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=344,
    )
    settings.update(overrides)
    return Config(**settings)


def _linear_params(config: Config) -> int:
    """Weights that take part in matmuls: every nn.Linear (the embedding is a lookup, not a matmul)."""
    from litgpt import GPT

    with torch.device("meta"):
        model = GPT(config)
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_full_step_is_6_params_tokens_plus_attention():
    config = _tiny_llama()
    batch, seq = 2, 64
    counted = flops.train_flops_per_step(config, method="full", micro_batch_size=batch, seq_len=seq)
    tokens = batch * seq
    # forward 2 FLOPs per weight per token, backward 4 (input and weight gradients): 6 N T, plus attention:
    # QK^T and AV are 2 x 2 T^2 d per sequence and layer forward, twice that backward (causality is not exploited)
    expected = 6 * _linear_params(config) * tokens + 12 * config.n_layer * batch * seq**2 * config.n_embd
    assert counted == pytest.approx(expected, rel=0.01)


def test_lora_skips_weight_gradients():
    config = _tiny_llama(n_embd=512, n_head=8, n_query_groups=8, intermediate_size=1376, n_layer=2)
    full = flops.train_flops_per_step(config, method="full", micro_batch_size=2, seq_len=64)
    every_layer = {"r": 8, "alpha": 16, **dict.fromkeys(flops.LORA_LAYERS, True)}
    lora = flops.train_flops_per_step(config, method="lora", lora=every_layer, micro_batch_size=2, seq_len=64)
    assert lora < full
    assert 0.6 < lora / full < 0.75  # about 2/3: no weight gradients for frozen weights
    # QLoRA does the same model arithmetic as LoRA (the 4-bit weights are dequantised, then multiplied)
    qlora = flops.train_flops_per_step(config, method="qlora", lora=every_layer, micro_batch_size=2, seq_len=64)
    assert qlora == pytest.approx(lora)
    # fewer adapted layers: less LoRA work, still above the frozen forward + input-gradient floor
    fewer = flops.train_flops_per_step(
        config,
        method="lora",
        lora={"r": 8, "mlp": False, "head": False, "projection": False},
        micro_batch_size=2,
        seq_len=64,
    )
    assert fewer < lora


def test_memoised_and_validated():
    config = _tiny_llama()
    flops.train_flops_per_step(config, method="full", micro_batch_size=1, seq_len=32)
    hits = flops._count.cache_info().hits
    flops.train_flops_per_step(config, method="full", micro_batch_size=1, seq_len=32)
    assert flops._count.cache_info().hits == hits + 1  # the second ask is answered from the memo
    with pytest.raises(ValueError, match="method"):
        flops.train_flops_per_step(config, method="prefix", micro_batch_size=1, seq_len=32)
    with pytest.raises(ValueError, match="unknown LoRA"):
        flops.train_flops_per_step(config, method="lora", lora={"rank": 8}, micro_batch_size=1, seq_len=32)
    with pytest.raises(ValueError, match="block_size"):
        flops.train_flops_per_step(config, method="full", micro_batch_size=1, seq_len=4096)


def test_a_micro_batch_counts_its_samples_times_one_sample():
    """Every matmul of a step is linear in the micro batch, so train_flops_per_step counts one sample and multiplies:
    the product equals a count at that micro batch (taken here with the counter itself), full and LoRA."""
    config = _tiny_llama()
    for use_lora, lora_key in ((False, ()), (True, flops._lora_key(None))):
        one = flops._count(flops._config_json(config), use_lora, lora_key, 1, 64)
        assert flops._count(flops._config_json(config), use_lora, lora_key, 3, 64) == 3 * one
        method = "lora" if use_lora else "full"
        assert flops.train_flops_per_step(config, method=method, micro_batch_size=3, seq_len=64) == 3 * one


@pytest.mark.slow
def test_13b_counts_on_meta():
    """Counted on the meta device (no 26 GB of weights); its speed is a benchmark's business, not a test's."""
    config = Config.from_name("open_llama_13b")
    lora = flops.train_flops_per_step(config, method="lora", micro_batch_size=4, seq_len=512)
    assert 1e14 < lora < 2e14


def test_peak_table_resolves_real_device_names():
    assert dense_peak_flops("NVIDIA H100 80GB HBM3", "bf16-true") == pytest.approx(989.4e12)
    assert dense_peak_flops("NVIDIA H100 PCIe", "bf16-mixed") == pytest.approx(756.5e12)
    assert dense_peak_flops("NVIDIA A100-SXM4-80GB", "bf16-true") == pytest.approx(312e12)
    assert dense_peak_flops("NVIDIA A100-SXM4-80GB", "32-true") == pytest.approx(156e12)  # TF32
    assert dense_peak_flops("NVIDIA A100 80GB PCIe", "16-mixed") == pytest.approx(312e12)
    assert dense_peak_flops("NVIDIA H200", "bf16-true") == pytest.approx(989.4e12)
    assert dense_peak_flops("Tesla V100-SXM2-16GB", "16-mixed") == pytest.approx(125e12)
    assert dense_peak_flops("Tesla V100-SXM2-16GB", "32-true") == pytest.approx(15.7e12)  # no TF32 on Volta
    assert dense_peak_flops("Tesla V100-SXM2-16GB", "bf16-true") is None  # no native bf16
    assert find_gpu("NVIDIA A10").model == "A10" and find_gpu("NVIDIA L4").model == "L4"
    assert find_gpu("NVIDIA L40S").model == "L40S" and find_gpu("NVIDIA GeForce RTX 4090").model == "RTX 4090"
    assert "H100 SXM" in known_gpus()


def test_peak_table_knows_the_48_gb_gpus_students_rent():
    assert dense_peak_flops("NVIDIA A40", "bf16-true") == pytest.approx(149.7e12)
    assert dense_peak_flops("NVIDIA RTX A6000", "bf16-true") == pytest.approx(154.8e12)
    assert dense_peak_flops("NVIDIA RTX A6000", "32-true") == pytest.approx(77.4e12)  # TF32
    assert find_gpu("NVIDIA RTX 6000 Ada Generation") is None  # another chip: not the A6000's row


@pytest.mark.parametrize(
    "name", ["NVIDIA A10G", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA L40", "Tesla T4", "NVIDIA H100", "", None]
)
def test_unknown_gpus_are_none_never_a_guess(name):
    assert dense_peak_flops(name, "bf16-true") is None


def test_precision_units():
    assert precision_unit("bf16-mixed") == "bf16" and precision_unit("16-true") == "fp16"
    assert precision_unit("32-true") == "fp32_matmul"
    assert precision_unit("transformer-engine") is None and precision_unit("64-true") is None


def test_mfu():
    value = flops.mfu(
        flops_per_step=1e15, steps=100, train_s=1000.0, gpu_name="NVIDIA A100-SXM4-80GB", precision="bf16-true"
    )
    assert value == pytest.approx(1e15 * 100 / 1000 / 312e12)
    assert flops.mfu(flops_per_step=1e15, steps=10, train_s=5.0, gpu_name=None, precision="32-true") is None  # CPU
    assert flops.mfu(flops_per_step=1e15, steps=10, train_s=5.0, gpu_name="NVIDIA A10G", precision="bf16-true") is None
    for bad in ({"train_s": -1.0}, {"train_s": 0.0}, {"steps": 0}, {"steps": 1.5}, {"flops_per_step": float("nan")}):
        kwargs = {"flops_per_step": 1e12, "steps": 1, "train_s": 1.0, "gpu_name": "NVIDIA L4", "precision": "bf16-true"}
        with pytest.raises(ValueError):
            flops.mfu(**{**kwargs, **bad})
    with pytest.raises(TypeError):
        flops.mfu(1e12, 1, 1.0, "NVIDIA L4", "bf16-true")  # keyword-only


def test_lora_left_out_counts_litgpts_defaults():
    """A LoRA setting left out is counted as litgpt trains it (the planner's and the run's defaults), not the
    lab's r32 on all layers: the LoRA defaults are defined once (recipe_defaults.lora_defaults)."""
    import inspect

    import litgpt.finetune.lora

    setup = inspect.signature(litgpt.finetune.lora.setup).parameters
    litgpts = {layer: setup[f"lora_{layer}"].default for layer in flops.LORA_LAYERS}
    config = _tiny_llama()
    bare = flops.train_flops_per_step(config, method="lora", micro_batch_size=1, seq_len=32)
    explicit = flops.train_flops_per_step(
        config, method="lora", lora={"r": setup["lora_r"].default, **litgpts}, micro_batch_size=1, seq_len=32
    )
    every_layer = flops.train_flops_per_step(
        config, method="lora", lora=dict.fromkeys(flops.LORA_LAYERS, True), micro_batch_size=1, seq_len=32
    )
    assert bare == explicit
    assert bare < every_layer
