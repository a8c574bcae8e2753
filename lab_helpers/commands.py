"""The command lines behind each experiment, as a student would type them outside the lab, and how to leave.

Why: the lab runs every experiment through one call so that it is measured and recorded; after the course the
student runs litgpt and Lightning directly. Each experiment cell therefore shows the equivalent
``litgpt finetune_*`` command (built from the same recipe and overrides the lab runs, never typed by hand),
02 shows the Lightning strategy line that changes, and the last cell says where the results are, how to copy
them off the node, how to stop the container and that the lease should be released.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from lab_helpers.experiments import get_experiment, resolve
from lab_helpers.paths import lab_home, results_dir

CONTAINER = "lab"  # provisioning/start-lab.sh's default container name


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return shlex.quote(str(value))


def litgpt_command(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None) -> str:
    """``litgpt finetune_full --config configs/... --precision ... --train.micro_batch_size ...`` for ``exp_id``.

    The recipe file plus every key the experiment (and this node's overrides) set on top of it; for section
    02 this is the single-GPU litgpt run of the same recipe (litgpt's CLI cannot run DDP or DeepSpeed).
    """
    experiment = get_experiment(exp_id)
    run = resolve(exp_id, profile, overrides, check_files=False)
    merged = {**experiment.set, **(experiment.set_by_profile.get(profile) or {}), **dict(overrides or {})}
    recipe = run.recipe_path.relative_to(lab_home()) if run.recipe_path.is_relative_to(lab_home()) else run.recipe_path
    words = ["litgpt", run.litgpt_command, "--config", str(recipe)]
    for key, value in merged.items():
        words += [f"--{key}", _cli_value(value)]
    return " ".join(words)


_STRATEGY_LINES = {
    "single": ["trainer = L.Trainer(devices=1, precision=PRECISION)  # one GPU, no strategy"],
    "ddp": [
        "from lightning.pytorch.strategies import DDPStrategy",
        "trainer = L.Trainer(devices=N, precision=PRECISION,",
        "                    strategy=DDPStrategy(gradient_as_bucket_view=True))",
    ],
    "fsdp": [
        "from lightning.pytorch.strategies import FSDPStrategy",
        "from litgpt.model import Block",
        "trainer = L.Trainer(devices=N, precision=PRECISION,",
        '                    strategy=FSDPStrategy(sharding_strategy="FULL_SHARD", auto_wrap_policy={Block}))',
    ],
    "deepspeed-zero2": [
        "from lightning.pytorch.strategies import DeepSpeedStrategy",
        "trainer = L.Trainer(devices=N, precision=PRECISION,",
        "                    strategy=DeepSpeedStrategy(stage=2, offload_optimizer=True, pin_memory=True))",
    ],
    "deepspeed-zero3": [
        "from lightning.pytorch.strategies import DeepSpeedStrategy",
        "trainer = L.Trainer(devices=N, precision=PRECISION,",
        "                    strategy=DeepSpeedStrategy(stage=3, offload_optimizer=True, pin_memory=True))",
    ],
}


def strategy_lines(exp_id: str) -> str:
    """The Lightning lines that change for a section-02 experiment (what lab_helpers.distributed.strategies
    builds on CUDA); the model, data and training loop stay the same for every strategy."""
    experiment = get_experiment(exp_id)
    if not experiment.distributed:
        raise ValueError(f"{exp_id} is not a section-02 (Lightning) experiment")
    lines = list(_STRATEGY_LINES[experiment.strategy])
    if experiment.options.get("sharding") == "grad-op":  # FSDP's ZeRO-2 form
        lines = [line.replace('"FULL_SHARD"', '"SHARD_GRAD_OP"') for line in lines]
    if experiment.options.get("wrap") == "none":  # the course's FSDPStrategy: no auto-wrap policy, one unit
        lines = [line.replace(", auto_wrap_policy={Block}", "") for line in lines if "import Block" not in line]
    if experiment.options.get("ddp_bucket_view") is False:  # the course's DDPStrategy(): torch's default
        lines = [line.replace("DDPStrategy(gradient_as_bucket_view=True)", "DDPStrategy()") for line in lines]
    if experiment.num_nodes > 1:
        per_node = f"devices={experiment.devices}, num_nodes={experiment.num_nodes}"
        lines = [line.replace("devices=N", per_node) for line in lines]
        lines.append("# every node runs the same script with MASTER_ADDR, MASTER_PORT and NODE_RANK set")
    return "\n".join(lines)


ACTIVATION_CHECKPOINTING_NOTE = "\n".join(
    [
        "plus activation checkpointing, which litgpt 0.5.13's finetune_full has no flag for on one device; the lab",
        "runs it as `python -m lab_helpers.child_litgpt finetune_full --config ... --activation-checkpointing`, which",
        "wraps every Block before litgpt's fit (lab_helpers/activation_checkpointing.py). In your own script:",
        "  import functools\n  from torch.utils.checkpoint import checkpoint",
        "  for block in model.transformer.h:",
        "      block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)",
    ]
)


def show_commands(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Print the equivalent litgpt command (and, for 02, the Lightning strategy lines)."""
    lightning = get_experiment(exp_id).distributed
    what = "the same recipe on one GPU with litgpt's CLI" if lightning else "the same run with litgpt's CLI"
    print(f"{what}:\n  " + litgpt_command(exp_id, profile=profile, overrides=overrides))
    if get_experiment(exp_id).options.get("activation_checkpointing"):
        print(ACTIVATION_CHECKPOINTING_NOTE)
    if lightning:
        print("in your own Lightning script, the lines that change:\n  " + strategy_lines(exp_id).replace("\n", "\n  "))


def closing_text(*, host: str | None = None, on_gpu_node: bool | None = None, in_container: bool | None = None) -> str:
    """Where the results are and, only where it applies to this machine, how to copy them off a leased node and
    give it back: a laptop or a CPU machine gets no rsync line, no ``docker stop`` and no lease (03 printed
    placeholder paths and ``docker stop lab`` on a laptop). ``on_gpu_node`` defaults to "this machine has a GPU",
    ``in_container`` to "running in the lab's Docker image" (start-lab.sh sets LAB_HOME; Docker makes
    /.dockerenv)."""
    import getpass
    import os
    import socket
    from pathlib import Path

    results = results_dir()
    if on_gpu_node is None:
        from lab_helpers.node import describe_node

        on_gpu_node = bool(describe_node().get("gpus"))
    if in_container is None:
        in_container = bool(os.environ.get("LAB_HOME")) or Path("/.dockerenv").exists()
    lines = [
        f"Your results: {results} (runs.jsonl: one line per run and rank; runs/<run_id>/: logs and "
        "timelines; figures/: the plots and comparison.csv)."
    ]
    if not on_gpu_node:
        lines.append("They are on this machine already: nothing to copy off and no lease to give back.")
        return "\n".join(lines)
    host = host or socket.getfqdn()
    remote = str(results)
    if in_container and results.is_relative_to(lab_home()):  # the node sees the checkout, not the mount point
        remote = f"<the folder you cloned the lab into on the node>/{results.relative_to(lab_home())}"
    lines += [
        "Copy them to your own computer before the lease ends (run this there, not on the node):",
        f"  rsync -avz {getpass.getuser()}@{host}:{remote}/ ./lab-results/",
        f"  (or: scp -r {getpass.getuser()}@{host}:{remote} ./lab-results)",
        "Then, on the node (not in this notebook): stop the lab with",
        f"  docker stop {CONTAINER}" if in_container else "  Ctrl-C in the terminal running scripts/start-notebooks.sh",
        "and release the lease (e.g. delete the reservation in your testbed's portal) so that the GPUs stop "
        "costing money and the next student can have them.",
    ]
    return "\n".join(lines)
