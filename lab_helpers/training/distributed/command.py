"""The ``lightning-strategy`` launcher's command. What the processes need goes into the run's folder, so that the
command is short, can be re-run by hand, and Lightning can re-run it for every local rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from lab_helpers.config.experiments import ResolvedRun, runnable_recipe
from lab_helpers.config.paths import write_lab_file
from lab_helpers.training.distributed.deepspeed_config import ZERO_STAGES, deepspeed_config

RECIPE_FILENAME = "recipe.yaml"
DEEPSPEED_FILENAME = "deepspeed.json"


def run_recipe(run: ResolvedRun, run_dir: Path) -> dict[str, Any]:
    recipe = runnable_recipe(run.recipe, out_dir=run_dir / "out")
    recipe["devices"] = run.devices
    recipe["num_nodes"] = run.experiment.num_nodes
    return recipe


def strategy_settings(run: ResolvedRun, recipe: dict[str, Any] | None = None) -> dict[str, Any]:
    """``strategies.make_strategy``'s arguments; ``commands.strategy_lines`` prints the strategy built from the same."""
    opts = run.options  # the same settings the planner is asked with (recipe_defaults.LAUNCH_OPTION_DEFAULTS)
    strategy = run.experiment.strategy
    config = None
    if strategy in ZERO_STAGES:
        config = deepspeed_config(
            run.recipe if recipe is None else recipe,
            world_size=run.world_size,
            offload_optimizer=bool(opts["offload_optimizer"]),
            pin_memory=bool(opts["pin_memory"]),
            stage=ZERO_STAGES[strategy],
        )
    return {
        "world_size": run.world_size,
        "wrap": str(opts["wrap"]),
        "fsdp_impl": str(opts["fsdp_impl"]),
        "sharding": str(opts["sharding"]),
        "ddp_bucket_view": bool(opts["ddp_bucket_view"]),
        "deepspeed_config": config,
    }


def build_command(run: ResolvedRun, run_dir: Path) -> list[str]:
    """Several nodes are simulated on this machine over loopback (``distributed.nodes``; docs/multi_node.md)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe = run_recipe(run, run_dir)
    recipe_path = run_dir / RECIPE_FILENAME
    write_lab_file(recipe_path, yaml.safe_dump(recipe, sort_keys=False).encode())  # never through a link
    num_nodes = run.experiment.num_nodes
    strategy = run.experiment.strategy
    argv = [
        sys.executable,
        "-m",
        "lab_helpers.training.distributed.train",
        "--recipe",
        str(recipe_path),
        "--strategy",
        strategy,
        "--devices",
        str(1 if run.simulated_world_size else run.devices),
        "--num-nodes",
        str(num_nodes),
        "--accumulate",
        str(run.gradient_accumulation),
        "--out-dir",
        str(run_dir / "out"),
    ]
    settings = strategy_settings(run, recipe)
    if strategy == "fsdp":
        argv += ["--wrap", settings["wrap"], "--fsdp-impl", settings["fsdp_impl"]]
        if settings["sharding"] != "full":  # grad-op: SHARD_GRAD_OP (ZeRO-2); the default stays off the command line
            argv += ["--sharding", settings["sharding"]]
    if strategy == "ddp" and not settings["ddp_bucket_view"]:  # torch's default, the course's: a second gradient copy
        argv += ["--no-bucket-view"]
    if settings["deepspeed_config"] is not None:
        ds_path = run_dir / DEEPSPEED_FILENAME
        ds_path.write_text(json.dumps(settings["deepspeed_config"], indent=2))
        argv += ["--deepspeed-config", str(ds_path)]
    if run.simulated_world_size:  # rank 0 of the world, alone, on the fake process group (simulated)
        argv += ["--simulate-world", str(run.simulated_world_size)]
    if num_nodes > 1:
        argv = [sys.executable, "-m", "lab_helpers.training.distributed.nodes", "--nodes", str(num_nodes), "--", *argv]
    return argv
