"""Cost: ``plan --time --usd-per-gpu-hour`` prices the predicted run, ``compare --usd-per-gpu-hour``
adds the measured cost column, 04 prices the notebook path; one formula (``planning.cost.cost_usd``), no price
of the lab's own."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from lab_helpers.planning.cost import RunCost, checked_price, cost_usd
from lab_helpers.present import tables, what_if
from lab_helpers.present.what_if import PathCost
from lab_helpers.record.records import append_record, load_results

PRICE = 2.75  # a test's price, not the lab's: the lab has none
BAD_PRICES = ("-1", "0", "abc", "nan", "inf", "1e308", "")


def _cli(*args: str, quick: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "LAB_PROFILE": "ci", "LAB_QUICK": quick, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lab_helpers", *args], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


def test_cost_is_seconds_x_gpus_x_price_per_hour():
    assert cost_usd(3600, 1, PRICE) == PRICE
    assert math.isclose(cost_usd(90, 4, PRICE), 90 * 4 * PRICE / 3600)
    run = RunCost(90, 4, "test", PRICE)
    assert math.isclose(run.usd, cost_usd(90, 4, PRICE)) and math.isclose(run.gpu_hours, 0.1)
    assert RunCost(90, 4, "test").usd is None and "$" not in RunCost(90, 4, "test").words()


@pytest.mark.parametrize("bad", [*BAD_PRICES, None, True])
def test_a_bad_price_is_one_line_naming_its_source(bad):
    with pytest.raises(ValueError, match=r"^--usd-per-gpu-hour must be .* a number above 0") as err:
        checked_price(bad)
    assert "\n" not in str(err.value)
    assert checked_price("2.5") == 2.5


# ------------------------------------------------------------------------------------------------ plan


@pytest.mark.slow  # two real plans of the ci profile (a trace each): ~15 s on 2 cores
@pytest.mark.parametrize("exp_id, gpus", [("lora-1b", 1), ("fsdp", 2)])
def test_plan_prices_its_predicted_run_as_steps_x_step_time_x_gpus_x_price(ci_assets, exp_id, gpus):
    done = _cli("plan", exp_id, "--profile", "ci", "--time", "--usd-per-gpu-hour", str(PRICE), "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    cost, step_s = plan["cost"], plan["time"]["step_s"]
    steps = 2  # the ci recipes' max_steps, not quick mode (LAB_QUICK=0)
    assert cost["gpus"] == gpus == plan["time"]["devices"]
    assert math.isclose(cost["seconds"], steps * step_s)
    assert math.isclose(cost["cost_usd"], steps * step_s * gpus * PRICE / 3600)
    assert cost["usd_per_gpu_hour"] == PRICE and "training steps only" in cost["what"]


@pytest.mark.slow  # one real plan with the price and one without: ~15 s on 2 cores
def test_plan_prints_the_cost_only_when_a_price_is_given(ci_assets):
    priced = _cli("plan", "lora-1b", "--profile", "ci", "--time", "--usd-per-gpu-hour", str(PRICE))
    assert priced.returncode == 0, priced.stderr
    [line] = [line for line in priced.stdout.splitlines() if line.startswith("  cost: ")]
    assert "x 1 GPU(s)" in line and f"x ${PRICE:g} per GPU-hour = $" in line, line
    plain = _cli("plan", "lora-1b", "--profile", "ci", "--time", "--json")
    assert plain.returncode == 0, plain.stderr
    assert "cost" not in json.loads(plain.stdout) and "$" not in plain.stdout


@pytest.mark.parametrize("bad", BAD_PRICES)
def test_plan_refuses_a_bad_price_in_one_line(bad):
    done = _cli("plan", "lora-1b", "--profile", "ci", "--time", f"--usd-per-gpu-hour={bad}")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: --usd-per-gpu-hour must be") and done.stderr.count("\n") == 1, done.stderr


def test_plan_prices_only_a_time_prediction():
    done = _cli("plan", "lora-1b", "--profile", "ci", "--usd-per-gpu-hour", str(PRICE))
    assert done.returncode == 2
    assert done.stderr == "error: --usd-per-gpu-hour is an input of the time prediction: add --time\n"


# ------------------------------------------------------------------------------------------------ compare


def _rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow  # compare draws its figures twice: ~20 s on 2 cores
def test_compare_adds_the_measured_cost_column_only_with_a_price(tmp_path):
    priced_dir, plain_dir = tmp_path / "priced", tmp_path / "plain"
    priced = _cli("compare", "--reference", "ci-cpu", "--out", str(priced_dir), "--usd-per-gpu-hour", str(PRICE))
    assert priced.returncode == 0, priced.stderr
    assert "cost USD" in priced.stdout.splitlines()[1], priced.stdout  # the header, after the reference's label
    assert f"x ${PRICE:g} per GPU-hour / 3,600 s" in priced.stdout
    records = tables.latest_runs(tables.load_reference("ci-cpu")).to_dict("records")
    wall = {r["experiment"]: r["wall_s"] * (r.get("world_size") or 1) for r in records if r["wall_s"] > 0}  # NaN: no
    rows = _rows(priced_dir / "comparison.csv")
    assert {row["experiment"] for row in rows if row["cost_usd"]} == set(wall)
    for row in rows:
        if row["cost_usd"]:
            assert math.isclose(float(row["cost_usd"]), wall[row["experiment"]] * PRICE / 3600), row
    markdown = _cli("compare", "--reference", "ci-cpu", "--out", str(priced_dir), "--markdown",
                    "--usd-per-gpu-hour", str(PRICE))  # fmt: skip
    assert "| experiment | status | cost USD |" in markdown.stdout, markdown.stdout

    plain = _cli("compare", "--reference", "ci-cpu", "--out", str(plain_dir))
    assert plain.returncode == 0, plain.stderr
    assert "cost" not in plain.stdout.lower() and "cost_usd" not in _rows(plain_dir / "comparison.csv")[0]


@pytest.mark.parametrize("bad", BAD_PRICES)
def test_compare_refuses_a_bad_price_in_one_line(bad, tmp_path):
    done = _cli("compare", "--reference", "ci-cpu", "--out", str(tmp_path), f"--usd-per-gpu-hour={bad}")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: --usd-per-gpu-hour must be") and done.stderr.count("\n") == 1, done.stderr


def test_the_cost_column_counts_the_gpus_a_run_held(tmp_path):
    """Four real ranks hold four GPUs (rank 0's wall_s x 4); a simulated rank holds one; no wall_s, no cost."""
    path = tmp_path / "runs.jsonl"
    common = {"status": "ok", "started_at": "2026-01-01T10:00:00+00:00", "profile": "gpu"}
    for rank in range(4):
        append_record({**common, "experiment": "ddp", "rank": rank, "world_size": 4, "wall_s": 100.0 + rank}, path=path)
    append_record({**common, "experiment": "fsdp", "rank": 0, "world_size": 1, "simulated_world_size": 4,
                   "wall_s": 50.0}, path=path)  # fmt: skip
    append_record({**common, "experiment": "baseline", "status": "skipped"}, path=path)
    table = tables.comparison_table(load_results(path), usd_per_gpu_hour=PRICE)
    cost = dict(zip(table["experiment"], table["cost_usd"], strict=True))
    assert math.isclose(cost["ddp"], 100.0 * 4 * PRICE / 3600)
    assert math.isclose(cost[next(e for e in cost if e.startswith("fsdp"))], 50.0 * PRICE / 3600)
    assert math.isnan(cost["baseline"])
    assert list(table.columns)[:3] == ["experiment", "status", "cost_usd"]
    assert "cost_usd" not in tables.comparison_table(load_results(path)).columns


# ------------------------------------------------------------------------------------------------ 04's path


def test_the_path_sums_its_runs_and_names_no_price_of_its_own():
    runs = {"a": RunCost(1800, 1, "test", PRICE), "b": RunCost(900, 2, "test", PRICE)}
    priced = PathCost("gpu", PRICE, ("a", runs["a"], ""), runs)
    assert math.isclose(priced.gpu_hours, 1.0) and math.isclose(priced.usd, PRICE)
    assert f"= 1 GPU-hours x ${PRICE:g} per GPU-hour = ${PRICE:,.2f}" in priced.text(), priced.text()
    unpriced = PathCost("gpu", None, ("a", RunCost(1800, 1, "test"), ""), {k: RunCost(r.seconds, r.gpus, "test")
                                                                             for k, r in runs.items()})  # fmt: skip
    assert unpriced.usd is None and "$" not in unpriced.text() and "USD_PER_GPU_HOUR" in unpriced.text()


def test_the_path_refuses_a_bad_price_before_predicting_anything():
    with pytest.raises(ValueError, match="^USD_PER_GPU_HOUR must be"):
        what_if.path_cost("ci", -1)
