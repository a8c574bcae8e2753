"""``predict.oom_demo_overrides`` keeps the course's batch on the course's GPU: a prediction within the
planner's error of the GPU's size is no "fits", so baseline stays at micro batch 32 on any 79-80 GiB GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lab_helpers.planning import predict
from lab_helpers.planning.planner.fit import DEFAULT_MARGIN


def _planner_predicting(used_gib: float, calls: list):
    """Stand-in for ``predict.plan_for``: every plan predicts ``used_gib`` GiB used (a CPU has no GPU planner)."""

    def plan_for(run, gpu_gib, *, device=None):
        calls.append(run.recipe["train"]["micro_batch_size"])
        used = used_gib * run.recipe["train"]["micro_batch_size"] / 32  # activations grow with the batch
        return SimpleNamespace(gpu_used_gib=used, summary=lambda: f"{used:.2f} GiB used")

    return plan_for


def test_the_margin_is_the_planners_error():
    assert predict.COURSE_BATCH_FITS_MARGIN == DEFAULT_MARGIN


@pytest.mark.parametrize("gpu_gib", [79.0, 79.19, 79.5, 79.7, 80.0])
@pytest.mark.parametrize("short_gib", [0.06, 1.0, 3.0])
def test_baseline_keeps_micro_batch_32_on_any_79_to_80_gib_gpu(monkeypatch, gpu_gib, short_gib):
    """The H100's case: predicted 0.06 GiB under its 79.19 GiB (and up to 3 GiB under: still inside 5 %)."""
    calls: list = []
    monkeypatch.setattr(predict, "plan_for", _planner_predicting(gpu_gib - short_gib, calls))
    overrides, why = predict.oom_demo_overrides("baseline", profile="gpu", gpu_memory_gib=gpu_gib, device="cuda")
    assert overrides == {} and calls == [32], (overrides, calls)
    assert why.startswith("runs as the course defines it") and "within the planner's 5% error" in why


def test_a_gpu_that_holds_the_course_batch_beyond_the_margin_still_gets_a_raised_batch(monkeypatch):
    """The H200's case: predicted far under 141 GiB, the batch is raised until the prediction is an OOM."""
    calls: list = []
    monkeypatch.setattr(predict, "plan_for", _planner_predicting(79.13, calls))
    overrides, why = predict.oom_demo_overrides("baseline", profile="gpu", gpu_memory_gib=141.0, device="cuda")
    assert overrides["train.micro_batch_size"] > 32 and "will not fit" in why, why
    assert 79.13 * overrides["train.micro_batch_size"] / 32 >= 141.0 * (1 + predict.OOM_DEMO_MARGIN)
