"""How long a notebook takes on this node, said before anything runs: a lease is 2-3 hours and every GPU minute costs
money. A run's seconds are its measured cost in the GPU sessions' chunk logs (``configs/gpu-chunk-costs.tsv``, quick
mode), plus in full mode the time model's steps; reading comes from the notebook's own words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lab_helpers.config.paths import lab_home

COSTS_FILE = "configs/gpu-chunk-costs.tsv"
UNLISTED_RUN_S = 60.0
"""A run with no row in the cost table: the table's own rule (``scripts/gpu-chunk.sh`` starts such a step with 60 s)."""
READING_WORDS_PER_MINUTE = 200
"""An assumption, printed with the figure: a careful reading of technical prose, not a skim."""
NOTEBOOKS = ("00_check_node", "01_single_gpu", "02_multi_gpu", "03_compare", "04_what_if")
PATH_ENV = "LAB_PATH"
PATHS = ("all", "core")


def run_path(value: str | None = None) -> str:
    """``core`` is for a short lease: the experiments marked ``optional:`` are recorded skipped."""
    import os

    from lab_helpers.config.config_error import LabConfigError

    chosen = (value if value is not None else os.environ.get(PATH_ENV, "")).strip().lower() or "all"
    if chosen not in PATHS:
        source = "RUN_PATH" if value is not None else PATH_ENV
        raise LabConfigError(f"{source}={chosen!r}: give 'core' (the core runs only) or 'all'")
    return chosen


def core_path_skip(exp_id: str, path: str | None = None) -> str | None:
    """Why ``exp_id`` is skipped on this path (an optional run on the core path, with what it adds), or None."""
    from lab_helpers.config.experiments import get_experiment

    optional = get_experiment(exp_id).optional
    if optional and run_path(path) == "core":
        return f"optional, skipped on the core path ({PATH_ENV}=core); it adds {optional}"
    return None


def run_costs_s(profile: str) -> dict[str, float]:
    costs = {}
    for line in (lab_home() / COSTS_FILE).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        step, row_profile, seconds, *_ = line.split("\t")
        if row_profile == profile and "+" not in step:  # "lora-1b+trace": a profiled run, not the plain one
            costs[step] = float(seconds)
    return costs


