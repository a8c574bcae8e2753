"""A lab that fits a lease: each notebook's predicted minutes, and 01's core path."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from node_fixtures import node

from lab_helpers import node_plan
from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.experiments import get_experiment, load_experiments
from lab_helpers.config.paths import lab_home
from lab_helpers.present import lease


def test_the_core_path_is_about_half_of_01_and_keeps_every_pair():
    single = load_experiments("single")
    core = [e for e in single.values() if not e.optional]
    assert 0.4 <= len(core) / len(single) <= 0.6, [e.id for e in core]
    for experiment in core:  # a core run is compared with a core run: its pair is never skipped by the path
        assert experiment.pair is None or not get_experiment(experiment.pair).optional, experiment.id


def test_01s_headings_mark_exactly_the_optional_runs():
    cells = json.loads((lab_home() / "notebooks" / "01_single_gpu.ipynb").read_text())["cells"]
    headings = {}
    for cell in cells:
        first = "".join(cell["source"]).split("\n", 1)[0]
        match = re.match(r"## \d+ · `([\w-]+)`", first)
        if cell["cell_type"] == "markdown" and match:
            headings[match.group(1)] = first
    assert set(headings) == set(load_experiments("single"))
    for exp_id, heading in headings.items():
        assert heading.endswith("(optional)") == bool(get_experiment(exp_id).optional), heading


def test_the_core_path_skips_an_optional_run_saying_what_it_adds(monkeypatch):
    here = node("H100-80GB")
    step = node_plan.decide("pad-64", here, profile="gpu", path="core")
    assert not step.runs and step.expected_status == "skipped"
    assert get_experiment("pad-64").optional in step.sentence and "LAB_PATH=core" in step.sentence
    monkeypatch.setenv("LAB_PATH", "core")
    assert not node_plan.decide("pad-64", here, profile="gpu").runs  # the environment, where the cell passes none
    assert node_plan.decide("pad-64", here, profile="gpu", path="all").runs  # the cell's choice wins
    monkeypatch.setenv("LAB_PATH", "short")
    with pytest.raises(LabConfigError, match="LAB_PATH='short'"):
        lease.run_path()


def test_the_notebooks_decide_what_they_run():
    assert lease.decided_experiments("01_single_gpu") == list(load_experiments("single"))
    assert lease.decided_experiments("02_multi_gpu") == list(load_experiments("multi"))
    assert lease.decided_experiments("00_check_node") == []


def test_minutes_add_the_measured_cost_of_each_run_and_the_reading():
    """On a CPU node: every run at its ci row of the cost table (60 s without one), a skip at nothing, the reading
    at the notebook's Markdown words; the core path leaves out exactly the optional runs."""
    here = node("none")
    minutes = lease.notebook_minutes("01_single_gpu", here, profile="ci", path="all")
    costs = lease.run_costs_s("ci")
    assert not minutes.full_mode
    for exp_id, seconds in minutes.run_s.items():
        assert seconds == costs.get(exp_id, lease.UNLISTED_RUN_S)
    assert set(minutes.skipped) == {
        e for e in load_experiments("single") if not node_plan.decide(e, here, profile="ci").runs
    }
    assert set(minutes.optional_s) == {e for e in minutes.run_s if get_experiment(e).optional}
    assert minutes.core_total_min == pytest.approx(
        (sum(minutes.run_s.values()) - sum(minutes.optional_s.values())) / 60 + minutes.words / 200
    )
    line = minutes.words_line("this CPU")
    assert f"{len(minutes.run_s)} runs about {minutes.runs_min:.0f} min" in line
    assert f"{minutes.questions} questions" in line and "Core path" in line


@pytest.mark.slow
def test_the_minutes_command_prints_every_notebook_and_the_path(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "lab_helpers", "minutes", "--profile", "ci"],
        capture_output=True, text=True, check=True, cwd=lab_home(),
    ).stdout  # fmt: skip
    for notebook in (*lease.NOTEBOOKS, "all"):
        assert re.search(rf"^\s*{notebook}\s", out, flags=re.M), out
    assert lease.COSTS_FILE in out


def test_04s_path_cost_prices_the_minutes_the_notebooks_print():
    """One prediction of the path: 04's cost is each run's lease seconds x the GPUs it holds (a real rank each, a
    simulated rank one), at the user's price."""
    from lab_helpers.present import what_if

    here = node("none")
    cost = what_if.path_cost("ci", 2.5, node=here)
    for notebook in what_if.PATH_NOTEBOOKS:
        minutes = lease.notebook_minutes(notebook, here, profile="ci")
        for exp_id, seconds in minutes.run_s.items():
            run = cost.runs[exp_id]
            assert (run.seconds, run.gpus) == (seconds, minutes.gpus[exp_id])
            assert run.usd == pytest.approx(seconds * run.gpus * 2.5 / 3600)
    assert cost.runs["multi-node"].gpus == 2 and cost.runs["fsdp"].gpus == 1  # two CPU processes; a simulated rank
