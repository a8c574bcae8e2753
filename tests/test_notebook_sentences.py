"""The numbers a review took out of the notebooks' prose, computed from the data instead: which reference a node
reads, what MFU to expect, what small-batch and grad-accum timed, an offload's one host figure, and whether
activations scale with the batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from node_fixtures import node

from lab_helpers import node_plan
from lab_helpers.config.experiments import resolve
from lab_helpers.planning import arithmetic, node_limits
from lab_helpers.planning.planner.calibration import DEFAULT_MFU
from lab_helpers.present import tables


def test_a_node_reads_its_own_gpus_reference_else_the_ci_runs():
    shipped = tables.shipped_references()
    assert {"h100-80gb", "h200-141gb", "ci-cpu"} <= set(shipped)
    assert tables.reference_for(node("H100-80GB")) == "h100-80gb"
    assert tables.reference_for(node("4xH100")) == "h100-80gb"
    assert tables.reference_for(node("H200-141GB")) == "h200-141gb"
    assert tables.reference_for(node("A10G-24GB")) == "ci-cpu"  # no A10G reference is shipped
    assert tables.reference_for(node("none")) == "ci-cpu"


def test_expected_mfu_is_the_time_models_assumption_beside_what_the_references_measured():
    words = tables.mfu_words()
    assert all(f"{method} {mfu:.2f}" in words for method, mfu in DEFAULT_MFU.items())
    assert "h100-80gb 0.02-" in words and "h200-141gb" in words and "ci-cpu" not in words  # a CPU has no MFU
    assert "0.3 to 0.5" not in words


def test_steps_and_samples_of_the_h100_quick_runs():
    """In the H100's quick-mode records grad-accum took 2 steps and 64 samples, small-batch 6 and 48."""
    table = tables.steps_and_samples(tables.load_reference("h100-80gb"), ["small-batch", "grad-accum"])
    rows = table.set_index("experiment")
    assert (rows.loc["grad-accum", "optimizer_steps"], rows.loc["grad-accum", "samples"]) == (2, 64)
    assert (rows.loc["small-batch", "optimizer_steps"], rows.loc["small-batch", "samples"]) == (6, 48)


@pytest.mark.parametrize("name", ["4xH100", "H100-80GB"])
def test_an_offload_has_one_host_figure_the_gates(name):
    step = node_plan.decide("deepspeed-offload", node(name), profile="gpu")
    words = node_plan.offload_words(step, node(name))
    run = resolve("deepspeed-offload", "gpu", step.overrides, check_files=False)
    need = node_limits.offload_fit(run, node(name)).need_gib
    assert f"host RAM {need:.1f} GiB" in words and "fp32 gradient partitions" in words
    accumulate = "accumulate 4 on 4 rank(s)" if name == "4xH100" else "accumulate 16 on 1 rank(s)"
    assert accumulate in words, words


def test_activation_ratio_reads_both_plans():
    small = SimpleNamespace(breakdown_gib={"activations": 3.0}, micro_batch_size=8)
    big = SimpleNamespace(breakdown_gib={"activations": 12.0}, micro_batch_size=32)
    words = arithmetic.activation_ratio(small, big, names=("small-batch", "baseline"))
    assert "= 0.250; micro batches 0.250" in words


def test_speed_words_say_what_the_gpu_records_measured_and_which_was_faster():
    """01's speed sentences (bf16-true against fp32, a 1.1B LoRA against a full 7B, fill-gpu) come from the
    shipped GPU records by the lab's one rule (speed_pairs.compare): ms per sample, the interval, and a verdict only
    beyond it; the node's own GPU runs come first."""
    import pandas as pd

    from lab_helpers.present.speed_pairs import compare
    from lab_helpers.record.records import conformed

    h200 = tables.load_reference("h200-141gb")
    verdict = compare([r for r in h200.to_dict("records") if r.get("profile") == "gpu"], "lora-1b", "full-7b")
    words = tables.speed_words("lora-1b", "full-7b")
    assert f"h200-141gb: {verdict.words()}" in words and "lora-1b slower" not in words  # 26 % apart between runs
    assert "GPU busy" in words and "ci-cpu" not in words  # a CPU record has no GPU speed to compare

    def run(exp: str, seconds: float, run_id: str) -> dict:
        rows = [{"iter": i, "iter_time_s": seconds * (1 + 0.01 * (i % 3)), "tokens": 10.0 * i} for i in range(1, 9)]
        return conformed({"experiment": exp, "profile": "gpu", "status": "ok", "run_id": run_id, "rank": None,
                          "device_name": "NVIDIA H200", "warmup_iterations": 2, "train_s": 6 * seconds,
                          "iterations": 6, "config": {"train": {"micro_batch_size": 4}}, "per_iteration": rows})  # fmt: skip

    mine = pd.DataFrame([run("lora-1b", 0.1, "a"), run("full-7b", 0.2, "b")])
    first = tables.speed_words("lora-1b", "full-7b", mine).splitlines()[1]
    assert first.startswith("  this node: lora-1b 25.2 ms/sample against full-7b 50.5") and first.endswith("lora-1b faster")
    assert tables.speed_words("lora-1b", "no-such-run") == "no GPU records of both lora-1b and no-such-run yet"


def test_the_profiler_exercise_reads_a_gpus_profile_from_the_shipped_records():
    """03's profiler exercise on a node without a GPU: the shipped reference that holds a profiled run (the H200's),
    its figures the record's own, and the regime by the lab's bound rule on the profile's device-idle share."""
    from lab_helpers.record.time_bound import band

    name, record = tables.reference_trace("small-batch", node("none"))
    assert name == "h200-141gb" and record["experiment"] == "small-batch"  # ci-cpu, a CPU's file, has none
    summary = record["torch_profile_summary"]
    words = tables.trace_words(record, where=name)
    busy, idle, kernels = (summary[k] for k in ("device_busy_ms_per_step", "device_idle_pct", "kernels_per_step"))
    assert f"device busy {busy:.1f} ms: idle {idle:.0f} % of the step" in words
    assert f"{kernels:,.0f} kernels launched, {1e3 * busy / kernels:.0f} us" in words
    table = tables.trace_table(record)
    assert list(table.columns) == ["op", "kind", "calls_per_step", "self_device_ms_per_step"]
    assert table.iloc[0]["op"] == "aten::mm" and set(table["kind"]) == {"op", "kernel", "range"}
    bound, regime = tables.trace_regime(record)
    assert bound == band(100 - idle) and regime.startswith(tables.REGIME_WORDS[bound])
    assert tables.trace_words(None) == "this node: no profiled run"
