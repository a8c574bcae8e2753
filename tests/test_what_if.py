"""The what-if explorer (lab_helpers.what_if, notebook 04): choices from the lab's recipes, each widget mapped onto
the planner's spec, the callback run without a browser against real predictions, and the widgets built."""

from __future__ import annotations

import dataclasses

import pytest

from lab_helpers import what_if
from lab_helpers.planner import predict
from lab_helpers.planner.spec import load_recipe


@pytest.fixture(scope="module")
def ci_assets():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)


def test_models_and_defaults_come_from_the_labs_recipes():
    assert what_if.models("ci") == ["ci-llama-xs", "ci-llama-s", "ci-llama-m", "ci-llama-l"]
    assert what_if.models("gpu") == ["tinyllama-1.1b", "open_llama_3b", "open_llama_7b", "open_llama_13b"]
    start = what_if.defaults("ci")
    recipe = load_recipe(what_if.configs_dir() / "ci" / "ci-llama-xs" / "lora.yaml")
    assert start["micro_batch_size"] == recipe["train"]["micro_batch_size"]
    assert start["seq_len"] == recipe["train"]["max_seq_length"]
    assert start["lora_r"] == recipe["lora_r"] and start["precision"] == recipe["precision"]
    assert start["gpu_memory_gib"] == what_if.CI_PRETEND_GPU_GIB
    with pytest.raises(ValueError, match="unknown profile"):
        what_if.models("tpu")


def test_each_widget_reaches_the_planners_spec(ci_assets):
    values = {
        **what_if.defaults("ci"),
        "model": "ci-llama-s",
        "method": "full",
        "precision": "bf16-true",
        "micro_batch_size": 2,
        "seq_len": 48,
        "devices": 2,
        "strategy": "fsdp",
        "activation_checkpointing": True,
    }
    spec = what_if.spec_for(values, "ci")
    assert (spec.model_config.name, spec.method, spec.precision) == ("ci-llama-s", "full", "bf16-true")
    assert (spec.micro_batch_size, spec.seq_len, spec.devices, spec.strategy) == (2, 48, 2, "fsdp")
    assert spec.activation_checkpointing and spec.device == "cpu"
    lora = what_if.spec_for({**values, "method": "lora", "lora_r": 4, "devices": 1, "strategy": "single"}, "ci")
    assert lora.lora["lora_r"] == 4 and lora.model_config.lora_r == 4 and lora.strategy == "single"
    offload = what_if.spec_for({**values, "offload": True, "activation_checkpointing": False}, "ci")
    assert offload.strategy == "deepspeed-zero3" and offload.offload_optimizer
    assert offload.optimizer == "DeepSpeedCPUAdam"


@pytest.mark.slow  # a few predictions of the tiny model and the time model: ~10-30 s on 2 cores
def test_the_callback_answers_with_real_predictions(ci_assets):
    answer = what_if.explore(profile="ci")
    spec = what_if.spec_for(answer.values, "ci")
    assert answer.plan.gpu_used_gib == predict(spec).gpu_used_gib
    best = answer.largest_micro_batch
    per_device = spec.micro_batch_size * spec.gradient_accumulation_iters
    assert best is not None and spec.micro_batch_size <= best <= per_device
    at = predict(dataclasses.replace(spec, micro_batch_size=best, gradient_accumulation_iters=per_device // best))
    assert at.gpu_used_gib <= 0.95 * answer.gpu_memory_gib
    assert answer.time is not None and answer.time.step_s > 0 and answer.time.device_name == "cpu"
    assert answer.figure is not None and answer.figure.axes[0].patches  # the breakdown's bars were drawn
    text = answer.text()
    assert "largest micro batch that fits" in text and "predicted step" in text
    assert "MFU" not in text.replace("no MFU on a CPU", "")  # 04 printed "MFU 136.6%" for a CPU
    assert answer.figure._repr_png_().startswith(b"\x89PNG")  # shows as an image, whatever the backend


def test_the_widgets_build_without_a_browser_and_predict_nothing_until_run():
    ui = what_if.widgets("ci")
    labels = {child.description for child in ui.children if hasattr(child, "description")}
    assert {"model", "method", "precision", "LoRA rank", "micro batch", "seq length", "GPUs", "strategy"} <= labels
    assert {"CPU offload (ZeRO-3)", "activation checkpointing", "GPU GiB", "Run"} <= labels
