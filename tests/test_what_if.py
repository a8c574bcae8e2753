"""The what-if explorer (lab_helpers.present.what_if, notebook 04): choices from the lab's recipes, each widget mapped onto
the planner's spec, the callback run without a browser against real predictions, and the widgets built."""

from __future__ import annotations

import dataclasses

import pytest

from lab_helpers.planning.planner import predict
from lab_helpers.planning.planner.spec import load_recipe
from lab_helpers.present import what_if


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
    assert {"CPU offload (DeepSpeed)", "activation checkpointing", "GPU GiB", "Run"} <= labels
    assert {"optimizer", "FSDP sharding", "ZeRO stage"} <= labels
    options = {child.description: child.options for child in ui.children if hasattr(child, "options")}
    assert options["optimizer"] == ("AdamW", "SGD", "AdamW8bit", "PagedAdamW8bit")
    assert options["FSDP sharding"] == ("full", "grad-op") and options["ZeRO stage"] == (2, 3)


# The explorer's choices as the lab's experiments set them: (experiment, explorer values beyond the model's)
AS_RUNS_SET_THEM = {
    "adamw-8bit": {"optimizer": "AdamW8bit", "strategy": "single"},
    "full-13b-sgd": {"optimizer": "SGD", "strategy": "single"},
    "fsdp-grad-op": {"strategy": "fsdp", "sharding": "grad-op"},
    "fsdp": {"strategy": "fsdp", "sharding": "full"},
    "deepspeed-zero2-offload": {"strategy": "deepspeed", "deepspeed_stage": 2, "offload": True},
    "deepspeed-offload": {"strategy": "deepspeed", "deepspeed_stage": 3, "offload": True},
}


@pytest.mark.parametrize("experiment", sorted(AS_RUNS_SET_THEM))
def test_optimizer_sharding_and_stage_reach_the_planner_as_the_run_sets_them(experiment):
    """The explorer's optimizer, FSDP sharding and DeepSpeed stage give the planner the same settings as the
    experiment that teaches them (its recipe's optimizer, its launch options through predict.planner_inputs)."""
    from pathlib import Path

    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.planner.spec import spec_from_recipe
    from lab_helpers.planning.predict import planner_inputs

    run = resolve(experiment, "ci", check_files=False)
    inputs = planner_inputs(run, None, device="cpu")
    by_run = spec_from_recipe(inputs.pop("recipe"), **inputs)
    train = run.recipe["train"]
    values = {
        **what_if.defaults("ci"),
        "model": Path(run.recipe["checkpoint_dir"]).name,
        "method": run.experiment.method,
        "precision": run.recipe["precision"],
        "micro_batch_size": train["micro_batch_size"],
        "seq_len": train["max_seq_length"],
        "devices": run.world_size,
        **AS_RUNS_SET_THEM[experiment],
    }
    by_explorer = what_if.spec_for(values, "ci")
    fields = ("optimizer", "optimizer_kwargs", "strategy", "devices", "offload_optimizer")
    assert [getattr(by_explorer, f) for f in fields] == [getattr(by_run, f) for f in fields]
    assert by_explorer.fsdp_reshard_after_forward == by_run.fsdp_reshard_after_forward
    assert by_explorer.fsdp_reshard_after_forward == (experiment != "fsdp-grad-op")


def test_bad_choices_are_one_line():
    values = {**what_if.defaults("ci"), "method": "full", "devices": 2, "strategy": "deepspeed"}
    with pytest.raises(ValueError, match="stage 1"):
        what_if.spec_for({**values, "deepspeed_stage": 1}, "ci")
    with pytest.raises(ValueError, match="optimizer 'Lion'"):
        what_if.spec_for({**values, "optimizer": "Lion"}, "ci")
    with pytest.raises(ValueError, match="sharding 'hybrid'"):
        what_if.spec_for({**values, "strategy": "fsdp", "sharding": "hybrid"}, "ci")
    with pytest.raises(ValueError, match="micro batch 0, devices 2: each a whole number >= 1"):
        what_if.spec_for({**values, "micro_batch_size": 0}, "ci")  # was read as 'not given': 'fits' in 0.01 GiB
    with pytest.raises(ValueError, match="unknown profile None: ci or gpu"):  # was a TypeError from a path join
        what_if.host_or_device(None)
    # a misspelt setting was ignored, and the defaults' answer shown as if it were the one asked for
    with pytest.raises(ValueError, match=r"no setting 'micro_batch' \(did you mean 'micro_batch_size'\?\)"):
        what_if.explore(profile="ci", draw=False, micro_batch=8)


