"""The command lines the notebooks show beside each experiment, and the closing cell (lab_helpers.present.commands)."""

from __future__ import annotations

import shlex

import pytest
import yaml

from lab_helpers.config.experiments import apply_overrides, load_experiments, resolve
from lab_helpers.config.paths import lab_home
from lab_helpers.present import commands


def _recipe_from(command: str) -> dict:
    """What litgpt would run: the --config file with every --key value applied on top."""
    words = shlex.split(command)
    assert words[:2] == ["litgpt", "finetune_full"] or words[:2] == ["litgpt", "finetune_lora"], words
    config = yaml.safe_load((lab_home() / words[words.index("--config") + 1]).read_text())
    pairs = words[words.index("--config") + 2 :]
    overrides = {pairs[i][2:]: yaml.safe_load(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    return apply_overrides(config, overrides)


def test_litgpt_command_runs_the_same_recipe_as_the_lab():
    for exp_id, overrides in (("full-13b-sgd", None), ("bf16-mixed", {"precision": "16-mixed"}), ("qlora-7b", None)):
        command = commands.litgpt_command(exp_id, profile="gpu", overrides=overrides)
        assert _recipe_from(command) == resolve(exp_id, "gpu", overrides, check_files=False).recipe, command
    assert "--optimizer SGD" in commands.litgpt_command("full-13b-sgd", profile="gpu")


@pytest.mark.parametrize("exp_id", ["fsdp-course", "deepspeed-offload", "ddp"])
def test_one_gpu_line_is_one_ranks_share_of_the_run(exp_id, capsys):
    """The 02 line runs what one rank of the run runs: its micro batch and its micro-batches per step (the course
    rows and the 13B set no global batch of their own), and a sharding strategy's line says every state is whole."""
    run = resolve(exp_id, "gpu", check_files=False)
    commands.show_commands(exp_id, profile="gpu")
    words, command = capsys.readouterr().out.split(":\n  ", 1)
    train = _recipe_from(command.splitlines()[0])["train"]
    assert train["micro_batch_size"] == run.recipe["train"]["micro_batch_size"]
    assert train["global_batch_size"] // train["micro_batch_size"] == run.gradient_accumulation
    assert ("nothing is sharded" in words) == (run.experiment.strategy != "ddp")


def test_offloaded_deepspeed_lines_build_deepspeeds_cpu_adam(capsys):
    """On CUDA the training process builds DeepSpeedCPUAdam for an offloaded optimizer (optimizer_class_path);
    the student's lines say so with the recipe's lr and betas, and the runs that do not offload say nothing."""
    commands.show_commands("deepspeed-offload", profile="gpu")
    out = capsys.readouterr().out
    assert "from deepspeed.ops.adam import DeepSpeedCPUAdam" in out and "betas=(0.9, 0.95)" in out
    assert commands.cpu_adam_lines("fsdp") == []


def _lesson(strategy) -> tuple:
    """What a strategy object is, as the lesson sees it: its class and the arguments the student's line sets."""
    name = type(strategy).__name__ if strategy != "auto" else "auto"
    if name == "DDPStrategy":
        return name, strategy._ddp_kwargs.get("gradient_as_bucket_view", False)
    if name == "FSDPStrategy":
        policy = strategy.kwargs.get("auto_wrap_policy")
        return name, strategy.sharding_strategy, sorted(cls.__name__ for cls in getattr(policy, "_module_classes", ()))
    if name == "DeepSpeedStrategy":
        return name, strategy.config
    return (name,)


@pytest.mark.parametrize("exp_id", [e for e, x in load_experiments("multi").items() if x.distributed])
def test_strategy_lines_build_what_the_training_process_builds(exp_id, tmp_path):
    """The printed lines, executed as a student's script would run them, build the same strategy as the training
    process does from the command line the lab writes (on CUDA: what a student's GPU node runs)."""
    from lab_helpers.training.distributed import finetune, train
    from lab_helpers.training.distributed.command import build_command

    run = resolve(exp_id, "gpu", check_files=False)
    argv = build_command(run, tmp_path)
    args = train.parse_args(argv[argv.index("lab_helpers.training.distributed.train") + 1 :])
    built, _ = finetune.strategy_from_args(args, on_cuda=True)

    class Lightning:  # the student's `import lightning as L`, with a Trainer that hands back what it was given
        Trainer = staticmethod(lambda **kwargs: kwargs)

    namespace = {"L": Lightning, "N": 2, "PRECISION": run.recipe.get("precision")}
    exec(commands.strategy_lines(exp_id), namespace)
    assert _lesson(namespace["trainer"].get("strategy", "auto")) == _lesson(built.strategy)


def test_strategy_lines_say_what_each_experiment_teaches():
    assert "DDPStrategy(gradient_as_bucket_view=True)" in commands.strategy_lines("ddp")
    assert "DDPStrategy(gradient_as_bucket_view=False)" in commands.strategy_lines("ddp-course")  # torch's default
    assert "auto_wrap_policy" not in commands.strategy_lines("fsdp-course")  # the course's: one unit
    assert 'sharding_strategy="SHARD_GRAD_OP"' in commands.strategy_lines("fsdp-grad-op")
    assert "'offload_optimizer': {'device': 'cpu', 'pin_memory': True}" in commands.strategy_lines("deepspeed-offload")
    assert "num_nodes=2" in commands.strategy_lines("multi-node")


def test_closing_text_says_where_results_are_and_how_to_leave(results):
    text = commands.closing_text(host="node.example", on_gpu_node=True, in_container=True)
    assert str(results) in text and "rsync -avz" in text and "scp -r" in text and "@node.example:" in text
    assert "docker stop lab" in text and "release the lease" in text
    plain = commands.closing_text(host="node.example", on_gpu_node=True, in_container=False)
    assert f"@node.example:{results}/ ./lab-results/" in plain and "<the folder" not in plain  # no placeholder path
    assert "docker" not in plain and "start-notebooks.sh" in plain


def test_closing_text_on_a_machine_without_a_gpu_prints_only_what_applies(results):
    text = commands.closing_text()  # this machine: no GPU
    assert str(results) in text
    assert "rsync" not in text and "docker" not in text and "lease" in text and "<the folder" not in text
