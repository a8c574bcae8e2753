"""The multi-GPU section's configuration, without starting any training process (fast)."""

from __future__ import annotations

import importlib
import json
import signal
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lab_helpers.config.experiments import load_experiments, resolve
from lab_helpers.training.distributed import build_command, deepspeed_config
from lab_helpers.training.distributed.command import DEEPSPEED_FILENAME, RECIPE_FILENAME
from lab_helpers.training.distributed.deepspeed_config import (
    CPU_ADAM_CLASS,
    cpu_adam_kwargs,
    gradient_accumulation_steps,
    optimizer_class_path,
)
from lab_helpers.training.distributed.nodes import node_env, torchrun_command
from lab_helpers.training.distributed.peers import describe_exit
from lab_helpers.training.distributed.strategies import make_strategy, resolve_fsdp_impl

MULTI = (
    "one-gpu", "ddp", "ddp-course", "fsdp", "fsdp-course", "fsdp-bs8", "fsdp-grad-op", "deepspeed-offload",
    "deepspeed-zero2-offload", "multi-node",
)  # fmt: skip


def _recipe(precision: str = "bf16-true", micro: int = 4, global_: int = 64) -> dict:
    return {
        "precision": precision,
        "train": {"micro_batch_size": micro, "global_batch_size": global_, "max_steps": 3},
        "optimizer": {
            "class_path": "torch.optim.AdamW",
            "init_args": {"lr": 2e-4, "betas": [0.9, 0.95], "weight_decay": 0.0},
        },
    }


# ------------------------------------------------------------------------------------------- DeepSpeed config


def test_deepspeed_config_is_zero3_with_optimizer_offloaded_to_pinned_cpu_memory():
    config = deepspeed_config(_recipe(), world_size=4)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in zero  # only the optimizer moves to the host
    assert config["bf16"] == {"enabled": True}
    assert config["fp16"] == {"enabled": False}
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 4  # 64 / (4 x 4): "micro 4, accumulate 4" on 4 GPUs
    json.dumps(config)  # written as the run's deepspeed.json


def test_deepspeed_config_follows_precision_and_world_size():
    config = deepspeed_config(_recipe(precision="32-true", micro=1, global_=4), world_size=2, pin_memory=False)
    assert config["bf16"] == {"enabled": False}
    assert config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["offload_optimizer"]["pin_memory"] is False
    assert (
        "offload_optimizer"
        not in deepspeed_config(_recipe(), world_size=2, offload_optimizer=False)["zero_optimization"]
    )


def test_offloaded_optimizer_is_deepspeed_cpu_adam_with_the_recipes_hyperparameters():
    recipe = _recipe()
    assert (
        optimizer_class_path(recipe, strategy="deepspeed-zero3", offload_optimizer=True, on_cuda=True) == CPU_ADAM_CLASS
    )
    module, _, name = CPU_ADAM_CLASS.rpartition(".")  # the path names DeepSpeed's CPU Adam, an optimizer
    cpu_adam = getattr(importlib.import_module(module), name)
    assert issubclass(cpu_adam, torch.optim.Optimizer) and cpu_adam.__name__ == "DeepSpeedCPUAdam"
    assert optimizer_class_path(recipe, strategy="ddp", offload_optimizer=False, on_cuda=True) == "torch.optim.AdamW"
    sgd = optimizer_class_path({"optimizer": "SGD"}, strategy="fsdp", offload_optimizer=False, on_cuda=True)
    assert sgd == "torch.optim.SGD"
    # without CUDA the recipe's torch optimizer steps offloaded states (no 3-5 minute g++ build of cpu_adam)
    assert optimizer_class_path(recipe, strategy="deepspeed-zero3", offload_optimizer=True, on_cuda=False) == (
        "torch.optim.AdamW"
    )
    assert cpu_adam_kwargs(recipe) == {"lr": 2e-4, "adamw_mode": True, "betas": (0.9, 0.95), "weight_decay": 0.0}


def test_gradient_accumulation_matches_litgpt():
    from litgpt.args import TrainArgs

    for micro, global_, devices, nodes in [(4, 64, 4, 1), (2, 4, 2, 1), (4, 8, 1, 2), (1, 4, 2, 1)]:
        ours = gradient_accumulation_steps(_recipe(micro=micro, global_=global_), world_size=devices * nodes)
        theirs = TrainArgs(micro_batch_size=micro, global_batch_size=global_).gradient_accumulation_iters(
            devices, nodes
        )
        assert ours == theirs


