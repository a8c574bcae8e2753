"""The planner is asked with exactly the settings the run is launched with, and both records have one shape.

Each number a run needs (world size, gradient accumulation, micro-batches, launch options, LoRA settings) is
derived once on the frozen ``ResolvedRun``; the launcher's command and the planner's spec are both built from
it. These tests build both for every experiment and fail where they part.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from lab_helpers import launch
from lab_helpers.config import record_schema
from lab_helpers.config.experiments import load_experiments, resolve
from lab_helpers.config.recipe_defaults import lora_settings, resolve_fsdp_impl
from lab_helpers.launch.runner import ProcessOutcome
from lab_helpers.launch.sampler import TimelineSummary
from lab_helpers.planning.planner.spec import spec_from_recipe
from lab_helpers.planning.predict import planner_inputs
from lab_helpers.record.run_record import base_record, records_from


def _spec(run):
    inputs = planner_inputs(run, None, device="cpu")
    return spec_from_recipe(inputs.pop("recipe"), **inputs)


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _check_same_settings(run, run_dir: Path) -> None:
    spec = _spec(run)
    argv = launch.command(run, run_dir)
    assert spec.devices == run.world_size
    assert spec.gradient_accumulation_iters == run.gradient_accumulation
    assert spec.strategy == run.experiment.strategy
    if run.experiment.distributed:
        assert int(_arg(argv, "--devices")) * int(_arg(argv, "--num-nodes")) == run.world_size
        assert int(_arg(argv, "--accumulate")) == run.gradient_accumulation
        assert _arg(argv, "--strategy") == spec.strategy
        if spec.strategy == "fsdp":
            assert (_arg(argv, "--wrap") == "block") == spec.fsdp_wrap_blocks
            assert (_arg(argv, "--sharding") in (None, "full")) == spec.fsdp_reshard_after_forward
            # the training process resolves --fsdp-impl by its hardware (a CPU here): the planner was told the same
            assert resolve_fsdp_impl(_arg(argv, "--fsdp-impl"), on_cuda=False) == spec.fsdp_impl == "fsdp2"
        else:
            assert spec.fsdp_impl is None
        ds_path = _arg(argv, "--deepspeed-config")
        if ds_path:
            ds = json.loads(Path(ds_path).read_text())
            assert ds["gradient_accumulation_steps"] == run.gradient_accumulation
            assert ("offload_optimizer" in ds["zero_optimization"]) == spec.offload_optimizer
        else:
            assert spec.offload_optimizer is False
    else:  # one device: litgpt's CLI, which has no checkpointing flag of its own; the child applies it
        assert ("--activation-checkpointing" in argv) == spec.activation_checkpointing
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert lora_settings(recipe) == spec.lora  # the LoRA the process trains is the LoRA the planner models


@pytest.mark.parametrize("exp_id", list(load_experiments()))
def test_the_planner_and_the_command_get_the_same_settings(exp_id, ci_assets, tmp_path):
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.planning.decision import blocked

    run = resolve(exp_id, "ci", check_files=False)
    if reason := blocked(run, describe_node()):  # what run_experiment would record as skipped here
        pytest.skip(reason)
    _check_same_settings(run, tmp_path)


def test_defaults_left_out_of_the_yaml_reach_both(ci_assets, tmp_path):
    """A ZeRO-3 experiment with no options and an FSDP one wrapping the whole model: the run's defaults and
    choices reach the planner (it used to be asked without offload while the command offloaded)."""
    run = resolve("deepspeed-offload", "ci", check_files=False)
    bare = dataclasses.replace(run, experiment=dataclasses.replace(run.experiment, options={}))
    assert bare.options["offload_optimizer"] is True and _spec(bare).offload_optimizer is True
    _check_same_settings(bare, tmp_path / "ds")
    fsdp = resolve("fsdp", "ci", check_files=False)
    whole = dataclasses.replace(fsdp, experiment=dataclasses.replace(fsdp.experiment, options={"wrap": "none"}))
    assert _spec(whole).fsdp_wrap_blocks is False
    _check_same_settings(whole, tmp_path / "fsdp")


def test_lora_settings_left_out_of_a_recipe_are_litgpts_for_both(ci_assets, tmp_path):
    run = resolve("lora-1b", "ci", check_files=False)
    recipe = {k: v for k, v in run.recipe.items() if k not in ("lora_r", "lora_mlp")}
    bare = dataclasses.replace(run, recipe=recipe)
    import inspect

    import litgpt.finetune.lora

    setup = inspect.signature(litgpt.finetune.lora.setup).parameters
    assert _spec(bare).lora["lora_r"] == setup["lora_r"].default == lora_settings(recipe)["lora_r"]
    assert _spec(bare).lora["lora_mlp"] is setup["lora_mlp"].default
    _check_same_settings(bare, tmp_path)


def test_a_single_gpu_and_a_distributed_record_have_the_same_fields_and_units(tmp_path):
    """The same report through the two launchers' records: one shape, every field in the schema."""
    report = {"status": "ok", "train_s": 2.0, "warmup_s": 0.5, "warmup_iterations": 1, "tokens": 900,
              "tokens_padded": 1024, "iterations": 2, "samples": 4, "device_name": "cpu (x86_64)"}  # fmt: skip
    shapes = {}
    for exp_id in ("small-batch", "one-gpu"):
        run = resolve(exp_id, "ci", check_files=False)
        ranks = launch.ranks(run)
        outcome = ProcessOutcome(returncode=0, interrupted=False, wall_s=3.0, log_path=tmp_path / "output.log",
                                 timeline=TimelineSummary(path=tmp_path / "timeline.csv"),
                                 reports={0: report}, tail=[])  # fmt: skip
        [record] = records_from(run, base_record(run), outcome, tmp_path, ranks)
        assert record_schema.record_problems(record) == []
        assert record["tokens_per_s"] == 450.0 and record["train_s"] == 2.0
        shapes[exp_id] = {key: record_schema.UNITS[key] for key in record}
    assert shapes["small-batch"] == shapes["one-gpu"]


