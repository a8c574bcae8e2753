"""``run --help`` lists the experiment ids by section: a user finds them without opening a YAML file."""

from __future__ import annotations

import subprocess
import sys

from lab_helpers.config.experiments import SECTIONS, load_experiments


def test_run_help_lists_every_experiment_under_its_section():
    out = subprocess.run([sys.executable, "-m", "lab_helpers", "run", "--help"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    listing = out.split("experiments (ID), by section", 1)[1].splitlines()
    experiments = load_experiments()
    assert experiments and {e.section for e in experiments.values()} <= set(SECTIONS)
    current = None
    seen = {}
    for line in listing[1:]:
        if line.strip().rstrip(":") in SECTIONS and line.strip().endswith(":"):
            current = line.strip().rstrip(":")
        elif line.startswith("    "):
            seen[line.split()[0]] = current
    assert seen == {e.id: e.section for e in experiments.values()}
    assert all(len(line) <= 100 for line in listing)  # fits a terminal, the teaching line cut with "..."
