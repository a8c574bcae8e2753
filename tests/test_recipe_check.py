"""One check of a recipe (lab_helpers.config.recipe_check), met the same way from ``run`` and from ``plan``.

Before it, a recipe was checked in four places: ``run`` said "unknown recipe key 'precison' ... (did you mean
'precision'?)" where ``plan`` said "litgpt finetune_full does not accept recipe key(s): precison", and only ``plan``
ran litgpt's own ``validate_args``, so ``run --set train.max_norm=1.0`` started a process that litgpt then refused.
"""

from __future__ import annotations

import pytest

from lab_helpers.config.experiments import (
    LabConfigError,
    get_experiment,
    parse_set_args,
    recipe_path_for,
    resolve,
)
from lab_helpers.config.recipe_check import check_recipe, recipe_command
from lab_helpers.present import plan_command

EXPERIMENT = "grad-accum"  # litgpt finetune_full on one device

MISTAKES = [  # (--set pair, the start of the one line both commands print)
    ("precison=bf16-true", "unknown recipe key 'precison' for litgpt finetune_full (did you mean 'precision'?)"),
    ("train.micro_batchsize=2", "unknown recipe key 'train.micro_batchsize' (did you mean"),
    ("data.jsonpath=x", "unknown recipe key 'data.jsonpath' for litgpt.data.JSON (did you mean 'data.json_path'?)"),
    ("train.max_steps=abc", "train.max_steps: expected a whole number or null, e.g. --set train.max_steps="),
    ("train=5", "train: expected a mapping of train settings, e.g. --set train."),
    ("logger_name=foo", "logger_name: expected one of csv, tensorboard"),
    ("train.epochs=0", "train.epochs must be >= 1; got 0"),
    ("precision=bf17", "precision 'bf17' is not one of"),
    ("train.lr_warmup_steps=0", "train.lr_warmup_steps must be a whole number >= 1"),
    ("train.micro_batch_size=64", "train.micro_batch_size (64) is larger than train.global_batch_size (32)"),
    # litgpt's getattr(torch.optim, name) failed in the run, after the process start and the model load
    ("optimizer=adamw", "optimizer: torch.optim has no optimizer 'adamw' (did you mean 'AdamW'?)"),
    ("optimizer.class_path=torch.optim.SDG", "optimizer.class_path: torch.optim has no optimizer 'SDG' (did you mean"),
    # what only litgpt's CLI parser (jsonargparse) refuses: a PromptStyle is a class the lab's walk cannot check
    ("data.prompt_style=5", "data.prompt_style: litgpt's parser refuses 5 ("),
    # what only the finetune script's validate_args refuses: finetune_full has no gradient clipping
    ("train.max_norm=1.0", "litgpt finetune_full rejects this recipe: it doesn't support the 'max_norm' argument"),
]


def _run_line(pair: str) -> str:
    with pytest.raises(LabConfigError) as err:
        resolve(EXPERIMENT, "ci", parse_set_args([pair]), check_files=False)
    return str(err.value)


def _plan_line(pair: str, capsys) -> str:
    """``plan`` on the experiment's recipe file with the experiment's own settings, then the mistake."""
    experiment = get_experiment(EXPERIMENT)
    pairs = [f"{key}={value}" for key, value in experiment.set.items()] + [pair]
    argv = [str(recipe_path_for(experiment, "ci")), "--device", "cpu"]
    for item in pairs:
        argv += ["--set", item]
    assert plan_command.main(argv) == 2, pair
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err.removeprefix("error: ")


@pytest.mark.parametrize("pair,start", MISTAKES, ids=[pair for pair, _ in MISTAKES])
def test_run_and_plan_refuse_a_mistake_with_the_same_line(pair, start, capsys):
    line = _run_line(pair)
    assert line.startswith(start) and "\n" not in line, line
    assert _plan_line(pair, capsys) == line


