"""The command lines behind each experiment as a student would type them after the course, built from the same
recipe and overrides the lab runs (never typed), and how to leave the node.
"""

from __future__ import annotations

import pprint
import shlex
from collections.abc import Mapping
from typing import Any

from lab_helpers.config.experiments import get_experiment, resolve
from lab_helpers.config.paths import lab_home, results_dir
from lab_helpers.config.recipe_defaults import ATTENTION_BACKENDS
from lab_helpers.config.secrets import redact, redact_mapping
from lab_helpers.training.quick_mode import MEGA_BATCH_BATCHES

CONTAINER = "lab"  # provisioning/start-lab.sh's default container name


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return shlex.quote(str(value))


def litgpt_command(
    exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None, one_rank: Mapping[str, Any] | None = None
) -> str:
    """For section 02 the single-GPU run of the same recipe: litgpt's CLI cannot run DDP or DeepSpeed. Secrets are
    masked as records mask them; the run uses the real value."""
    experiment = get_experiment(exp_id)
    run = resolve(exp_id, profile, overrides, check_files=False)
    merged = redact_mapping(
        {
            **experiment.set,
            **(experiment.set_by_profile.get(profile) or {}),
            **dict(overrides or {}),
            **dict(one_rank or {}),
        }
    )
    recipe = run.recipe_path.relative_to(lab_home()) if run.recipe_path.is_relative_to(lab_home()) else run.recipe_path
    words = ["litgpt", run.litgpt_command, "--config", str(recipe)]
    for key, value in merged.items():
        words += [f"--{key}", _cli_value(value)]
    return redact(" ".join(words))


def strategy_lines(exp_id: str) -> str:
    """Printed from the ``strategies.strategy_call`` the run uses; model, data and loop are the same for every one."""
    from lab_helpers.training.distributed.command import strategy_settings
    from lab_helpers.training.distributed.strategies import strategy_call

    experiment = get_experiment(exp_id)
    if not experiment.distributed:
        raise ValueError(f"{exp_id} is not a section-02 (Lightning) experiment")
    run = resolve(exp_id, "gpu", check_files=False)
    call = strategy_call(experiment.strategy, on_cuda=True, **strategy_settings(run))
    if call is None:
        return "trainer = L.Trainer(devices=1, precision=PRECISION)  # one GPU, no strategy"
    devices = "devices=N"
    if experiment.num_nodes > 1:
        devices = f"devices={experiment.devices}, num_nodes={experiment.num_nodes}"
    imports, before, args = [f"from lightning.pytorch.strategies import {call.class_name}"], [], []
    for key, value in call.kwargs.items():
        if value is None:  # Lightning's default
            continue
        if isinstance(value, dict):  # DeepSpeed's config, as the run folder's deepspeed.json holds it
            text = pprint.pformat(value, width=110, compact=True, sort_dicts=False)
            before.append(f"{key} = " + text.replace("\n", "\n" + " " * (len(key) + 3)))
            args.append(f"{key}={key}")
        elif isinstance(value, set | frozenset):  # auto_wrap_policy={Block}
            imports += [f"from {cls.__module__} import {cls.__name__}" for cls in value]
            args.append(f"{key}={{{', '.join(sorted(cls.__name__ for cls in value))}}}")
        else:
            args.append(f'{key}="{value}"' if isinstance(value, str) else f"{key}={value!r}")
    lines = [
        *imports,
        *before,
        f"trainer = L.Trainer({devices}, precision=PRECISION,",
        f"                    strategy={call.class_name}({', '.join(args)}))",
    ]
    if experiment.num_nodes > 1:
        lines.append("# every node runs the same script with MASTER_ADDR, MASTER_PORT and NODE_RANK set")
    return "\n".join(lines)


def cpu_adam_lines(exp_id: str) -> list[str]:
    """DeepSpeed's C++ Adam steps the states in host memory; torch's AdamW would be several times slower there."""
    from lab_helpers.training.distributed.deepspeed_config import CPU_ADAM_CLASS, cpu_adam_kwargs, optimizer_class_path

    run = resolve(exp_id, "gpu", check_files=False)
    offload = bool(run.options.get("offload_optimizer"))
    path = optimizer_class_path(run.recipe, strategy=run.experiment.strategy, offload_optimizer=offload, on_cuda=True)
    if path != CPU_ADAM_CLASS:
        return []
    kwargs = ", ".join(f"{key}={value!r}" for key, value in cpu_adam_kwargs(run.recipe).items())
    return [
        "and in your LightningModule's configure_optimizers, DeepSpeed's C++ Adam for the states it keeps in host memory:",
        "  from deepspeed.ops.adam import DeepSpeedCPUAdam",
        f"  return DeepSpeedCPUAdam(self.parameters(), {kwargs})",
    ]


ACTIVATION_CHECKPOINTING_NOTE = "\n".join(
    [
        "plus activation checkpointing, which litgpt 0.5.13's finetune_full has no flag for on one device; the lab",
        "runs it as `python -m lab_helpers.training.child_litgpt finetune_full --config ... --activation-checkpointing`, which",
        "wraps every Block before litgpt's fit (lab_helpers/training/activation_checkpointing.py). In your own script:",
        "  import functools\n  from torch.utils.checkpoint import checkpoint",
        "  for block in model.transformer.h:",
        "      block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)",
    ]
)


