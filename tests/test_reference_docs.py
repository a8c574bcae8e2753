"""reference_results/README.md is for a student (what was measured, how to read it); the measuring route is in
docs/measuring-on-a-gpu.md (issue 30). Both hold, and every file they name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDENT = ROOT / "reference_results" / "README.md"
ROUTE = ROOT / "docs" / "measuring-on-a-gpu.md"


def test_the_student_readme_reads_results_and_points_to_the_route():
    text = STUDENT.read_text()
    assert "How these files were measured, and what the next GPU session measures: `docs/measuring-on-a-gpu.md`." in text
    assert "How to read them" in text and "| experiment | status |" in text
    assert "gpu-measure.sh --wheels" not in text and "wheelhouse --python" not in text  # the route lives elsewhere


def test_the_route_keeps_the_commands_the_session_notes_and_the_next_session():
    text = ROUTE.read_text()
    for needed in (
        "python -m lab_helpers wheelhouse --python 3.12 --torch 2.11.0 --node-has node.txt --with qlora",
        "bash scripts/gpu-measure.sh --wheels .whl --models 13b --deadline-s 540",
        "export-reference h100-80gb --profile gpu",
        "## The H100 session of 2026-11-22: the exact commands",
        "**The next GPU session, in order**",
        "**The speed diagnosis, next GPU session",
        "the host-RAM gate now speaks first",
    ):
        assert needed in text, needed


def test_every_script_benchmark_and_doc_the_two_files_name_exists():
    for doc in (STUDENT, ROUTE, ROOT / "README.md", ROOT / "scripts" / "gpu-measure.sh"):
        named = set(re.findall(r"\b((?:scripts|benchmarks|docs|lab_helpers)/[\w./-]+\.(?:sh|py|md|txt))", doc.read_text()))
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, (doc.name, missing)
