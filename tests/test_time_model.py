"""The traced time model (issue 42): kernels, FLOPs and bytes read off traced ops (planner.op_costs), the roofline,
host = kernels x per-launch cost, a micro-batch = the larger of the two, and the per-launch measurement.

Small fixtures, exact arithmetic: every hardware figure is given, nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lab_helpers.hardware.gpu_peaks import dense_peaks, memory_bandwidth
from lab_helpers.planning.planner import spec_from_recipe
from lab_helpers.planning.planner.calibration import DeviceEfficiency, traced_model, traced_ops
from lab_helpers.planning.planner.op_costs import (
    FOREACH_CHUNK,
    FOREACH_MAX_BLOCKS,
    OpCost,
    OpCosts,
    _combine_ops,
    device_seconds,
    foreach_kernels,
    op_cost,
)
from lab_helpers.planning.planner.timing import predict_time

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "configs" / "ci"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def ci_assets():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)


def test_a_matmul_costs_its_flops_and_bytes_and_a_view_nothing():
    a, b = torch.ones(8, 16, dtype=torch.bfloat16), torch.ones(16, 4, dtype=torch.bfloat16)
    out = torch.mm(a, b)
    cost = op_cost(torch.ops.aten.mm.default, (a, b), {}, out)
    assert cost == OpCost("mm", "bf16", 2 * 8 * 16 * 4, (8 * 16 + 16 * 4 + 8 * 4) * 2, 1.0)
    assert op_cost(torch.ops.aten.t.default, (a,), {}, a.t()) is None
    assert op_cost(torch.ops.aten.view.default, (a, [128]), {}, a.view(128)) is None
    add = op_cost(torch.ops.aten.add.Tensor, (a, a), {}, a + a)
    assert add.flops == 0 and add.bytes == 3 * 8 * 16 * 2 and add.kernels == 1


def test_a_foreach_op_launches_per_packed_tensors_and_blocks():
    small = [torch.empty(10)] * 200
    assert foreach_kernels([small]) == 2  # depth 1: 110 tensors a launch
    assert foreach_kernels([small, small, small]) == 5  # depth 3: 48 a launch
    big = [torch.empty(FOREACH_MAX_BLOCKS * FOREACH_CHUNK * 2)]
    assert foreach_kernels([big]) == 2  # 640 blocks of 65,536 elements, 320 a launch
    assert foreach_kernels([]) == 0


def test_the_roofline_takes_the_larger_of_flops_and_bytes_per_op():
    matmul = OpCost("mm", "bf16", 1e12, 1e6, 1.0)  # compute-bound
    copy = OpCost("copy_", None, 0.0, 1e9, 1.0)  # memory-bound
    peaks = {"bf16": 1e15, "fp16": 1e15, "fp32_matmul": 5e14}
    seconds = device_seconds(
        ((matmul, 2.0), (copy, 3.0)), peaks=peaks, bandwidth=1e12, matmul_efficiency=0.5, bandwidth_efficiency=0.8
    )
    assert seconds == pytest.approx(2 * 1e12 / (1e15 * 0.5) + 3 * 1e9 / (1e12 * 0.8))


def test_two_traces_combine_op_by_op_or_as_multisets():
    a = ((OpCost("mm", "bf16", 10.0, 4.0, 1.0), 1.0), (OpCost("add", None, 0.0, 2.0, 1.0), 1.0))
    b = ((OpCost("mm", "bf16", 20.0, 6.0, 1.0), 1.0), (OpCost("add", None, 0.0, 4.0, 1.0), 1.0))
    combined, ok = _combine_ops(a, b, 2.0)  # same ops in the same order (another micro-batch size): per op
    assert ok and [(op.flops, op.bytes) for op, _ in combined] == [(30.0, 8.0), (0.0, 6.0)]
    block = OpCost("mm", "bf16", 10.0, 4.0, 1.0)
    head = OpCost("lm_head", "bf16", 5.0, 1.0, 1.0)
    one, two = ((block, 1.0), (head, 1.0)), ((block, 2.0), (head, 1.0))  # one and two blocks
    deep, ok = _combine_ops(one, two, 21.0)  # 22 blocks
    assert ok and dict(deep) == {block: 22.0, head: 1.0}


def test_the_gpu_table_has_a_bandwidth_for_every_gpu_with_peaks():
    from lab_helpers.hardware.gpu_peaks import _TABLE

    for _pattern, peak in _TABLE:
        if peak is not None:
            assert memory_bandwidth(peak.model if "RTX" not in peak.model else "NVIDIA " + peak.model), peak.model
    assert memory_bandwidth("NVIDIA A100-SXM4-40GB") == 1555e9 and memory_bandwidth("NVIDIA A100-SXM4-80GB") == 2039e9
    assert dense_peaks(H100)["bf16"] == pytest.approx(989.4e12)


def test_a_micro_batch_is_the_larger_of_host_and_device(ci_assets):
    spec = spec_from_recipe(CI / "ci-llama-xs" / "lora.yaml", device="cuda")
    eff = DeviceEfficiency(0.5, 0.5, "given")
    ops = traced_ops(spec, spec.seq_len)
    assert isinstance(ops, OpCosts) and ops.kernels_per_micro_batch() > 100
    slow = traced_model(spec, H100, spec.seq_len, launch_cost_s=1e-3, efficiency=eff)
    assert slow["host_s"] == pytest.approx(ops.kernels_per_micro_batch() * 1e-3)
    plan = predict_time(spec, gpu_name=H100, launch_cost_s=1e-3, device_efficiency=eff)
    assert plan.time_bound == "host" and plan.host_ms_per_micro_batch > plan.device_ms_per_micro_batch
    assert plan.micro_batch_s == pytest.approx(plan.host_ms_per_micro_batch / 1e3)
    assert plan.step_s == pytest.approx(
        plan.gradient_accumulation_iters * plan.micro_batch_s + plan.optimizer_step_ms / 1e3
    )
    assert plan.compute_s + plan.host_overhead_s + plan.communication_s + plan.offload_s == pytest.approx(plan.step_s)
    fast = predict_time(spec, gpu_name=H100, launch_cost_s=1e-12, device_efficiency=eff)
    assert fast.time_bound == "device" and fast.micro_batch_s == pytest.approx(fast.device_ms_per_micro_batch / 1e3)
    carried = json.loads(json.dumps(plan.to_dict()))
    for key in ("host_ms_per_micro_batch", "device_ms_per_micro_batch", "time_bound"):
        assert carried[key] == plan.to_dict()[key]
    assert "host-bound" in plan.summary() and "kernel launches" in plan.split()


def test_without_records_or_a_launch_cost_the_flops_model_answers(ci_assets):
    spec = spec_from_recipe(CI / "ci-llama-xs" / "lora.yaml", device="cuda")
    plan = predict_time(spec, gpu_name=H100, records=[])
    assert plan.time_bound is None and "assumption" in plan.mfu_source


def test_the_launch_cost_is_measured_on_the_cpu_and_kept_per_node(tmp_path, monkeypatch):
    from lab_helpers.planning import launch_cost

    monkeypatch.setattr(launch_cost, "REPEATS", 1)
    monkeypatch.setattr(launch_cost, "WARMUP", 1)
    result = launch_cost.measure(device="cpu", steps=2)
    assert result.device_name == "cpu" and result.kernels_per_step > 100 and 0 < result.launch_cost_s < 0.1
    path = launch_cost.save(result, tmp_path / "launch_cost.json")
    cost, source = launch_cost.measured_launch_cost("cpu", path)
    assert cost == result.launch_cost_s and "measured on this node" in source
    assert launch_cost.measured_launch_cost("NVIDIA H100 80GB HBM3", path) == (None, None)


def test_the_doctor_reports_the_launch_cost_or_says_it_was_not_measured(tmp_path, monkeypatch):
    from lab_helpers.planning import launch_cost
    from lab_helpers.present import doctor

    monkeypatch.setattr(launch_cost, "launch_cost_path", lambda: tmp_path / "launch_cost.json")
    assert "not measured on this node" in "\n".join(doctor._launch_cost_lines([]))
    launch_cost.save(
        launch_cost.LaunchCostResult(
            launch_cost.platform.node(), "cpu", 42e-6, 250.0, 2, torch.__version__, "2026-11-26T00:00:00"
        )
    )
    assert "42.0 us" in "\n".join(doctor._launch_cost_lines([]))
