"""reference_results/README.md is for a student (what was measured, how to read it); the measuring route is in
docs/measuring-on-a-gpu.md. Both hold, and every file they name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDENT = ROOT / "reference_results" / "README.md"
ROUTE = ROOT / "docs" / "measuring-on-a-gpu.md"


def test_the_student_readme_reads_results_and_points_to_the_route():
    text = STUDENT.read_text()
    assert (
        "How these files were measured, and what the next GPU session measures: `docs/measuring-on-a-gpu.md`." in text
    )
    assert "How to read them" in text and "| experiment | status |" in text
    assert "gpu-measure.sh --wheels" not in text and "wheelhouse --python" not in text  # the route lives elsewhere


def test_the_route_is_the_chunk_table_and_keeps_the_sessions_commands():
    text = ROUTE.read_text()
    for needed in (
        "python -m lab_helpers wheelhouse --python 3.12 --torch 2.11.0 --node-has node.txt --with qlora",
        "## The chunks",
        'bash scripts/gpu-chunk.sh speed --wheels .whl --out "$OUT" --deadline-s 535',
        "python -m lab_helpers export-reference --from DIR/runs.jsonl",
        "--node-has docs/gpu-image-packages.txt --dest .whl",  # the H200 session's wheelhouse
        "export-reference h100-80gb --profile gpu",
        "## The H100 session of 2026-11-22: the exact commands",
        "the host-RAM gate now speaks first",
    ):
        assert needed in text, needed
    for chunk in ("speed", "ranks", "single-7b", "13b", "offload", "notebooks", "padding", "levers"):  # one line each
        assert len(re.findall(rf"^\| `{re.escape(chunk)}` \|", text, flags=re.M)) == 1, chunk


def test_every_script_benchmark_and_doc_the_two_files_name_exists():
    for doc in (
        STUDENT,
        ROUTE,
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "scripts" / "gpu-measure.sh",
        ROOT / "scripts" / "gpu-chunk.sh",
    ):
        named = set(
            re.findall(r"\b((?:scripts|benchmarks|docs|lab_helpers)/[\w./-]+\.(?:sh|py|md|txt))", doc.read_text())
        )
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, (doc.name, missing)


def test_the_readme_is_one_a_newcomer_reads():
    """At most 2,000 words: what the lab is, the quick start, the student's and the instructor's path,
    tests, layout; the rest lives in docs/ pages that it links, and each of those exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 2000, len(text.split())
    for heading in ("## Quick start", "## A student's path", "## Instructor's path", "## Tests", "## Layout"):
        assert heading in text, heading
    for page in ("reliability", "quick-mode", "speed", "nodes", "layout", "measuring-on-a-gpu"):
        assert f"docs/{page}.md" in text and (ROOT / "docs" / f"{page}.md").exists(), page
