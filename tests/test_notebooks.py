"""The notebooks as files: committed clean, short cells, no recipe text, a papermill parameters cell.

These tests never execute a notebook: CI does that separately with ``pytest --nbval-lax notebooks/`` on the
ci profile (see scripts/test.sh). Here only the committed JSON is checked, in well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))

MAX_CODE_LINES = 15
MAX_MARKDOWN_LINES = 20

# Recipe keys belong in configs/ (a recipe, the experiment matrix, or oom_demo_overrides), never in a cell.
RECIPE_TEXT = re.compile(
    r"\b(checkpoint_dir|micro_batch_size|global_batch_size|max_steps|max_seq_length|max_tokens|epochs"
    r"|lr_warmup_steps|lora_[a-z]+|precision|class_path|init_args|json_path|quantize)\b"
    r"|--set\b"
)


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_the_lab_notebooks_are_there():
    names = {path.name for path in NOTEBOOKS}
    assert {"00_check_node.ipynb", "01_single_gpu.ipynb", "03_compare.ipynb", "04_what_if.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_without_outputs(path: Path):
    nb = _read(path)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"
    timed = [i for i, cell in enumerate(nb.cells) if "execution" in cell.metadata]
    assert not timed, f"{path.name}: cells {timed} carry execution timestamps"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_cells_are_short(path: Path):
    nb = _read(path)
    long_code = [
        (i, n)
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (n := len(cell.source.splitlines())) > MAX_CODE_LINES
    ]
    long_text = [
        (i, n)
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "markdown" and (n := len(cell.source.splitlines())) > MAX_MARKDOWN_LINES
    ]
    assert not long_code, f"{path.name}: code cells longer than {MAX_CODE_LINES} lines (cell, lines): {long_code}"
    assert not long_text, f"{path.name}: markdown longer than {MAX_MARKDOWN_LINES} lines (cell, lines): {long_text}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_recipe_text_in_code_cells(path: Path):
    nb = _read(path)
    found = [
        (i, m.group(0).strip()) for i, cell in enumerate(_code_cells(nb)) if (m := RECIPE_TEXT.search(cell.source))
    ]
    assert not found, f"{path.name}: recipe text in code cells (code cell, text): {found}; recipes live in configs/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_first_code_cell_is_the_parameters_cell_reading_lab_profile(path: Path):
    nb = _read(path)
    code = _code_cells(nb)
    tagged = [i for i, cell in enumerate(code) if "parameters" in cell.metadata.get("tags", [])]
    assert tagged == [0], f"{path.name}: want exactly one 'parameters'-tagged cell, the first code cell; got {tagged}"
    assert re.search(r"os\.environ\.get\(\s*[\"']LAB_PROFILE[\"']", code[0].source), code[0].source
    assert re.search(r"^PROFILE\s*=", code[0].source, re.MULTILINE), code[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_runs_on_the_lab_kernel(path: Path):
    assert _read(path).metadata.get("kernelspec", {}).get("name") == "python3"


def test_single_gpu_notebook_decides_predicts_and_runs_every_experiment_in_lab_order():
    """Each experiment: its computed arithmetic, node_plan's decision, the planner's prediction, one run call."""
    from lab_helpers.experiments import load_experiments

    nb = _read(NOTEBOOKS_DIR / "01_single_gpu.ipynb")
    source = "\n".join(cell.source for cell in _code_cells(nb))
    section = list(load_experiments("single"))
    for call in ("arithmetic.show", "node_plan.decide", "lab.predict_experiment", "commands.show_commands"):
        named = re.findall(re.escape(call) + r"\(\s*\"([\w-]+)\"", source)
        assert named == section, (call, named)
    assert len(re.findall(r"^records = step\.run\(\)", source, re.MULTILINE)) == len(section)


def test_multi_gpu_notebook_decides_before_every_run():
    from lab_helpers.experiments import load_experiments

    source = "\n".join(cell.source for cell in _code_cells(_read(NOTEBOOKS_DIR / "02_multi_gpu.ipynb")))
    decided = re.findall(r"node_plan\.decide\(\s*\"([\w-]+)\"", source)
    ran = re.findall(r"records\[\"([\w-]+)\"\] = steps\[\"([\w-]+)\"\]\.run\(\)", source)
    assert decided == list(load_experiments("multi")), decided
    assert [a for a, b in ran] == decided and all(a == b for a, b in ran), ran


def test_notebook_prose_types_no_model_state_figures():
    """Model-state GiB/GB figures come from lab_helpers.arithmetic (code cells), never typed in Markdown:
    typed by hand they drifted apart between notebooks (50 vs 52 GiB for the 7B)."""
    typed = re.compile(r"\d+(\.\d+)?\s*(GiB|GB)\b")
    # GPU sizes the lab is written for ("an 80 GB H100 shows ~79 GiB", "24-48 GB GPUs") and the download size
    # that provisioning/fetch-class-assets.sh checks: not model-state figures
    allowed = {"80 GB", "141 GB", "80 GiB", "79 GiB", "48 GB", "97 GB"}
    found = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(_read(path).cells):
            if cell.cell_type == "markdown":
                found += [(path.name, i, m.group(0)) for m in typed.finditer(cell.source) if m.group(0) not in allowed]
    assert not found, f"typed memory figures in Markdown (notebook, cell, text): {found}"


def test_every_experiment_asks_the_student_one_question():
    nb = _read(NOTEBOOKS_DIR / "01_single_gpu.ipynb")
    questions = [cell for cell in nb.cells if cell.cell_type == "markdown" and cell.source.startswith("**Question.**")]
    assert len(questions) == len(re.findall(r"step\.run\(", "\n".join(c.source for c in _code_cells(nb))))


def test_notebooks_name_only_reference_files_that_exist():
    """00/03 must not promise reference results that are not shipped: every quoted name exists."""
    shipped = {p.stem for p in (NOTEBOOKS_DIR.parent / "reference_results").glob("*.jsonl")}
    source = "\n".join(cell.source for cell in _read(NOTEBOOKS_DIR / "03_compare.ipynb").cells)
    named = re.findall(r"REFERENCE_NAME = None\s*#.*?e\.g\. \"([\w.-]+)\"", source)
    assert named and set(named) <= shipped, (named, shipped)


def test_compare_notebook_ends_with_how_to_leave_the_node():
    nb = _read(NOTEBOOKS_DIR / "03_compare.ipynb")
    assert "commands.closing_text()" in nb.cells[-1].source


def test_compare_notebook_draws_and_saves_every_plot():
    source = "\n".join(cell.source for cell in _code_cells(_read(NOTEBOOKS_DIR / "03_compare.ipynb")))
    for call in (
        "load_reference(",
        "comparison_table(",
        "plot_memory(",
        "plot_time(",
        "plot_memory_vs_time(",
        "plot_timeline(",
        "save_all(",
    ):
        assert call in source, call


def test_what_if_notebook_runs_the_callback_once_and_offers_the_widgets():
    """CI executes the callback once with the defaults (no browser needed); the widgets answer on "Run"."""
    source = "\n".join(cell.source for cell in _code_cells(_read(NOTEBOOKS_DIR / "04_what_if.ipynb")))
    assert len(re.findall(r"what_if\.show\(profile=PROFILE\)", source)) == 1
    assert "what_if.widgets(PROFILE)" in source
