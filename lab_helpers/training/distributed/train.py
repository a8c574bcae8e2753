"""The multi-GPU section's training process: a litgpt recipe run by the Lightning Trainer with one strategy.

Lightning re-runs this module for local ranks 1..N-1, so everything it needs is in its arguments. Each rank writes
one report whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# only what is cheap: nothing here may import torch, lightning or deepspeed (see main)
from lab_helpers.config.recipe_defaults import FSDP_IMPLS
from lab_helpers.training.distributed import peers
from lab_helpers.training.distributed.strategies import SHARDINGS, STRATEGIES, WRAP_POLICIES
from lab_helpers.training.orphan_guard import die_with_parent, start_orphan_guard

if TYPE_CHECKING:
    from lab_helpers.training.distributed.reporting import RankReport


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
        "global batch / (micro batch x ranks); a DeepSpeed config's gradient_accumulation_steps must agree)",
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


def env_global_rank(devices: int) -> int:
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    return int(os.environ.get("NODE_RANK", 0)) * devices + int(os.environ.get("LOCAL_RANK", 0))


def main(argv: list[str] | None = None) -> int:
    launched_by_runner = "LOCAL_RANK" not in os.environ and os.environ.get("LAB_WATCH_PARENT") != "1"
    if launched_by_runner:  # first, before the seconds of imports: a kernel restart then must not leave us running
        die_with_parent()
    args = parse_args(argv)
    on_cuda = _wants_cuda(args.accelerator)
    if args.strategy.startswith("deepspeed") and not on_cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed
    # imported here, not at the top: reporting imports lightning and torch (the guard above comes first)
    from lab_helpers.training.distributed.reporting import RankReport

    # a simulated rank is one process really run: its report says world 1 (the record adds simulated_world_size)
    report = RankReport(rank=env_global_rank(args.devices), world_size=args.devices * args.num_nodes)
    peers.sigterm_as_interrupt()
    if not launched_by_runner:
        peers.watch_parent(lambda message: report.write("error", message))
    else:  # the process the runner started: if the runner dies (kernel restart), end the whole run
        start_orphan_guard()
    peers.without_lightning_observer()  # rank 0 watches its children itself (watch_children), reporting first
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


def run(args: argparse.Namespace, report: RankReport, *, on_cuda: bool) -> None:
    # imported here, not at the top: finetune imports lightning, torch and litgpt (deepspeed through them), which
    # must wait for main's orphan guard and DS_ACCELERATOR
    from lab_helpers.training.distributed.finetune import fit, setup_run

    setup = setup_run(args, report, on_cuda=on_cuda)
    fit(setup, report)


@contextlib.contextmanager
def tensor_peak_on_cpu(on_cuda: bool):
    """The CPU's counterpart of ``max_memory_allocated``."""
    # imported here: both modules import torch (main's guards come first)
    from lab_helpers.training.child_litgpt import TENSOR_PEAK_ENV

    if on_cuda or os.environ.get(TENSOR_PEAK_ENV) == "0":
        yield None
        return
    from lab_helpers.training.tensor_peak import LiveTensorPeak

    with LiveTensorPeak() as tensors:
        yield tensors


def _wants_cuda(accelerator: str) -> bool:
    if accelerator != "auto":
        return accelerator == "cuda"
    import torch  # here: only "auto" needs torch, and only after main's orphan guard

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
