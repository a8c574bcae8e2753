"""The numbers issue 43 took out of the notebooks' prose, computed from the data instead: which reference a node
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
    """Issue 43: in the H100's quick-mode records grad-accum took 2 steps and 64 samples, small-batch 6 and 48."""
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
    shipped GPU records: the tokens/s and the verdict follow the records, and the node's own GPU runs come first."""
    import pandas as pd

    h200 = tables.load_reference("h200-141gb")
    latest = tables.latest_runs(h200, profile="gpu").set_index("experiment")
    lora, full = (float(latest.loc[e, "tokens_per_s"]) for e in ("lora-1b", "full-7b"))
    words = tables.speed_words("lora-1b", "full-7b")
    verdict = "faster" if lora > full else "slower"
    assert f"h200-141gb: lora-1b {lora:,.0f} tokens/s, full-7b {full:,.0f}: lora-1b {verdict}" in words
    assert "GPU busy" in words and "ci-cpu" not in words  # a CPU record has no GPU speed to compare
    mine = pd.DataFrame([
        {"experiment": "lora-1b", "profile": "gpu", "status": "ok", "tokens_per_s": 200.0, "run_id": "a",
         "started_at": "2026-11-26T10:00:00+00:00"},
        {"experiment": "full-7b", "profile": "gpu", "status": "ok", "tokens_per_s": 100.0, "run_id": "b",
         "started_at": "2026-11-26T10:01:00+00:00"},
    ])  # fmt: skip
    assert tables.speed_words("lora-1b", "full-7b", mine).splitlines()[1].startswith("  this node: lora-1b 200")
    assert tables.speed_words("lora-1b", "no-such-run") == "no GPU records of both lora-1b and no-such-run yet"
