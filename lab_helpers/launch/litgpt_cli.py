from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lab_helpers.config.experiments import ResolvedRun, runnable_recipe
from lab_helpers.config.paths import write_lab_file

RECIPE_FILENAME = "recipe.yaml"


def command(run: ResolvedRun, run_dir: Path) -> list[str]:
    """litgpt's own CLI in the lab's child (``training.child_litgpt``), with the recipe written into the run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = run_dir / RECIPE_FILENAME
    recipe = runnable_recipe(run.recipe, out_dir=run_dir / "out")
    write_lab_file(recipe_file, yaml.safe_dump(recipe, sort_keys=False).encode())  # never through a link
    argv = [sys.executable, "-m", "lab_helpers.training.child_litgpt", run.litgpt_command, "--config", str(recipe_file)]
    if run.options["activation_checkpointing"]:  # litgpt has no such flag on one device: the child applies it
        from lab_helpers.training.activation_checkpointing import FLAG

        argv.append(FLAG)
    if run.options["batch_order"] != "shuffle":  # litgpt has no such setting: the child orders the batches
        from lab_helpers.training.quick_mode import BATCH_ORDER_FLAG

        argv += [BATCH_ORDER_FLAG, run.options["batch_order"]]
    return argv + lever_flags(run.options)


def lever_flags(options: Mapping[str, Any]) -> list[str]:
    """litgpt has no such settings: the child applies them and removes the switches before litgpt reads the argv."""
    from lab_helpers.training import attention_backend, compile_blocks, pad_batches

    argv: list[str] = []
    if options["compile"] is not None:
        argv += [compile_blocks.FLAG, options["compile"], compile_blocks.MODE_FLAG, options["compile_mode"]]
    if options["pad_multiple"] is not None:
        argv += [pad_batches.FLAG, str(options["pad_multiple"])]
    if options["attention_backend"] is not None:
        argv += [attention_backend.FLAG, options["attention_backend"]]
    return argv
