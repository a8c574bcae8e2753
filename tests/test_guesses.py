"""Guess first (lab_helpers.present.guesses): the student's number beside the planner's and the measurement, on records
the lab really wrote (the shipped reference results: a CPU run and an H100 run)."""

from __future__ import annotations

import math

import pytest

from lab_helpers.present.guesses import check_guess, guess_table
from lab_helpers.present.tables import load_reference


def _records(name: str, exp_id: str) -> list[dict]:
    df = load_reference(name)
    return df[df["experiment"] == exp_id].tail(1).to_dict("records")


def test_a_guess_sits_beside_the_prediction_and_the_cpu_measurement():
    records = _records("ci-cpu", "bf16-true")
    [row] = guess_table(records, 0.5).to_dict("records")
    measured = records[0]["peak_tensor_gib"]
    assert row["measured_as"] == "peak_tensor_gib" and row["measured_peak_gib"] == pytest.approx(measured)
    assert row["predicted_peak_alloc_gib"] == pytest.approx(records[0]["predicted_peak_alloc_gib"])
    assert row["guess_off_pct"] == pytest.approx(100 * (0.5 - measured) / measured)


def test_on_a_gpu_the_guess_is_compared_with_max_memory_allocated():
    records = _records("h100-80gb", "baseline")
    [row] = guess_table(records, 40).to_dict("records")
    assert row["measured_as"] == "peak_alloc_gib" and row["measured_peak_gib"] == pytest.approx(records[0]["peak_alloc_gib"])
    assert row["status"] == records[0]["status"]


def test_no_guess_leaves_the_guess_columns_empty_never_zero():
    [row] = guess_table(_records("ci-cpu", "baseline"), None).to_dict("records")
    assert math.isnan(row["your_guess_gib"]) and math.isnan(row["guess_off_pct"])
    assert row["measured_peak_gib"] > 0


@pytest.mark.parametrize("bad", ["40", -1, 0, True])
def test_a_guess_that_is_not_a_positive_number_says_so_in_one_line(bad):
    with pytest.raises(ValueError, match="a guess is a number of GiB above 0"):
        check_guess(bad)
