"""litgpt's published LoRA times (lab_helpers.planning.planner.published), kept once: the time model's QLoRA ratio derives
from them, the settings read from the table reproduce its trainable parameters on litgpt's own model, and the rule
that turns a measured host-bound micro-batch into a per-launch cost (what benchmarks/planner_time_published.py and
``timing.fit_launch_cost`` fit with) is checked on a real trace."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from litgpt import Config

from lab_helpers.planning.planner import TrainingSpec
from lab_helpers.planning.planner.calibration import (
    HOST_BOUND_MARGIN,
    LITGPT_LORA_VS_NF4_MIN,
    QLORA_SPEED_RATIO,
    DeviceEfficiency,
    _device_s,
    host_bound_launch_cost,
    traced_ops,
)
from lab_helpers.planning.planner.published import (
    LITGPT_LORA_A100_GLOBAL_BATCH,
    LITGPT_LORA_A100_GPU,
    LITGPT_LORA_A100_LORA,
    LITGPT_LORA_A100_PRECISION,
    LITGPT_LORA_A100_ROWS,
    lora_vs_nf4_minutes,
)
from lab_helpers.planning.planner.tracer import trace

EFF = DeviceEfficiency(0.5, 0.56, "given")


def _row(name: str, quantize: str | None = None, micro: int = 1):
    return next(
        r
        for r in LITGPT_LORA_A100_ROWS
        if r.litgpt_name == name and r.quantize == quantize and r.micro_batch_size == micro
    )


def _spec(row, seq_len: int = 64, lora: dict | None = None) -> TrainingSpec:
    return TrainingSpec(
        model_config=Config.from_name(row.litgpt_name),
        method="qlora" if row.quantize else "lora",
        precision=LITGPT_LORA_A100_PRECISION,
        micro_batch_size=row.micro_batch_size,
        seq_len=seq_len,
        lora=LITGPT_LORA_A100_LORA if lora is None else lora,
        quantize=row.quantize,
        gradient_accumulation_iters=LITGPT_LORA_A100_GLOBAL_BATCH // row.micro_batch_size,
    )


def test_the_qlora_ratio_is_derived_from_the_published_rows():
    assert LITGPT_LORA_VS_NF4_MIN == lora_vs_nf4_minutes()
    assert LITGPT_LORA_VS_NF4_MIN == {
        "phi-1.5": (1.62, 1.77),
        "StableLM Alpha 3B": (1.24, 1.82),
        "Llama 2 7B": (2.36, 3.68),
        "Llama 2 13B": (3.19, 6.38),
    }
    assert QLORA_SPEED_RATIO == statistics.median(lora / nf4 for lora, nf4 in LITGPT_LORA_VS_NF4_MIN.values())
    assert len(LITGPT_LORA_A100_ROWS) == 13 and {r.micro_batch_size for r in LITGPT_LORA_A100_ROWS} == {1, 2, 4}
    assert _row("Llama-2-7b-hf", micro=2).seconds_per_iteration == pytest.approx(2.52 * 60 / 1000)


def test_the_tables_lora_settings_give_its_trainable_parameters():
    """LoRA r 8 on the query and value of litgpt's phi-1.5 has exactly the trainable parameters the table prints;
    LoRA on every layer, litgpt's newer recipes' choice, would not."""
    row = _row("phi-1_5")
    assert trace(_spec(row)).trainable_param_numel == row.trainable_parameters == 1_572_864
    every_layer = {**LITGPT_LORA_A100_LORA, "lora_key": True, "lora_projection": True, "lora_mlp": True}
    assert trace(_spec(row, lora=every_layer)).trainable_param_numel != row.trainable_parameters


def test_a_host_bound_micro_batch_gives_its_per_launch_cost_and_a_device_bound_one_none():
    row = _row("phi-1_5")
    spec = _spec(row)
    ops = traced_ops(spec, spec.seq_len)
    accumulation = spec.gradient_accumulation_iters
    device = (
        _device_s(ops.micro_batch, LITGPT_LORA_A100_GPU, EFF)
        + _device_s(ops.optimizer_step, LITGPT_LORA_A100_GPU, EFF) / accumulation
    )
    launches = ops.kernels_per_micro_batch() + ops.kernels_per_optimizer_step() / accumulation
    assert launches > 1000 and device > 0
    measured = 10 * HOST_BOUND_MARGIN * device
    assert host_bound_launch_cost(measured, ops, accumulation, LITGPT_LORA_A100_GPU, EFF) == pytest.approx(
        measured / launches
    )
    # explained by the device (within the margin): it says nothing about the host
    assert host_bound_launch_cost(device, ops, accumulation, LITGPT_LORA_A100_GPU, EFF) is None
    slower = dataclasses.replace(EFF, matmul=0.1, bandwidth=0.1)
    assert host_bound_launch_cost(measured / 10, ops, accumulation, LITGPT_LORA_A100_GPU, slower) is None
