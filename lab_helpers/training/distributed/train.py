"""The multi-GPU section's training process: a litgpt recipe run by the Lightning Trainer with one strategy.

Launched by the lab's runner as ``python -m lab_helpers.training.distributed.train --recipe R --strategy S ...`` (see
``command.build_command``). For DDP, FSDP and DeepSpeed on one node Lightning re-runs this same module for
local ranks 1..N-1 (its subprocess launcher), so everything the script needs is in its arguments. Across
nodes it is started once per node (``lab_helpers.training.distributed.nodes``, or torchrun; docs/multi_node.md).

Each rank writes one report (``lab_helpers.training.child_report``) whatever happens: ``ok`` after the loop, the
status of the exception that stopped it, or ``error`` naming the peer whose death stopped it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lab_helpers.config.recipe_defaults import FSDP_IMPLS
from lab_helpers.training.distributed.strategies import SHARDINGS, STRATEGIES, WRAP_POLICIES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, required=True, help="litgpt-format recipe (YAML), already resolved")
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs) per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument(
        "--accumulate",
        type=int,
        help="micro-batches per optimizer step (the lab passes ResolvedRun's; default: "
        "global batch / (micro batch x ranks))",
    )
    parser.add_argument("--accelerator", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--wrap", choices=WRAP_POLICIES, default="block", help="FSDP unit: each Block, or the whole model"
    )
    parser.add_argument("--fsdp-impl", choices=FSDP_IMPLS, default="auto")
    parser.add_argument(
        "--sharding",
        choices=tuple(SHARDINGS),
        default="full",
        help="FSDP: full (FULL_SHARD) or grad-op (SHARD_GRAD_OP)",
    )
    parser.add_argument(
        "--no-bucket-view",
        action="store_true",
        help="DDP: gradient_as_bucket_view=False (torch's default, the "
        "course's): the reducer's buckets are a second copy of the gradients",
    )
    parser.add_argument("--deepspeed-config", type=Path, help="DeepSpeed JSON written by build_command")
    parser.add_argument("--out-dir", type=Path, help="where Lightning may write (default: the recipe's out_dir)")
    parser.add_argument(
        "--simulate-world",
        type=int,
        metavar="N",
        help="run only rank 0 of a world of N on this one device, with "
        "torch's fake process group (lab_helpers.training.distributed.simulated): memory real, no communication",
    )
    args = parser.parse_args(argv)
    if args.simulate_world is not None and (args.simulate_world < 2 or args.devices != 1 or args.num_nodes != 1):
        parser.error("--simulate-world N needs N >= 2 with --devices 1 --num-nodes 1 (one process plays rank 0)")
    return args


def world_size_of(args: argparse.Namespace) -> int:
    """Ranks of the run the process takes part in: N for a simulated rank, else devices x nodes."""
    return args.simulate_world or args.devices * args.num_nodes


def strategy_from_args(args: argparse.Namespace, *, on_cuda: bool) -> tuple[Any, dict[str, Any] | None]:
    """(``make_strategy``'s choice, the DeepSpeed config or None), asked with what ``build_command`` wrote on the
    command line (``command.strategy_settings``), read back: the strategy ``commands.strategy_lines`` prints."""
    from lab_helpers.training.distributed.strategies import make_strategy

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


def env_global_rank(devices: int) -> int:
    """This process's global rank from the launcher's environment (before Lightning has set anything up)."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    return int(os.environ.get("NODE_RANK", 0)) * devices + int(os.environ.get("LOCAL_RANK", 0))


def main(argv: list[str] | None = None) -> int:
    launched_by_runner = "LOCAL_RANK" not in os.environ and os.environ.get("LAB_WATCH_PARENT") != "1"
    if launched_by_runner:  # first, before the seconds of imports: a kernel restart then must not leave us running
        from lab_helpers.training.orphan_guard import die_with_parent

        die_with_parent()
    args = parse_args(argv)
    on_cuda = _wants_cuda(args.accelerator)
    if args.strategy.startswith("deepspeed") and not on_cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed

    from lab_helpers.training.distributed import peers
    from lab_helpers.training.distributed.reporting import RankReport

    # a simulated rank is one process really run: its report says world 1 (the record adds simulated_world_size)
    report = RankReport(rank=env_global_rank(args.devices), world_size=args.devices * args.num_nodes)
    peers.sigterm_as_interrupt()
    if not launched_by_runner:
        peers.watch_parent(lambda message: report.write("error", message))
    else:  # the process the runner started: if the runner dies (kernel restart), end the whole run
        from lab_helpers.training.orphan_guard import start_orphan_guard

        start_orphan_guard()
    peers.without_lightning_observer()  # rank 0 watches its children itself (WatchChildren below), reporting first
    try:
        with tensor_peak_on_cpu(on_cuda) as tensors:
            report.tensors = tensors
            run(args, report, on_cuda=on_cuda)
    except BaseException as exc:  # noqa: BLE001 -- every outcome is reported, then the exception goes on
        if not isinstance(exc, SystemExit):
            report.write_exception(exc)
        raise
    if not report.written:
        report.write("error", "training ended without reaching the end of the loop")
        return 1
    return 0


def run(args: argparse.Namespace, report, *, on_cuda: bool) -> None:
    import lightning as L

    from lab_helpers.config.experiments import resolve_path
    from lab_helpers.training.distributed.deepspeed_config import optimizer_class_path
    from lab_helpers.training.distributed.module import LitGPTFinetune
    from lab_helpers.training.distributed.reporting import ReportCallback
    from lab_helpers.training.distributed.teardown import FreeTrainingStateAtEnd
    from lab_helpers.training.quick_mode import put_longest_batch_in_second_step, quick_from_env, warmup_steps

    recipe: dict[str, Any] = yaml.safe_load(args.recipe.read_text())
    train = recipe.get("train") or {}
    world_size = world_size_of(args)
    if args.accumulate is not None:  # derived once by the lab (ResolvedRun.gradient_accumulation)
        accum = args.accumulate
    else:  # started by hand
        from lab_helpers.config.experiments import gradient_accumulation_steps

        accum = gradient_accumulation_steps(recipe, world_size=world_size)
    max_steps = int(train.get("max_steps") or 1)

    choice, ds_config = strategy_from_args(args, on_cuda=on_cuda)
    offload = False
    if ds_config is not None:
        # the same value; strategy_call leaves it out of the strategy's config (Lightning sets it itself)
        accum = int(ds_config.get("gradient_accumulation_steps", accum))
        offload = "offload_optimizer" in ds_config.get("zero_optimization", {})
    report.fields["strategy_used"] = choice.label
    trainer_layout: dict[str, Any] = {"devices": args.devices, "num_nodes": args.num_nodes, "plugins": None}
    if args.simulate_world:
        from lab_helpers.training.distributed.simulated import (
            SimulatedRankEnvironment,
            init_fake_process_group,
            strategy_label,
        )

        report.fields["strategy_used"] = strategy_label(choice.label, world_size)
        init_fake_process_group(world_size)
        # node 0 of N one-device nodes: Lightning's rank arithmetic gives rank 0 of N and starts no other process
        trainer_layout = {"devices": 1, "num_nodes": world_size, "plugins": [SimulatedRankEnvironment(world_size)]}

    L.seed_everything(int(recipe.get("seed") or 1337), verbose=False)
    checkpoint_dir = resolve_path(recipe["checkpoint_dir"])
    module = LitGPTFinetune(
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
    data = build_data(recipe, checkpoint_dir)
    quick = quick_from_env()  # the lab's runner sets it (quick_mode): the longest batch opens the second step
    if quick:
        put_longest_batch_in_second_step(data, int(train["micro_batch_size"]), accum)
    out_dir = args.out_dir or resolve_path(recipe.get("out_dir") or "out/multi")

    WatchChildren = _watch_children_callback(args, report)

    trainer = L.Trainer(
        accelerator="cuda" if on_cuda else "cpu",
        **trainer_layout,
        strategy=choice.strategy,
        precision=str(recipe.get("precision") or "32-true"),
        max_steps=max_steps,
        max_epochs=-1,  # the lab measures a fixed number of optimizer steps, however small the data set
        accumulate_grad_batches=accum,
        gradient_clip_val=train.get("max_norm"),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=not quick,  # quick mode's sampler gives each rank its share itself
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out_dir,
        callbacks=[
            WatchChildren(),
            ReportCallback(
                report,
                total_iterations=max_steps * accum,
                metrics_csv=_metrics_csv(out_dir, report.rank),
                warmup_steps=warmup_steps(max_steps, quick=quick),
            ),
            FreeTrainingStateAtEnd(),  # after the report: Lightning's teardown would copy it all to host memory
        ],
    )
    trainer.fit(module, datamodule=data)


def _watch_children_callback(args: argparse.Namespace, report) -> type:
    """The callback with which rank 0 watches the local ranks Lightning started (``peers``); every rank keeps the
    lab's SIGTERM handling and reports a dead or interrupted peer."""
    import lightning as L

    from lab_helpers.training import child_report
    from lab_helpers.training.distributed import peers

    class WatchChildren(L.Callback):
        """After Lightning has started the other local ranks, rank 0 watches them (see peers); every rank keeps
        the lab's SIGTERM handling.

        Often rank 0 learns of a dead peer first from its own collective failing (gloo: "Connection reset
        by peer"); then ``on_exception`` names the dead rank in rank 0's report and writes the dead rank's.
        """

        procs: list = []
        first_rank = 0

        def setup(self, trainer, pl_module, stage):
            self.procs = getattr(trainer.strategy.launcher, "procs", None) or []
            self.first_rank = trainer.node_rank * args.devices
            if self.procs and trainer.local_rank == 0:
                peers.watch_children(
                    self.procs,
                    lambda message: report.write("error", message),
                    on_dead_child=lambda local_rank, message: report_for_dead_rank(
                        self.first_rank + local_rank, message, report.fields
                    ),
                    is_interrupt=lambda: peers.was_terminated() or self._peers_interrupted(),
                )

        def on_train_start(self, trainer, pl_module):
            # Lightning installed its own SIGTERM handler just before the loop (it signals the children and runs a
            # broadcast inside the handler, which fails once a peer is gone): put back the lab's, which only
            # raises KeyboardInterrupt, so that an interrupt is reported as one
            if not peers.was_terminated():
                peers.sigterm_as_interrupt()

        def on_exception(self, trainer, pl_module, exception):
            if isinstance(exception, KeyboardInterrupt) or peers.was_terminated() or self._peers_interrupted():
                # every rank was interrupted: let them all report; this rank's failure is the interrupt too
                for local_rank in peers.let_children_finish(self.procs):
                    message = f"local rank {local_rank} was interrupted while waiting for its peers"
                    report_for_dead_rank(self.first_rank + local_rank, message, report.fields, status="interrupted")
                _, text = child_report.status_for_exception(exception)
                report.write("interrupted", f"interrupted; this rank then stopped with:\n{text[-1500:]}")
                return
            dead = peers.dead_children(self.procs, wait_s=2.0)
            for local_rank, message in dead:
                report_for_dead_rank(self.first_rank + local_rank, message, report.fields)
            if dead:
                _, text = child_report.status_for_exception(exception)
                # the dead peer last: the record's one-line reason is the error's last line
                report.write("error", f"{text[-1500:]}\nthis rank failed because {dead[0][1]}")

        def _peers_interrupted(self) -> bool:
            """A child rank already reported ``interrupted``: the collective this rank failed in was cut by it."""
            directory = child_report.report_dir()
            if not self.procs or directory is None:
                return False
            time.sleep(0.5)  # a peer that is exiting may still be writing its report
            reports = child_report.read_reports(directory)
            return any(
                reports.get(self.first_rank + i + 1, {}).get("status") == "interrupted" for i in range(len(self.procs))
            )
    return WatchChildren


@contextlib.contextmanager
def tensor_peak_on_cpu(on_cuda: bool):
    """On a CPU, count live tensor bytes over the whole process (``tensor_peak``: the CPU counterpart of
    max_memory_allocated; the report callback restarts the peak when the loop starts). None on CUDA, or where
    ``$LAB_TENSOR_PEAK`` is 0."""
    from lab_helpers.training.child_litgpt import TENSOR_PEAK_ENV

    if on_cuda or os.environ.get(TENSOR_PEAK_ENV) == "0":
        yield None
        return
    from lab_helpers.training.tensor_peak import LiveTensorPeak

    with LiveTensorPeak() as tensors:
        yield tensors


def _metrics_csv(out_dir: Path, rank: int) -> Path | None:
    """Where rank 0 writes its per-iteration rows: under ``out/logs`` like litgpt's CSV logger (run_record reads
    both). Other ranks write none: one run, one table."""
    return Path(out_dir) / "logs" / "lightning" / "metrics.csv" if rank == 0 else None


def report_for_dead_rank(rank: int, message: str, fields: dict[str, Any], *, status: str = "error") -> None:
    """Write the report of a rank that cannot write its own (killed, crashed, stuck), if it has none."""
    from lab_helpers.training import child_report

    directory = child_report.report_dir()
    if directory is None or (directory / f"rank{rank}.json").exists():
        return
    child_report.write_report(
        {
            "status": status,
            "error": f"{message} (reported by rank 0: this rank left no report)",
            "world_size": fields.get("world_size"),
            "strategy_used": fields.get("strategy_used"),
        },
        rank=rank,
    )


def build_data(recipe: dict[str, Any], checkpoint_dir: Path):
    """The recipe's litgpt data module (a LightningDataModule), connected to the model's tokenizer."""
    import importlib

    from litgpt.tokenizer import Tokenizer

    from lab_helpers.config.experiments import resolve_path

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


def _wants_cuda(accelerator: str) -> bool:
    if accelerator != "auto":
        return accelerator == "cuda"
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