LENGTH_GROUPED_NOTE = "\n".join(
    [
        "plus micro-batches of samples of similar length, which litgpt's finetune_full has no setting for; the lab runs",
        "`python -m lab_helpers.training.child_litgpt finetune_full --config ... --batch-order length-grouped`, which gives",
        "litgpt's training loader the lab's sampler (lab_helpers/training/quick_mode.py, LengthGroupedSampler). In your own",
        f"script: a DataLoader batch_sampler that shuffles, sorts each mega-batch of {MEGA_BATCH_BATCHES} micro-batches by "
        "length and",
        "shuffles the micro-batches; with Hugging Face's Trainer, TrainingArguments(group_by_length=True).",
    ]
)


def lever_notes(options: Mapping[str, Any]) -> list[str]:
    """The litgpt command leaves the levers out: the lines that do the same in the student's own script."""
    child = "python -m lab_helpers.training.child_litgpt finetune_... --config ..."
    notes = []
    if options.get("compile"):
        mode = options.get("compile_mode", "default")
        notes.append(f"plus every transformer block compiled, which litgpt's finetune scripts do not do; the lab runs `{child} "
                     f"--compile blocks --compile-mode {mode}` (lab_helpers/training/compile_blocks.py). In your own "
                     f'script, before training:\n  for block in model.transformer.h:\n      block.compile(mode="{mode}")')  # fmt: skip
    if options.get("pad_multiple") is not None:
        pad = options["pad_multiple"]
        notes.append(f"plus each training micro-batch padded further than litgpt pads it; the lab runs `{child} "
                     f"--pad-multiple {pad}` (lab_helpers/training/pad_batches.py). In your own script: a collate_fn "
                     "that pads input_ids with 0 and labels with -100 (no loss) up to "
                     + ("one fixed length" if pad == "max" else f"the next multiple of {pad} tokens"))  # fmt: skip
    if options.get("attention_backend"):
        backend = ATTENTION_BACKENDS[options["attention_backend"]]
        notes.append(f"plus attention restricted to one backend; the lab runs `{child} --attention-backend "
                     f"{options['attention_backend']}` (lab_helpers/training/attention_backend.py). In your own "
                     f"script:\n  from torch.nn.attention import SDPBackend, sdpa_kernel\n  with sdpa_kernel("
                     f"SDPBackend.{backend}):\n      train()")  # fmt: skip
    return notes


def one_rank_words(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None) -> tuple[str, dict]:
    """The overrides that make the one-GPU command one rank's share of the batch (the course rows set no global
    batch), and words saying that a sharded model on one GPU needs every state whole."""
    from lab_helpers.planning.arithmetic import model_states

    run = resolve(exp_id, profile, overrides, check_files=False)
    micro, accumulation = int(run.recipe["train"]["micro_batch_size"]), run.gradient_accumulation
    share = {"train.global_batch_size": micro * accumulation, "train.micro_batch_size": micro}
    steps = "micro-batch" if accumulation == 1 else "micro-batches"
    words = [
        f"one rank's share on one GPU with litgpt's CLI ({accumulation} {steps} of {micro} per optimizer step; "
        f"the run's global batch is {run.recipe['train']['global_batch_size']} over {run.world_size} ranks)"
    ]
    if run.world_size == 1:
        words = [f"the same recipe on one GPU with litgpt's CLI ({accumulation} {steps} of {micro} per optimizer step)"]
    if run.experiment.strategy not in ("single", "ddp"):
        states = model_states(exp_id, profile=profile, overrides=overrides)
        words.append(
            f"on one GPU nothing is sharded or offloaded: {states.model}'s weights, gradients and optimizer "
            f"states are all on it ({states.trained.formula()}), {states.gib:.1f} GiB before any activation"
        )
    return "; ".join(words), share


def show_commands(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Print the equivalent litgpt command (and, for 02, the Lightning strategy lines)."""
    lightning = get_experiment(exp_id).distributed
    if lightning:
        what, share = one_rank_words(exp_id, profile=profile, overrides=overrides)
        command = litgpt_command(exp_id, profile=profile, overrides=overrides, one_rank=share)
    else:
        what, command = "the same run with litgpt's CLI", litgpt_command(exp_id, profile=profile, overrides=overrides)
    print(f"{what}:\n  {command}")
    if get_experiment(exp_id).options.get("activation_checkpointing"):
        print(ACTIVATION_CHECKPOINTING_NOTE)
    if get_experiment(exp_id).options.get("batch_order", "shuffle") != "shuffle":
        print(LENGTH_GROUPED_NOTE)
    for note in lever_notes(resolve(exp_id, profile, overrides, check_files=False).options):
        print(note)
    if lightning:
        print("in your own Lightning script, the lines that change:\n  " + strategy_lines(exp_id).replace("\n", "\n  "))
        for line in cpu_adam_lines(exp_id):
            print(line)


def closing_text(*, host: str | None = None, on_gpu_node: bool | None = None, in_container: bool | None = None) -> str:
    """Only what applies here: a laptop gets no rsync line, no ``docker stop`` and no lease. ``in_container``
    defaults to the lab's Docker image (start-lab.sh sets LAB_HOME; Docker makes /.dockerenv)."""
    import getpass
    import os
    import socket
    from pathlib import Path

    results = results_dir()
    if on_gpu_node is None:
        from lab_helpers.hardware.node import describe_node

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
