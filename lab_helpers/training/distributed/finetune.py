"""The distributed training process once started: setup → fit, as litgpt's ``finetune/full.py`` reads.

Apart from ``train`` because importing it imports lightning, torch and litgpt, which ``train.main`` holds back until
the orphan guard and ``DS_ACCELERATOR`` are set.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from litgpt.tokenizer import Tokenizer

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.experiments import gradient_accumulation_steps, resolve_path
from lab_helpers.training.distributed import simulated
from lab_helpers.training.distributed.deepspeed_config import optimizer_class_path
from lab_helpers.training.distributed.module import LitGPTFinetune
from lab_helpers.training.distributed.reporting import RankReport, ReportCallback
from lab_helpers.training.distributed.strategies import StrategyChoice, make_strategy
from lab_helpers.training.distributed.teardown import FreeTrainingStateAtEnd
from lab_helpers.training.distributed.watch_children import WatchChildren
from lab_helpers.training.quick_mode import put_longest_batch_in_second_step, quick_from_env, warmup_steps


@dataclass(frozen=True)
class RunSetup:
    recipe: dict[str, Any]
    choice: StrategyChoice
    layout: dict[str, Any]  # the Trainer's devices, num_nodes and plugins
    accumulate: int  # micro-batches per optimizer step
    max_steps: int
    module: LitGPTFinetune
    data: L.LightningDataModule
    quick: bool
    out_dir: Path
    on_cuda: bool


def setup_run(args: argparse.Namespace, report: RankReport, *, on_cuda: bool) -> RunSetup:
    """A simulated rank joins torch's fake process group here, before the module is built."""
    recipe: dict[str, Any] = yaml.safe_load(args.recipe.read_text())
    train = recipe.get("train") or {}
    world_size = world_size_of(args)
    choice, ds_config = strategy_from_args(args, on_cuda=on_cuda)
    report.fields["strategy_used"] = choice.label
    accumulate = gradient_accumulation(args.accumulate, recipe, world_size=world_size, deepspeed_config=ds_config)
    if args.simulate_world:
        report.fields["strategy_used"] = simulated.strategy_label(choice.label, world_size)
        simulated.init_fake_process_group(world_size)
    layout = trainer_layout(args)

    L.seed_everything(int(recipe.get("seed") or 1337), verbose=False)
    checkpoint_dir = resolve_path(recipe["checkpoint_dir"])
    module = build_module(
        args, recipe, choice, checkpoint_dir=checkpoint_dir, deepspeed_config=ds_config, on_cuda=on_cuda
    )
    data = build_data(recipe, checkpoint_dir)
    quick = quick_from_env()  # the lab's runner sets it (quick_mode): the longest batch opens the second step
    if quick:
        put_longest_batch_in_second_step(data, int(train["micro_batch_size"]), accumulate)
    return RunSetup(
        recipe=recipe,
        choice=choice,
        layout=layout,
        accumulate=accumulate,
        max_steps=int(train.get("max_steps") or 1),
        module=module,
        data=data,
        quick=quick,
        out_dir=args.out_dir or resolve_path(recipe.get("out_dir") or "out/multi"),
        on_cuda=on_cuda,
    )


def fit(setup: RunSetup, report: RankReport) -> None:
    """No validation, logger, checkpoint or progress bar: the lab measures the steps' time and memory."""
    train = setup.recipe.get("train") or {}
    trainer = L.Trainer(
        accelerator="cuda" if setup.on_cuda else "cpu",
        **setup.layout,
        strategy=setup.choice.strategy,
        precision=str(setup.recipe.get("precision") or "32-true"),
        max_steps=setup.max_steps,
        max_epochs=-1,  # the lab measures a fixed number of optimizer steps, however small the data set
        accumulate_grad_batches=setup.accumulate,
        gradient_clip_val=train.get("max_norm"),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=not setup.quick,  # quick mode's sampler gives each rank its share itself
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=setup.out_dir,
        callbacks=callbacks(setup, report),
    )
    trainer.fit(setup.module, datamodule=setup.data)