@pytest.mark.slow  # eight predictions of the ci 7b stand-in: ~20 s on 2 cores
def test_the_cheapest_change_can_be_the_optimizer_or_the_sharding(ci_assets):
    """Each new choice moves the part it should, so "the cheapest change" can be any of them: the optimizer's
    states (AdamW 8 B/param in fp32, 8-bit ~2, paged 8-bit's moments outside the allocator, SGD none) and the
    sharding (grad-op keeps gathered weights from forward to backward: more than full shard; ZeRO-2 keeps every
    weight on every rank: more than ZeRO-3)."""
    base = {**what_if.defaults("ci"), "model": "ci-llama-m", "method": "full", "precision": "32-true"}
    plans = {name: predict(what_if.spec_for({**base, "optimizer": name}, "ci")) for name in what_if.OPTIMIZERS}
    states = {name: plan.breakdown_gib["optimizer_states"] for name, plan in plans.items()}
    params = plans["AdamW"].breakdown_gib["parameters"]  # fp32: 4 B/param
    assert states["AdamW"] == pytest.approx(2 * params, rel=0.01)
    assert states["AdamW8bit"] == pytest.approx(2 * params * 2.03125 / 8, rel=0.05)
    assert states["PagedAdamW8bit"] < states["AdamW8bit"] / 4 and states["SGD"] == 0
    assert plans["SGD"].peak_alloc_gib < plans["AdamW8bit"].peak_alloc_gib < plans["AdamW"].peak_alloc_gib
    two = {**base, "devices": 2, "micro_batch_size": 2}
    full = predict(what_if.spec_for({**two, "strategy": "fsdp", "sharding": "full"}, "ci"))
    grad_op = predict(what_if.spec_for({**two, "strategy": "fsdp", "sharding": "grad-op"}, "ci"))
    assert grad_op.peak_alloc_gib > full.peak_alloc_gib
    zero2, zero3 = (
        predict(what_if.spec_for({**two, "strategy": "deepspeed", "deepspeed_stage": stage}, "ci")) for stage in (2, 3)
    )
    assert zero2.breakdown_gib["parameters"] == pytest.approx(2 * zero3.breakdown_gib["parameters"], rel=0.01)
    # the answer says what was asked: its title names the optimizer and the sharding
    answer = what_if.explore(profile="ci", **{**two, "strategy": "fsdp", "sharding": "grad-op", "optimizer": "SGD"})
    title = answer.figure.axes[0].get_title()
    assert "SGD" in title and "fsdp (grad-op shard)" in title


@pytest.mark.slow  # the traced time model asked ~6 times and 3 memory plans of TinyLlama: ~30-60 s on 2 cores
def test_host_or_device_gives_the_split_and_what_changes_the_bound():
    """On the ci profile (a CPU: no split of its own) the gpu profile's default recipe, its host and device time per
    micro-batch, and the run changed one way at a time, each answered by the traced model with the same figures."""
    from lab_helpers.planning.planner.calibration import DeviceEfficiency

    launch = 77e-6
    split = what_if.host_or_device("ci", launch_cost_s=launch, device_efficiency=DeviceEfficiency(0.5, 0.56, "given"))
    base = split.base
    assert base.host_ms_per_micro_batch == pytest.approx(base.kernels_per_micro_batch * launch * 1e3)
    assert base.time_bound == ("host" if base.host_ms_per_micro_batch > base.device_ms_per_micro_batch else "device")
    assert base.time_bound == "host"  # TinyLlama's LoRA at micro batch 4: thousands of small kernels
    micro = [v for v in split.variants if v.change.startswith("micro batch")]
    # a bigger micro batch: the same kernels (the same host time), more device time; doubled until the bound turns
    assert [v.plan.micro_batch_size for v in micro] == [8, 16, 32][: len(micro)] and micro
    device = [base.device_ms_per_micro_batch, *(v.plan.device_ms_per_micro_batch for v in micro)]
    assert device == sorted(device) and device[-1] > 3 * device[0]
    assert all(v.plan.host_ms_per_micro_batch == pytest.approx(base.host_ms_per_micro_batch, rel=0.02) for v in micro)
    assert all(v.plan.time_bound == "host" and v.fits for v in micro[:-1])
    assert micro[-1].plan.time_bound == "device" or not micro[-1].fits
    fewer = next(v for v in split.variants if v.change.startswith("LoRA on query and value only"))
    # the gpu recipe's targets, each once
    assert fewer.change.endswith("(the recipe: query, key, value, projection, mlp, head)")
    assert fewer.plan.kernels_per_micro_batch < 0.9 * base.kernels_per_micro_batch  # fewer adapters, fewer launches
    assert fewer.plan.host_ms_per_micro_batch < base.host_ms_per_micro_batch
    other = split.variants[-1]
    assert "GPU" in other.change and other.plan.device_name != base.device_name
    assert other.plan.host_ms_per_micro_batch == base.host_ms_per_micro_batch  # the same host
    if other.plan.time_bound == "host":  # a GPU that is faster or not, the step is the host's
        assert other.plan.step_s == pytest.approx(base.step_s, rel=1e-3) and "the same step" in other.change
    assert split.changed() == [v for v in split.variants if v.plan.time_bound != "host"]
    text = split.text()
    assert "-> host-bound" in text and "what turns it device-bound: " in text
    verdict = next(line for line in text.splitlines() if line.startswith("what turns it device-bound: "))
    assert verdict.endswith(micro[-1].change) == (micro[-1].plan.time_bound == "device")