def test_the_fsdp_implementation_reaches_the_planner_and_is_said_in_its_notes(ci_assets):
    """fsdp1 on CUDA, fsdp2 on a CPU: the planner is told which one runs (modelled alike, which a note says)."""
    run = resolve("fsdp", "ci", check_files=False)
    assert planner_inputs(run, 80.0, device="cuda")["fsdp_impl"] == "fsdp1"
    assert planner_inputs(run, None, device="cpu")["fsdp_impl"] == "fsdp2"
    assert planner_inputs(resolve("ddp", "ci", check_files=False), None, device="cpu")["fsdp_impl"] is None
    from lab_helpers.planning.predict import plan_for

    assert any(note.startswith("fsdp2: ") for note in plan_for(run, None).notes)


_BATCHES = [  # (ranks, micro, global) that check_batch_and_precision lets through, and some it does not divide
    (ranks, micro, global_)
    for ranks in (1, 2, 3, 4, 8)
    for micro in (1, 2, 3, 4, 8)
    for global_ in (8, 12, 16, 32, 36)
    if global_ >= micro * ranks
]


@pytest.mark.parametrize(("ranks", "micro", "global_"), _BATCHES)
def test_gradient_accumulation_is_litgpts(ranks: int, micro: int, global_: int) -> None:
    """The launcher's one restatement of gradient accumulation is litgpt's TrainArgs arithmetic."""
    from litgpt.args import TrainArgs

    from lab_helpers.config.experiments import gradient_accumulation_steps

    recipe = {"train": {"micro_batch_size": micro, "global_batch_size": global_}}
    litgpts = TrainArgs(micro_batch_size=micro, global_batch_size=global_).gradient_accumulation_iters(ranks)
    assert gradient_accumulation_steps(recipe, world_size=ranks) == litgpts