def callbacks(setup: RunSetup, report: RankReport) -> list[L.Callback]:
    """The training state is freed after the report is written, before Lightning's teardown copies it to the host."""
    return [
        WatchChildren(report, devices=setup.layout["devices"]),
        ReportCallback(
            report,
            total_iterations=setup.max_steps * setup.accumulate,
            metrics_csv=_metrics_csv(setup.out_dir, report.rank),
            warmup_steps=warmup_steps(setup.max_steps, quick=setup.quick),
        ),
        FreeTrainingStateAtEnd(),
    ]


def world_size_of(args: argparse.Namespace) -> int:
    return args.simulate_world or args.devices * args.num_nodes


def gradient_accumulation(
    accumulate: int | None, recipe: Mapping[str, Any], *, world_size: int, deepspeed_config: Mapping[str, Any] | None
) -> int:
    """A DeepSpeed config's own number must agree: Lightning gives DeepSpeed the Trainer's and would drop a different
    one without a word (only a config edited by hand can disagree)."""
    steps = accumulate if accumulate is not None else gradient_accumulation_steps(recipe, world_size=world_size)
    written = (deepspeed_config or {}).get("gradient_accumulation_steps")
    if written is not None and int(written) != steps:
        source = "--accumulate" if accumulate is not None else f"the recipe's batch sizes on {world_size} rank(s)"
        raise LabConfigError(
            f"the DeepSpeed config's gradient_accumulation_steps is {written} but {source} gives {steps}: "
            "make them agree, or leave it out of the config"
        )
    return steps


def strategy_from_args(args: argparse.Namespace, *, on_cuda: bool) -> tuple[StrategyChoice, dict[str, Any] | None]:
    ds_config = json.loads(args.deepspeed_config.read_text()) if args.strategy.startswith("deepspeed") else None
    choice = make_strategy(
        args.strategy,
        on_cuda=on_cuda,
        simulated=bool(args.simulate_world),
        world_size=world_size_of(args),
        wrap=args.wrap,
        fsdp_impl=args.fsdp_impl,
        deepspeed_config=ds_config,
        sharding=args.sharding,
        ddp_bucket_view=not args.no_bucket_view,
    )
    return choice, ds_config


def trainer_layout(args: argparse.Namespace) -> dict[str, Any]:
    if not args.simulate_world:
        return {"devices": args.devices, "num_nodes": args.num_nodes, "plugins": None}
    world_size = args.simulate_world
    return {"devices": 1, "num_nodes": world_size, "plugins": [simulated.SimulatedRankEnvironment(world_size)]}


def build_module(
    args: argparse.Namespace,
    recipe: dict[str, Any],
    choice: StrategyChoice,
    *,
    checkpoint_dir: Path,
    deepspeed_config: Mapping[str, Any] | None,
    on_cuda: bool,
) -> LitGPTFinetune:
    offload = deepspeed_config is not None and "offload_optimizer" in deepspeed_config.get("zero_optimization", {})
    return LitGPTFinetune(
        recipe,
        checkpoint_dir=checkpoint_dir,
        strategy=args.strategy,
        fsdp_impl=choice.fsdp_impl,
        wrap=choice.wrap,
        optimizer_class=optimizer_class_path(
            recipe, strategy=args.strategy, offload_optimizer=offload, on_cuda=on_cuda
        ),
        reshard_after_forward=choice.sharding != "grad-op",
        zero_gradients_in_place=args.strategy == "ddp" and not args.no_bucket_view,
    )


def build_data(recipe: dict[str, Any], checkpoint_dir: Path) -> L.LightningDataModule:
    spec = recipe.get("data") or {"class_path": "litgpt.data.Alpaca2k", "init_args": {}}
    module_name, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    init_args = dict(spec.get("init_args") or {})
    for key in ("json_path", "download_dir"):
        if init_args.get(key):
            init_args[key] = resolve_path(init_args[key])
    data = cls(**init_args)
    train = recipe.get("train") or {}
    data.connect(
        tokenizer=Tokenizer(checkpoint_dir),
        batch_size=int(train["micro_batch_size"]),
        max_seq_length=int(train.get("max_seq_length") or -1),
    )
    return data


def _metrics_csv(out_dir: Path, rank: int) -> Path | None:
    """Rank 0 only: one run, one table."""
    return Path(out_dir) / "logs" / "lightning" / "metrics.csv" if rank == 0 else None