def test_gradient_accumulation_is_accumulate_else_the_recipes_and_a_deepspeed_config_must_agree():
    """One rule (finetune.gradient_accumulation): --accumulate when given, else the recipe's; a DeepSpeed config's
    gradient_accumulation_steps must be the same number, else a one-line error names both."""
    from lab_helpers.config.config_error import LabConfigError
    from lab_helpers.training.distributed.finetune import gradient_accumulation

    recipe = _recipe(micro=2, global_=16)
    assert gradient_accumulation(3, recipe, world_size=2, deepspeed_config=None) == 3  # the lab's value
    assert gradient_accumulation(None, recipe, world_size=2, deepspeed_config=None) == 4  # by hand: 16 / (2 x 2)
    ds = deepspeed_config(recipe, world_size=2)
    assert ds["gradient_accumulation_steps"] == 4
    assert gradient_accumulation(4, recipe, world_size=2, deepspeed_config=ds) == 4  # agreeing
    assert gradient_accumulation(None, recipe, world_size=2, deepspeed_config=ds) == 4
    assert gradient_accumulation(3, recipe, world_size=2, deepspeed_config={"zero_optimization": {}}) == 3  # silent
    with pytest.raises(LabConfigError, match=r"gradient_accumulation_steps is 4 but --accumulate gives 3") as err:
        gradient_accumulation(3, recipe, world_size=2, deepspeed_config=ds)
    assert "\n" not in str(err.value)
    with pytest.raises(LabConfigError, match=r"is 4 but the recipe's batch sizes on 4 rank\(s\) gives 2"):
        gradient_accumulation(None, recipe, world_size=4, deepspeed_config=ds)


@pytest.mark.parametrize("profile", ["ci", "gpu"])
def test_the_labs_deepspeed_commands_carry_one_accumulation(profile, tmp_path):
    """build_command writes --accumulate and the DeepSpeed config's value from the same ResolvedRun: they agree."""
    from lab_helpers.training.distributed import train
    from lab_helpers.training.distributed.finetune import gradient_accumulation, world_size_of

    for exp_id in ("deepspeed-offload", "deepspeed-zero2-offload"):
        run = resolve(exp_id, profile, check_files=False)
        argv = build_command(run, tmp_path / exp_id)
        args = train.parse_args(argv[argv.index("lab_helpers.training.distributed.train") + 1 :])
        ds = json.loads(args.deepspeed_config.read_text())
        recipe = yaml.safe_load(args.recipe.read_text())
        steps = gradient_accumulation(args.accumulate, recipe, world_size=world_size_of(args), deepspeed_config=ds)
        assert steps == run.gradient_accumulation == ds["gradient_accumulation_steps"]


# ------------------------------------------------------------------------------------------- the experiments


@pytest.mark.parametrize("profile", ["ci", "gpu"])
def test_every_multi_gpu_experiment_resolves(profile):
    experiments = load_experiments("multi")
    assert tuple(experiments) == MULTI
    for exp_id, experiment in experiments.items():
        assert experiment.launcher == "lightning-strategy" and experiment.distributed
        run = resolve(exp_id, profile, check_files=False)
        assert run.recipe["precision"] == ("bf16-true" if profile == "gpu" else "32-true")
        assert run.total_iterations >= 1


def test_ci_runs_are_short():
    for exp_id in MULTI:
        run = resolve(exp_id, "ci", check_files=False)
        assert run.recipe["train"]["max_steps"] <= 3
        assert run.total_iterations <= 8


def test_matrix_matches_lab_md():
    e = load_experiments("multi")
    assert (e["one-gpu"].strategy, e["one-gpu"].devices) == ("single", 1)
    assert (e["ddp"].strategy, e["ddp"].devices) == ("ddp", "all")
    assert e["fsdp"].strategy == e["fsdp-bs8"].strategy == "fsdp"
    gpu = {k: resolve(k, "gpu", check_files=False).recipe["train"] for k in MULTI}
    assert [gpu[k]["micro_batch_size"] for k in MULTI] == [4, 4, 4, 4, 4, 8, 4, 4, 4, 4]
    # the course's own settings beside the lab's: DDP without bucket views, FSDP as one unit
    assert e["ddp-course"].options["ddp_bucket_view"] is False and e["fsdp-course"].options["wrap"] == "none"
    assert e["fsdp-grad-op"].options["sharding"] == "grad-op" and e["deepspeed-zero2-offload"].model == "7b"
    assert e["deepspeed-zero2-offload"].strategy == "deepspeed-zero2"
    assert e["deepspeed-offload"].model == "13b" and e["deepspeed-offload"].options["offload_optimizer"] is True
    assert e["multi-node"].num_nodes == 2


