"""The notebooks as files: committed clean, short cells, no recipe text, a papermill parameters cell.

These tests never execute a notebook: CI does that separately with ``pytest --nbval-lax notebooks/`` on the
ci profile (see scripts/test.sh). Here only the committed JSON is checked, in well under a second. What a cell
calls is read from its syntax tree (``_calls``), not from its text: a call that is commented out, or a name
inside a string, does not count as a call.
"""

from __future__ import annotations

import ast
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


def _calls(nb: nbformat.NotebookNode) -> list[tuple[str, str | None]]:
    """Every call in the code cells, in order: (the callee as written, e.g. ``lab.predict_experiment`` or
    ``steps['ddp'].run``, and its first argument when that is a string)."""
    found = []
    for cell in _code_cells(nb):
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
        for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
            first = call.args[0] if call.args else None
            text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            found.append((ast.unparse(call.func), text))
    return found


def _assignments(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """Every assignment in the code cells, in order: (target, value) as written (``ast.unparse``)."""
    found = []
    for cell in _code_cells(nb):
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.Assign):
                found += [(ast.unparse(target), ast.unparse(node.value)) for target in node.targets]
    return found


def test_calls_are_read_from_the_syntax_tree_not_the_text():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('# lab.run("a")\nx = "lab.run(\'b\')"\nlab.run("c")')])
    assert _calls(nb) == [("lab.run", "c")]


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
    first = nbformat.v4.new_notebook(cells=[code[0]])
    assert ("os.environ.get", "LAB_PROFILE") in _calls(first), code[0].source
    assert "PROFILE" in dict(_assignments(first)), code[0].source


@pytest.mark.parametrize("name", ["01_single_gpu.ipynb", "02_multi_gpu.ipynb"])
def test_the_section_notebooks_derive_the_profile_and_prepare_the_same_way(name: str):
    """One way to pick the profile (lab.default_profile) and one call that prepares it (lab.prepare)."""
    nb = _read(NOTEBOOKS_DIR / name)
    assert dict(_assignments(nb))["PROFILE"] == "os.environ.get('LAB_PROFILE') or lab.default_profile()"
    assert ("prepare", "ci") in _calls(nb)
    assert [
        node for cell in _code_cells(nb) for node in ast.parse(cell.source).body
        if isinstance(node, ast.ImportFrom) and node.module == "lab_helpers.lab"
        and "prepare" in [alias.name for alias in node.names]
    ]  # fmt: skip


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_runs_on_the_lab_kernel(path: Path):
    assert _read(path).metadata.get("kernelspec", {}).get("name") == "python3"


def test_single_gpu_notebook_decides_predicts_and_runs_every_experiment_in_lab_order():
    """Each experiment: its computed arithmetic, node_plan's decision, the planner's prediction, one run call."""
    from lab_helpers.config.experiments import load_experiments

    nb = _read(NOTEBOOKS_DIR / "01_single_gpu.ipynb")
    calls = _calls(nb)
    section = list(load_experiments("single"))
    for callee in ("arithmetic.show", "node_plan.decide", "lab.predict_experiment", "lab.show_commands"):
        named = [arg for name, arg in calls if name == callee and arg is not None]  # each experiment by name
        assert named == section, (callee, named)
    assert _assignments(nb).count(("records", "step.run()")) == len(section)


def test_multi_gpu_notebook_decides_before_every_run():
    from lab_helpers.config.experiments import load_experiments

    nb = _read(NOTEBOOKS_DIR / "02_multi_gpu.ipynb")
    decided = [arg for name, arg in _calls(nb) if name == "node_plan.decide" and arg is not None]
    ran = [(target, value) for target, value in _assignments(nb) if target.startswith("records[")]
    assert decided == list(load_experiments("multi")), decided
    assert ran == [(f"records[{e!r}]", f"steps[{e!r}].run()") for e in decided], ran


def test_notebook_prose_types_no_model_state_figures():
    """Model-state GiB/GB figures come from lab_helpers.planning.arithmetic (code cells), never typed in Markdown:
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
    """Each run is followed, before the next heading, by exactly one question about what it showed (a section's
    other cells, such as the step-memory plot or the activations by hand, may ask their own)."""
    nb = _read(NOTEBOOKS_DIR / "01_single_gpu.ipynb")
    runs = 0
    for i, cell in enumerate(nb.cells):
        one = nbformat.v4.new_notebook(cells=[cell])
        if cell.cell_type != "code" or "step.run" not in [name for name, _ in _calls(one)]:
            continue
        runs += 1
        after = []
        for later in nb.cells[i + 1 :]:
            if later.cell_type == "markdown" and later.source.startswith("#"):
                break
            after.append(later)
        asked = [c for c in after if c.cell_type == "markdown" and c.source.startswith("**Question.**")]
        assert len(asked) == 1, f"cell {i}: {len(asked)} questions after its run"
    assert runs >= 17


def test_notebooks_name_only_reference_files_that_exist():
    """00/03 must not promise reference results that are not shipped: every quoted name exists."""
    shipped = {p.stem for p in (NOTEBOOKS_DIR.parent / "reference_results").glob("*.jsonl")}
    source = "\n".join(cell.source for cell in _read(NOTEBOOKS_DIR / "03_compare.ipynb").cells)
    comment = re.search(r"REFERENCE_NAME = None\s*#(.*)", source).group(1)
    named = re.findall(r"\"([\w.-]+)\"", comment)
    assert named and set(named) <= shipped, (named, shipped)


def test_compare_notebook_ends_with_how_to_leave_the_node():
    nb = _read(NOTEBOOKS_DIR / "03_compare.ipynb")
    assert nb.cells[-1].cell_type == "code"
    assert "lab.closing_text" in [name for name, _ in _calls(nbformat.v4.new_notebook(cells=[nb.cells[-1]]))]


def test_compare_notebook_draws_and_saves_every_plot():
    called = {name.rpartition(".")[2] for name, _ in _calls(_read(NOTEBOOKS_DIR / "03_compare.ipynb"))}
    for call in (
        "load_reference",
        "comparison_table",
        "plot_memory",
        "plot_time",
        "plot_memory_vs_time",
        "plot_timeline",
        "save_all",
    ):
        assert call in called, call


def test_what_if_notebook_runs_the_callback_once_and_offers_the_widgets():
    """CI executes the callback once with the defaults (no browser needed); the widgets answer on "Run"."""
    called = [name for name, _ in _calls(_read(NOTEBOOKS_DIR / "04_what_if.ipynb"))]
    assert called.count("what_if.show") == 1
    assert "what_if.widgets" in called


def test_what_if_notebook_prepares_the_ci_models_before_it_asks_the_planner():
    """04 run before 01 on a fresh ci node failed at its first answer (PlanError: no model_config.yaml for
    ci-llama-xs): the tiny models are built by prepare, which only 01 and 02 called."""
    called = _calls(_read(NOTEBOOKS_DIR / "04_what_if.ipynb"))
    assert ("lab.prepare", "ci") in called
    assert called.index(("lab.prepare", "ci")) < [name for name, _ in called].index("what_if.show")


def test_what_if_notebook_draws_two_charts_which_nbval_checks_for_images():
    """04 draws the explorer's answer and the time check: exactly two drawing cells. Every nbval run checks that each
    drawing cell shows an image (notebooks/conftest.py), so 04 is not executed a second time here for that."""
    from notebook_images import draws

    nb = _read(NOTEBOOKS_DIR / "04_what_if.ipynb")
    assert sum(draws(cell.source) for cell in _code_cells(nb)) == 2