def test_validate_args_is_asked_only_of_litgpt_scripts():
    """The lab's Lightning-Trainer runs read the recipe themselves: litgpt's script rules do not bind them."""
    run = resolve("ddp", "ci", {"train.max_norm": 1.0}, check_files=False)
    assert run.recipe["train"]["max_norm"] == 1.0
    recipe = dict(run.recipe)
    with pytest.raises(LabConfigError, match="finetune_full rejects this recipe"):
        check_recipe(recipe, "finetune_full", devices=run.devices, litgpt_script=True)


def test_the_command_a_recipe_file_is_for():
    assert recipe_command({"checkpoint_dir": "x", "lora_r": 8}) == "finetune_lora"
    assert recipe_command({"checkpoint_dir": "x", "train": {}}) == "finetune_full"
    with pytest.raises(LabConfigError, match="unknown litgpt command 'finetune_qlora'"):
        check_recipe({}, "finetune_qlora", devices=1)


# ----------------------------------------- what the node can know, one line before any process starts


def _line(exp_id: str, overrides: dict) -> str:
    with pytest.raises(LabConfigError) as err:
        resolve(exp_id, "ci", overrides, check_files=False)
    assert "\n" not in str(err.value), err.value
    return str(err.value)


@pytest.mark.parametrize("key", ["devices", "num_nodes"])
def test_a_single_device_experiment_asked_for_two_devices_is_refused_up_front(key):
    """``run small-batch --set devices=2`` on ci started litgpt's script, which chose FSDP, printed its config and
    ended in "FSDP is only available on GPU" with an ``error`` record: the lab runs it on one device."""
    import torch

    line = _line("small-batch", {key: 2})
    assert line.startswith(f"{key}=2: small-batch trains on one device (litgpt's finetune script)"), line
    assert f"--set {key}=1" in line and "multi-GPU experiments" in line
    if not torch.cuda.is_available():
        assert "FSDP, which runs on GPUs only, and this machine has none" in line


@pytest.mark.parametrize("value", [0, -2, "two"])  # 1.5: the type walk says "expected a whole number or text"
def test_devices_is_what_litgpt_takes_or_one_line(value):
    line = _line("small-batch", {"devices": value})
    assert line.startswith("devices must be a whole number >= 1 or auto"), line


def test_num_nodes_below_one_is_one_line():
    assert _line("small-batch", {"num_nodes": 0}).startswith("num_nodes must be >= 1; got 0")


def test_auto_on_a_machine_of_one_device_is_one_device():
    import torch

    if torch.cuda.device_count() > 1:
        pytest.skip("auto is every GPU here")
    for value in ("auto", -1, 1):
        assert resolve("small-batch", "ci", {"devices": value}, check_files=False).recipe["devices"] == value


def test_a_multi_gpu_experiment_refuses_a_devices_setting_it_would_not_read():
    """A Lightning experiment is launched on its own devices (configs/experiments/multi.yaml), written over the
    recipe's: ``--set devices=4`` was silently ignored."""
    run = resolve("ddp", "ci", check_files=False)
    same = resolve("ddp", "ci", {"devices": run.devices}, check_files=False)
    assert same.devices == run.devices
    line = _line("ddp", {"devices": run.devices + 2})
    assert line.startswith(f"devices={run.devices + 2}: ddp runs on the experiment's own devices"), line
    assert _line("ddp", {"num_nodes": 3}).startswith("num_nodes=3: ddp runs on the experiment's own")


def test_plan_still_plans_a_recipe_for_a_node_of_several_gpus(capsys):
    """``plan`` a recipe for another node from this one: the devices the recipe names are the plan's question."""
    argv = [str(recipe_path_for(get_experiment(EXPERIMENT), "ci")), "--device", "cuda", "--set", "devices=4",
            "--set", "train.global_batch_size=32", "--set", "train.micro_batch_size=8"]  # fmt: skip
    assert plan_command.main(argv) == 0, capsys.readouterr().err