# ------------------------------------------------------------------------------------------- the command


def test_build_command_writes_the_recipe_and_returns_a_module_launch(tmp_path):
    run = resolve("fsdp", "ci", check_files=False)
    argv = build_command(run, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "lab_helpers.training.distributed.train"]
    assert argv[argv.index("--strategy") + 1] == "fsdp"
    assert argv[argv.index("--devices") + 1] == "2"
    assert argv[argv.index("--wrap") + 1] == "block"
    recipe = yaml.safe_load((tmp_path / RECIPE_FILENAME).read_text())
    assert recipe["train"] == run.recipe["train"]
    assert Path(recipe["out_dir"]).is_relative_to(tmp_path)
    assert not (tmp_path / DEEPSPEED_FILENAME).exists()


def test_build_command_for_deepspeed_writes_the_generated_config(tmp_path):
    run = resolve("deepspeed-offload", "ci", check_files=False)
    argv = build_command(run, tmp_path)
    written = json.loads(Path(argv[argv.index("--deepspeed-config") + 1]).read_text())
    assert written == deepspeed_config(run.recipe, world_size=2)
    assert written["gradient_accumulation_steps"] * 2 * written["train_micro_batch_size_per_gpu"] == 4


def test_build_command_for_several_nodes_goes_through_the_loopback_launcher(tmp_path):
    run = resolve("multi-node", "ci", check_files=False)
    argv = build_command(run, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "lab_helpers.training.distributed.nodes"]
    assert argv[argv.index("--nodes") + 1] == "2"
    train = argv[argv.index("--") + 1 :]
    assert train[train.index("--num-nodes") + 1] == "2"
    assert train[train.index("--devices") + 1] == "1"
    assert run.total_iterations == 2  # global 4 = micro 2 x 2 ranks: no accumulation, 2 steps


