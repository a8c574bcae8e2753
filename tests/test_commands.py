"""The command lines the notebooks show beside each experiment, and the closing cell (lab_helpers.commands)."""

from __future__ import annotations

import inspect
import shlex

import yaml

from lab_helpers import commands
from lab_helpers.experiments import apply_overrides, resolve
from lab_helpers.paths import lab_home


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


def test_strategy_lines_are_what_the_lab_builds():
    from lab_helpers.distributed import strategies

    source = inspect.getsource(strategies.make_strategy)
    assert "gradient_as_bucket_view=True" in commands.strategy_lines("ddp")
    assert "gradient_as_bucket_view=ddp_bucket_view" in source and "ddp_bucket_view: bool = True" in source
    assert "strategy=DDPStrategy())" in commands.strategy_lines("ddp-course")  # the course's: torch's default
    assert "auto_wrap_policy" not in commands.strategy_lines("fsdp-course")  # the course's: one unit
    assert 'sharding_strategy="FULL_SHARD"' in commands.strategy_lines("fsdp") and 'sharding_strategy="FULL_SHARD"' in source
    assert "offload_optimizer=True" in commands.strategy_lines("deepspeed-offload")
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