def notebook_cells(notebook: str) -> list[dict]:
    return json.loads((lab_home() / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]


def prose_words(notebook: str) -> int:
    """Markdown cells only: code and its comments are run, not read."""
    return sum(len("".join(c["source"]).split()) for c in notebook_cells(notebook) if c["cell_type"] == "markdown")


def question_count(notebook: str) -> int:
    return sum(
        "**Question.**" in "".join(c["source"]) for c in notebook_cells(notebook) if c["cell_type"] == "markdown"
    )


def decided_experiments(notebook: str) -> list[str]:
    """``node_plan.decide("ID", ...)``, or a name set to a string first; loops over ids are checks, not runs."""
    names: dict[str, str] = {}
    found: list[str] = []
    for cell in notebook_cells(notebook):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        names.update(re.findall(r"^(\w+) = \"([\w-]+)\"", source, flags=re.M))
        for argument in re.findall(r"node_plan\.decide\(\s*([\"\w-]+)", source):
            exp_id = argument.strip('"') if argument.startswith('"') else names.get(argument)
            if exp_id and exp_id not in found:
                found.append(exp_id)
    return found


@dataclass
class NotebookMinutes:
    """One notebook's predicted minutes on one node: runs, reading, and how many questions."""

    notebook: str
    run_s: dict[str, float] = field(default_factory=dict)  # experiment -> predicted seconds (runs only)
    gpus: dict[str, int] = field(default_factory=dict)  # experiment -> GPUs it holds (a simulated rank: 1)
    skipped: list[str] = field(default_factory=list)  # decided not to run here (a record says why)
    optional_s: dict[str, float] = field(default_factory=dict)  # of run_s: the runs off the core path
    words: int = 0
    questions: int = 0
    full_mode: bool = False  # the course's micro-batches were added at the time model's step

    @property
    def runs_min(self) -> float:
        return sum(self.run_s.values()) / 60

    @property
    def core_runs_min(self) -> float:
        return (sum(self.run_s.values()) - sum(self.optional_s.values())) / 60

    @property
    def reading_min(self) -> float:
        return self.words / READING_WORDS_PER_MINUTE

    @property
    def total_min(self) -> float:
        return self.runs_min + self.reading_min

    @property
    def core_total_min(self) -> float:
        return self.core_runs_min + self.reading_min

    def words_line(self, where: str) -> str:
        """The sentence at the notebook's top."""
        how = f"each run's cost as measured in quick mode, {COSTS_FILE}"
        if self.full_mode:
            how += ", plus the course's micro-batches at the time model's step"
        runs = f"{_count(len(self.run_s), 'run')} about {self.runs_min:.0f} min ({how})" if self.run_s else "no runs"
        skipped = f", {len(self.skipped)} skipped here" if self.skipped else ""
        line = (
            f"{self.notebook} on {where}: about {self.total_min:.0f} min = {runs}{skipped} + reading about "
            f"{self.reading_min:.0f} min ({self.words:,} words at {READING_WORDS_PER_MINUTE} a minute)"
        )
        if self.questions:
            line += f"; {_count(self.questions, 'question')} (answer them after the lease if time is short)"
        if self.optional_s:
            line += (
                f". Core path (LAB_PATH=core skips {len(self.optional_s)} optional runs): about "
                f"{self.core_total_min:.0f} min"
            )
        return line + "."


def table_note(profile: str) -> str:
    from lab_helpers.training.quick_mode import quick_from_env

    full = profile != "ci" and not quick_from_env()
    runs = f"each run's cost as measured in quick mode ({COSTS_FILE})"
    if full:
        runs += ", plus the course's micro-batches at the time model's step (full mode; LAB_QUICK=1 for quick mode)"
    return f"runs: {runs}; reading: the notebooks' Markdown at {READING_WORDS_PER_MINUTE} words a minute"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def notebook_minutes(notebook: str, node: Mapping[str, Any], *, profile: str, path: str | None = None):
    """Each experiment as decided here: a skip costs nothing, and on the core path the optional ones are skips."""
    from lab_helpers.config.experiments import get_experiment, resolve
    from lab_helpers.planning import decision
    from lab_helpers.training.quick_mode import quick_from_env

    costs = run_costs_s(profile)
    full_mode = profile != "ci" and not quick_from_env()
    minutes = NotebookMinutes(
        notebook, words=prose_words(notebook), questions=question_count(notebook), full_mode=full_mode
    )
    for exp_id in decided_experiments(notebook):
        step = None if core_path_skip(exp_id, path) else decision.decide(exp_id, node, profile=profile)
        if step is None or not step.runs:
            minutes.skipped.append(exp_id)
            continue
        run = resolve(exp_id, profile, step.overrides, check_files=False, simulate_world=step.simulate_world)
        seconds = costs.get(exp_id, UNLISTED_RUN_S)
        if full_mode:
            seconds += _full_mode_s(step, run, node)
        minutes.run_s[exp_id] = seconds
        minutes.gpus[exp_id] = run.ranks_run
        if get_experiment(exp_id).optional:
            minutes.optional_s[exp_id] = seconds
    return minutes


def _full_mode_s(step: Any, run: Any, node: Mapping[str, Any]) -> float:
    """0 where the run trains by epochs or the time model cannot time it: the quick-mode cost alone then counts."""
    from lab_helpers.present.plan_command import experiment_time

    gpus = node.get("gpus") or []
    sets = [f"{key}={value}" for key, value in step.overrides.items()]
    try:
        plan, _, _ = experiment_time(
            step.exp_id, profile=step.profile, sets=sets, gpu_name=gpus[0]["name"] if gpus else None
        )
    except Exception:  # noqa: BLE001 -- a prediction the model cannot make leaves the measured cost
        return 0.0
    iterations = run.total_iterations
    return float(iterations * plan.micro_batch_s) if plan is not None and iterations else 0.0


def path_table(minutes: Mapping[str, NotebookMinutes]):
    """``minutes``' rows and their sum: the whole path, every run and the core path."""
    import pandas as pd

    rows = [
        (name, len(m.run_s), round(m.runs_min, 1), round(m.reading_min, 1), round(m.total_min), round(m.core_total_min))
        for name, m in minutes.items()
    ]
    columns = ["notebook", "runs", "runs_min", "reading_min", "total_min", "core_path_min"]
    table = pd.DataFrame(rows, columns=columns)
    total = table.drop(columns="notebook").sum()
    table.loc[len(table)] = ["all", *total.tolist()]
    return table
