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