def test_torchrun_command_and_node_environment():
    cmd = [sys.executable, "-m", "lab_helpers.training.distributed.train", "--devices", "4", "--num-nodes", "2"]
    out = torchrun_command(cmd, node_rank=1, nodes=2, port=29500)
    assert out[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--node_rank=1" in out and "--nproc_per_node=4" in out and "--nnodes=2" in out
    assert out[out.index("-m", 3) + 1] == "lab_helpers.training.distributed.train"
    env = node_env(1, port=29500, gpus_per_node=4)
    assert (env["MASTER_ADDR"], env["NODE_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("127.0.0.1", "1", "4,5,6,7")


# ------------------------------------------------------------------------------------------- strategies


def test_strategy_objects_and_labels_on_cpu():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    ddp = make_strategy("ddp", on_cuda=False, world_size=2)
    assert isinstance(ddp.strategy, DDPStrategy) and "gloo" in ddp.label
    fsdp = make_strategy("fsdp", on_cuda=False, world_size=2, wrap="none")
    assert isinstance(fsdp.strategy, ModelParallelStrategy)
    assert (
        fsdp.fsdp_impl == "fsdp2"
        and fsdp.label.startswith("fsdp2 (ModelParallelStrategy")
        and "no per-block" in fsdp.label
    )
    assert make_strategy("single", on_cuda=False, world_size=1).strategy == "auto"


@pytest.mark.slow
def test_strategy_objects_for_cuda_can_be_built_here():
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    from lab_helpers.training.distributed.deepspeed_cpu import CPUDeepSpeedStrategy

    fsdp = make_strategy("fsdp", on_cuda=True, world_size=4)
    assert isinstance(fsdp.strategy, FSDPStrategy) and fsdp.fsdp_impl == "fsdp1" and "nccl" not in fsdp.label
    assert fsdp.label.startswith("fsdp1 (FSDPStrategy, full shard, wrap per transformer block")
    config = deepspeed_config(_recipe(), world_size=4)
    ds = make_strategy("deepspeed-zero3", on_cuda=True, world_size=4, deepspeed_config=config)
    assert isinstance(ds.strategy, DeepSpeedStrategy) and not isinstance(ds.strategy, CPUDeepSpeedStrategy)
    assert ds.label == "deepspeed zero3 + cpu offload (DeepSpeedStrategy, CUDA)"


def test_fsdp_implementation_by_hardware():
    assert resolve_fsdp_impl("auto", on_cuda=True) == "fsdp1"
    assert resolve_fsdp_impl("auto", on_cuda=False) == "fsdp2"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_fsdp_impl("fsdp1", on_cuda=False)


def test_deepspeed_strategy_on_cpu_is_lightnings_own_class():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    choice = make_strategy(
        "deepspeed-zero3", on_cuda=False, world_size=2, deepspeed_config=deepspeed_config(_recipe(), world_size=2)
    )
    assert isinstance(choice.strategy, DeepSpeedStrategy)
    assert choice.label.startswith("deepspeed zero3 + cpu offload")


def test_exit_descriptions():
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


def _finished_ranks(exp_id: str, strategy_used: str, world_size: int = 2) -> list[dict]:
    """Two ranks' records as a finished run leaves them (the fields the check reads; the rest is conformed)."""
    row = {"iter": 2, "loss": 1.0, "iter_time_s": 0.1, "tokens": 64}
    return [
        {
            "experiment": exp_id, "profile": "ci", "overrides": {}, "section": "multi", "rank": rank,
            "world_size": world_size, "status": "ok", "train_s": 0.1, "warmup_s": 0.2, "warmup_iterations": 1,
            "iterations": 1, "per_iteration": [row], "device_name": "cpu (x86_64)", "strategy_used": strategy_used,
        }
        for rank in range(world_size)
    ]  # fmt: skip


@pytest.mark.parametrize("on_cuda", [False, True])
def test_the_notebooks_check_accepts_what_each_strategy_reports_and_refuses_another(on_cuda):
    """notebook 02's last cell (check_records) is what CI relies on for the multi-GPU runs: it must accept the label
    make_strategy gives the experiment's own strategy, on a CPU and on CUDA, and refuse any other strategy's."""
    from lab_helpers.present.multi_gpu import check_records

    labels = {}
    for exp_id in ("ddp", "fsdp", "fsdp-grad-op", "deepspeed-offload", "deepspeed-zero2-offload"):
        run = resolve(exp_id, "ci", check_files=False)
        opts = run.options
        config = None
        if run.experiment.strategy.startswith("deepspeed"):
            stage = int(run.experiment.strategy[-1])
            config = deepspeed_config(
                run.recipe, world_size=2, offload_optimizer=opts["offload_optimizer"], stage=stage
            )
        choice = make_strategy(
            run.experiment.strategy, on_cuda=on_cuda, world_size=2, wrap=opts.get("wrap") or "block",
            deepspeed_config=config, sharding=opts.get("sharding") or "full",
        )  # fmt: skip
        labels[exp_id] = choice.label
    for exp_id, label in labels.items():
        assert check_records({exp_id: _finished_ranks(exp_id, label)}, {exp_id: {"ok"}}) == [], (exp_id, label)
        for other, other_label in labels.items():
            if other != exp_id:
                problems = check_records({exp_id: _finished_ranks(exp_id, other_label)}, {exp_id: {"ok"}})
                assert any("strategy_used" in p for p in problems), (exp_id, other_label)


def test_the_notebooks_check_names_a_rank_without_timed_iterations_or_with_the_wrong_world_size():
    from lab_helpers.present.multi_gpu import check_records

    label = "ddp (DDPStrategy, gloo, CPU)"
    ranks = _finished_ranks("ddp", label)
    ranks[1] = {**ranks[1], "iterations": 0, "train_s": 0.0}
    [problem] = check_records({"ddp": ranks}, {"ddp": {"ok"}})
    assert problem.startswith("ddp rank 1: no timed iterations")
    alone = _finished_ranks("ddp", label, world_size=1)
    assert any("world size 1, the experiment asks for 2" in p for p in check_records({"ddp": alone}, {"ddp": {"ok"}}))
    assert check_records({"ddp": [{**ranks[0], "peak_alloc_gib": "lots"}]}, {"ddp": {"ok"}})  # schema: not a number
