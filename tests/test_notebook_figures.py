"""What a student sees in 03 and 04: every drawing cell shows an image, and the reference never replaces theirs.

These execute the notebooks for real (nbclient, a python3 kernel, the ci profile), like a student pressing "Run
all": ``--nbval-lax`` compares no outputs, so charts shown as ``<Figure size ...>`` text passed CI until the image
check (tests/notebook_images.py, also applied to every nbval run by notebooks/conftest.py). The student's own runs
here are the ci profile's shipped code-path records (reference_results/ci-cpu.jsonl, recorded by this lab on a
CPU) copied in as ``runs.jsonl``: running 01 first would take minutes for the same records.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_images import draws, missing_image

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"

pytestmark = pytest.mark.slow


def _execute(name: str, **parameters: object) -> nbformat.NotebookNode:
    """Run a notebook top to bottom as a student would, with the parameters cell's values replaced."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for key, value in parameters.items():
        lines = cell.source.splitlines()
        assert any(line.startswith(f"{key} =") for line in lines), (key, cell.source)
        cell.source = "\n".join(f"{key} = {value!r}" if line.startswith(f"{key} =") else line for line in lines)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def _drawing_cells_show_images(nb: nbformat.NotebookNode) -> int:
    drawing = [cell for cell in nb.cells if cell.cell_type == "code" and draws(cell.source)]
    problems = [(cell.source.splitlines()[0], missing_image(cell.source, cell.outputs)) for cell in drawing]
    assert not [p for p in problems if p[1]], problems
    return len(drawing)


def _student_figures(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*")) if p.is_file()}


@pytest.fixture
def student_results(results: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results folder holding a student's ci runs (the shipped ci-cpu records), profile ci."""
    results.mkdir(parents=True)
    shutil.copy(REPO / "reference_results" / "ci-cpu.jsonl", results / "runs.jsonl")
    monkeypatch.setenv("LAB_PROFILE", "ci")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return results


def test_compare_notebook_draws_every_figure_and_the_reference_leaves_the_students_alone(student_results: Path):
    own = _execute("03_compare.ipynb", USE_REFERENCE=False)
    assert _drawing_cells_show_images(own) >= 4  # memory, time, memory vs time, a timeline
    figures = student_results / "figures"
    before = _student_figures(figures)
    assert {"memory.png", "time.png", "memory_vs_time.png", "comparison.csv"} <= set(before), before

    reference = _execute("03_compare.ipynb", USE_REFERENCE=True)
    assert _drawing_cells_show_images(reference) >= 4
    assert _student_figures(figures) == before  # byte-identical: not one of the student's files rewritten
    written = sorted(p.name for p in (figures / "reference-h100-80gb").iterdir())
    assert {"memory.png", "time.png", "memory_vs_time.png", "comparison.csv"} <= set(written), written
    said = "".join(o.get("text", "") for c in reference.cells if c.cell_type == "code" for o in c.outputs)
    assert "reference-h100-80gb" in said  # the student is told where the reference figures went
