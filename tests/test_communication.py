"""The per-optimizer-step byte counts of lab_helpers.planning.planner.communication, on the section-02 recipes' numbers.

The 4-GPU recipes (configs/experiments/multi.yaml on configs/gpu/open_llama_7b/full.yaml) run global batch 32 at
micro batch 4: 2 micro-batches per step on each of 4 GPUs. The parameter count is the real litgpt model's,
built on the meta device (no memory, no download). The FSDP counts are pinned for a = 1, 2, 4, both shardings,
both wrappings and both FSDPs, and checked against what torch really issues on its fake process group
(tests/fake_pg_collectives.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab_helpers.config.experiments import gradient_accumulation_steps, resolve
from lab_helpers.planning import arithmetic
from lab_helpers.planning.arithmetic import precision_bytes
from lab_helpers.planning.planner.communication import (
    communication_per_optimizer_step,
    host_device_bytes_per_optimizer_step,
)
from lab_helpers.planning.planner.errors import PlanError
from lab_helpers.planning.planner.spec import spec_from_recipe
from lab_helpers.planning.planner.timing import trainable_params

WORLD = 4  # LAB.md's reference node


def _volume(exp_id: str):
    """The volume of ``exp_id`` on the gpu profile at 4 GPUs, every number taken from its recipe."""
    run = resolve(exp_id, "gpu", check_files=False)
    spec = spec_from_recipe(run.recipe, devices=WORLD, strategy=run.experiment.strategy)
    sharding = run.options["sharding"] if run.experiment.strategy == "fsdp" else None
    return communication_per_optimizer_step(
        strategy=run.experiment.strategy,
        parameter_count=trainable_params(spec),
        bytes_per_parameter=precision_bytes(run.recipe["precision"]),
        world_size=WORLD,
        micro_batches_per_step=gradient_accumulation_steps(run.recipe, world_size=WORLD),
        sharding=sharding,
    ), run


OPEN_LLAMA_7B = 6_738_415_616  # parameters
OPEN_LLAMA_7B_ROOT = 2 * 32_000 * 4_096 + 4_096  # embedding, head, final norm: what no block holds


@pytest.mark.parametrize(("exp_id", "psi"), [("ddp", 2), ("fsdp", 5), ("fsdp-grad-op", 2)])
def test_psi_multiple_of_the_4_gpu_recipes(exp_id: str, psi: int) -> None:
    """With the root counted like a block (root_parameter_count's default 0), FSDP1 per block is (2a + 1)Ψ: 5Ψ at
    the recipes' a = 2; SHARD_GRAD_OP under no_sync 2Ψ; DDP 2Ψ."""
    volume, run = _volume(exp_id)
    assert gradient_accumulation_steps(run.recipe, world_size=WORLD) == 2  # the premise: 32 / (4 x 4)
    assert volume.psi_multiple == psi
    # ring collectives: each GPU sends (N-1)/N of every model-sized transfer
    assert volume.link_bytes_per_gpu == pytest.approx(psi * volume.psi_bytes * (WORLD - 1) / WORLD)
    assert volume.psi_bytes == 2 * OPEN_LLAMA_7B  # open_llama_7b's parameters in bf16


def test_arithmetic_counts_the_root_unit_the_wrapping_and_the_fsdp_that_runs() -> None:
    """The issue's done-when, as the code runs it: fsdp at a = 2 is (2a + 1)Ψ less the root unit's backward gather
    in each micro-batch (FSDP1 does not reshard the root after forward); fsdp-course (one unit, a = 1) 2Ψ."""
    root = OPEN_LLAMA_7B_ROOT / OPEN_LLAMA_7B
    fsdp, course, grad_op = (arithmetic.communication(e) for e in ("fsdp", "fsdp-course", "fsdp-grad-op"))
    assert arithmetic.count_params(str(_checkpoint("fsdp"))).outside_blocks == OPEN_LLAMA_7B_ROOT
    assert (fsdp.micro_batches, course.micro_batches, grad_op.micro_batches) == (2, 1, 2)
    assert fsdp.psi_multiple == pytest.approx(2 * 2 + 1 - 2 * root)  # 4.92
    assert fsdp.root_share == pytest.approx(root)
    assert (course.psi_multiple, grad_op.psi_multiple) == (2, 2)
    assert "(2a + 1)Ψ − aΨ_root at a = 2 = **4.92Ψ per optimizer step**" in fsdp.markdown()
    assert "(a + 1)Ψ at a = 1 = **2Ψ per optimizer step**" in course.markdown()
    assert "FSDP1" in fsdp.markdown() and "no_sync" in fsdp.markdown()
    # the CPU ranks run FSDP2, which reduce-scatters every micro-batch
    fsdp2 = arithmetic.communication("fsdp", fsdp_impl="fsdp2")
    assert fsdp2.psi_multiple == pytest.approx(3 * 2 - 2 * root) and "FSDP2" in fsdp2.markdown()
    assert arithmetic.communication("fsdp", profile="ci").volume.strategy.endswith("fsdp2)")


def _checkpoint(exp_id: str):
    from lab_helpers.config.experiments import resolve_path

    return resolve_path(resolve(exp_id, "gpu", check_files=False).recipe["checkpoint_dir"])


# (impl, sharding, wrapping) -> Ψ-multiple per optimizer step at a micro-batches with a root share r (per block)
PINNED = {
    ("fsdp1", "full", "block"): lambda a, r: 2 * a + 1 - a * r,  # no_sync: one reduce-scatter per step
    ("fsdp1", "full", "none"): lambda a, r: a + 1,  # the one unit gathered once per micro-batch
    ("fsdp1", "grad-op", "block"): lambda a, r: 2,  # kept whole from the first forward to the last backward
    ("fsdp1", "grad-op", "none"): lambda a, r: 2,
    ("fsdp2", "full", "block"): lambda a, r: 3 * a - a * r,  # no no_sync under the Trainer
    ("fsdp2", "full", "none"): lambda a, r: 2 * a,
    ("fsdp2", "grad-op", "block"): lambda a, r: 2 * a,
    ("fsdp2", "grad-op", "none"): lambda a, r: 2 * a,
}


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize(("impl", "sharding", "wrapping"), list(PINNED))
def test_fsdp_counts_per_optimizer_step(impl: str, sharding: str, wrapping: str, micro_batches: int) -> None:
    volume = communication_per_optimizer_step(
        strategy="fsdp", parameter_count=1000, bytes_per_parameter=2, world_size=4,
        micro_batches_per_step=micro_batches, sharding=sharding, wrapping=wrapping, root_parameter_count=100,
        fsdp_impl=impl,
    )  # fmt: skip
    expected = PINNED[impl, sharding, wrapping](micro_batches, 0.1)
    assert volume.psi_multiple == pytest.approx(expected)
    assert volume.link_bytes_per_gpu == pytest.approx(expected * 2000 * 3 / 4)
    reduce_scatters = sum(c.times_per_step for c in volume.collectives if c.name == "reduce-scatter")
    assert reduce_scatters == (1 if impl == "fsdp1" else micro_batches)


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_ddp_is_one_all_reduce_per_step(micro_batches: int) -> None:
    volume = communication_per_optimizer_step(
        strategy="ddp", parameter_count=1000, bytes_per_parameter=2, world_size=4, micro_batches_per_step=micro_batches
    )
    assert volume.psi_multiple == 2 and [c.name for c in volume.collectives] == ["all-reduce"]


def test_the_counts_are_what_torch_issues_on_a_fake_process_group() -> None:
    """A tiny litgpt model as rank 0 of 4 on torch's fake process group, wrapped and stepped as Lightning's Trainer
    does (FSDP1 accumulating under no_sync, FSDP2 without): every all-gather and reduce-scatter of one optimizer
    step counted, in elements, against this module's count for the same root share."""
    script = Path(__file__).with_name("fake_pg_collectives.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 2 * 2 * 2 * 3
    for row in rows:
        psi, root = row["parameters"], row["root_parameters"]
        volume = communication_per_optimizer_step(
            strategy="fsdp", parameter_count=psi, bytes_per_parameter=1, world_size=4,
            micro_batches_per_step=row["micro_batches"], sharding=row["sharding"], wrapping=row["wrap"],
            root_parameter_count=root, fsdp_impl=row["impl"],
        )  # fmt: skip
        for name in ("all-gather", "reduce-scatter"):
            counted = sum(c.size_bytes * c.times_per_step for c in volume.collectives if c.name == name)
            assert row["collectives"][name]["elements"] == counted, (row, name)
        assert "all-reduce" not in row["collectives"], row


def test_lightning_runs_fsdp1_accumulation_under_no_sync_and_fsdp2_without() -> None:
    """Lightning 2.6.6's ``ParallelStrategy.block_backward_sync`` enters ``self.model.no_sync()`` for any model with
    a ``no_sync`` method: FSDPStrategy's model is FSDP1's FullyShardedDataParallel (it has one);
    ModelParallelStrategy's is the LightningModule (none, and no ``set_requires_gradient_sync``)."""
    import contextlib

    from lightning.pytorch import LightningModule
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    entered = []

    class Stub:
        @contextlib.contextmanager
        def no_sync(self):
            entered.append(True)
            yield

    fsdp1 = FSDPStrategy()
    fsdp1.model = Stub()
    with fsdp1.block_backward_sync():
        pass
    assert entered == [True] and hasattr(FullyShardedDataParallel, "no_sync")
    fsdp2 = ModelParallelStrategy()
    fsdp2.model = LightningModule()
    with fsdp2.block_backward_sync():
        pass
    assert not hasattr(fsdp2.model, "no_sync") and not hasattr(fsdp2.model, "set_requires_gradient_sync")


def test_ddp_does_not_grow_with_accumulation_and_fsdp_does() -> None:
    kwargs = dict(parameter_count=1000, bytes_per_parameter=2, world_size=4)
    ddp = [communication_per_optimizer_step(strategy="ddp", micro_batches_per_step=m, **kwargs) for m in (1, 8)]
    fsdp = [communication_per_optimizer_step(strategy="fsdp", micro_batches_per_step=m, **kwargs) for m in (1, 8)]
    assert ddp[0].link_bytes_per_gpu == ddp[1].link_bytes_per_gpu == 2 * 2000 * 3 / 4
    assert fsdp[0].link_bytes_per_gpu == 3 * 2000 * 3 / 4  # (2a + 1)Ψ at a = 1
    assert fsdp[1].link_bytes_per_gpu == 17 * 2000 * 3 / 4  # at a = 8: the gathers grow, the reduce-scatter not


def test_deepspeed_stages() -> None:
    kwargs = dict(parameter_count=1000, bytes_per_parameter=2, world_size=4)
    zero2 = [communication_per_optimizer_step(strategy="deepspeed-zero2", micro_batches_per_step=m, **kwargs)
             for m in (1, 4)]
    zero3 = communication_per_optimizer_step(strategy="deepspeed-zero3", micro_batches_per_step=4, **kwargs)
    assert [v.psi_multiple for v in zero2] == [2, 5]  # reduce-scatter every backward + one all-gather per step
    assert zero3.psi_multiple == 12  # 3 per micro-batch, like FULL_SHARD


def test_single_and_one_device_send_nothing() -> None:
    for strategy, world in (("single", 1), ("fsdp", 1)):
        volume = communication_per_optimizer_step(
            strategy=strategy, parameter_count=1000, bytes_per_parameter=2, world_size=world, micro_batches_per_step=2
        )
        assert volume.link_bytes_per_gpu == 0 and volume.collectives == ()


def test_lora_reduces_only_its_adapters_gradients() -> None:
    kwargs = dict(parameter_count=1000, bytes_per_parameter=2, world_size=2, micro_batches_per_step=1)
    ddp = communication_per_optimizer_step(strategy="ddp", trainable_parameter_count=10, **kwargs)
    fsdp = communication_per_optimizer_step(strategy="fsdp", trainable_parameter_count=10, **kwargs)
    assert ddp.link_bytes_per_gpu == 2 * 20 / 2
    assert fsdp.link_bytes_per_gpu == (2 * 2000 + 20) / 2  # every weight is still gathered twice
    assert ddp.formula == fsdp.formula == ""  # the gradients' terms are not Ψ: no formula in Ψ


def test_offload_traffic_per_gpu() -> None:
    traffic = host_device_bytes_per_optimizer_step(
        trainable_parameter_count=1000, bytes_per_parameter=2, world_size=4, micro_batches_per_step=4
    )
    assert (traffic.device_to_host_bytes, traffic.host_to_device_bytes) == (2000, 500)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(strategy="tp"), "unknown strategy"),
        (dict(strategy="fsdp", sharding="hybrid"), "unknown FSDP sharding"),
        (dict(strategy="ddp", sharding="full"), "FSDP setting"),
        (dict(strategy="ddp", world_size=0), "world_size"),
        (dict(strategy="fsdp", wrapping="layer"), "unknown FSDP wrapping"),
        (dict(strategy="fsdp", fsdp_impl="fsdp3"), "unknown FSDP implementation"),
        (dict(strategy="fsdp", root_parameter_count=2000), "root_parameter_count"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs: dict, words: str) -> None:
    base = dict(parameter_count=1000, bytes_per_parameter=2, world_size=4, micro_batches_per_step=1)
    with pytest.raises(PlanError, match=words):
        communication_per_optimizer_step(**{**base, **kwargs})
