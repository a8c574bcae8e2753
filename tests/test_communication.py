"""The per-optimizer-step byte counts of lab_helpers.planning.planner.communication, on the section-02 recipes' numbers.

The 4-GPU recipes (configs/experiments/multi.yaml on configs/gpu/open_llama_7b/full.yaml) run global batch 32 at
micro batch 4: 2 micro-batches per step on each of 4 GPUs. The parameter count is the real litgpt model's,
built on the meta device (no memory, no download)."""

from __future__ import annotations

import pytest

from lab_helpers.config.experiments import gradient_accumulation_steps, resolve
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


@pytest.mark.parametrize(("exp_id", "psi"), [("ddp", 2), ("fsdp", 6), ("fsdp-grad-op", 4)])
def test_psi_multiple_of_the_4_gpu_recipes(exp_id: str, psi: int) -> None:
    volume, run = _volume(exp_id)
    assert gradient_accumulation_steps(run.recipe, world_size=WORLD) == 2  # the premise: 32 / (4 x 4)
    assert volume.psi_multiple == psi
    # ring collectives: each GPU sends (N-1)/N of every model-sized transfer
    assert volume.link_bytes_per_gpu == pytest.approx(psi * volume.psi_bytes * (WORLD - 1) / WORLD)
    assert volume.psi_bytes == 2 * 6_738_415_616  # open_llama_7b's parameters in bf16


def test_ddp_does_not_grow_with_accumulation_and_fsdp_does() -> None:
    kwargs = dict(parameter_count=1000, bytes_per_parameter=2, world_size=4)
    ddp = [communication_per_optimizer_step(strategy="ddp", micro_batches_per_step=m, **kwargs) for m in (1, 8)]
    fsdp = [communication_per_optimizer_step(strategy="fsdp", micro_batches_per_step=m, **kwargs) for m in (1, 8)]
    assert ddp[0].link_bytes_per_gpu == ddp[1].link_bytes_per_gpu == 2 * 2000 * 3 / 4
    assert fsdp[1].link_bytes_per_gpu == 8 * fsdp[0].link_bytes_per_gpu == 8 * 3 * 2000 * 3 / 4


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
    ],
)
def test_bad_input_is_one_clear_error(kwargs: dict, words: str) -> None:
    base = dict(parameter_count=1000, bytes_per_parameter=2, world_size=4, micro_batches_per_step=1)
    with pytest.raises(PlanError, match=words):
        communication_per_optimizer_step(**{**base, **kwargs})
