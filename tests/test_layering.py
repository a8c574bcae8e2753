"""Imports flow one way: measure, predict and record below; orchestrate (lab) above them; present on top.

Read from the modules' syntax trees (every import statement, module-level or inside a function, since a lazy
import is still a dependency), not from their text: a comment or a string naming a module changes nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import lab_helpers

PACKAGE_DIR = Path(lab_helpers.__file__).parent

PRESENTATION = {
    "lab_helpers.__main__",
    "lab_helpers.cli",
    "lab_helpers.commands",
    "lab_helpers.compare",
    "lab_helpers.distributed.notebook",
    "lab_helpers.doctor",
    "lab_helpers.node_plan",
    "lab_helpers.what_if",
}
"""What the notebooks and the command line show: may import anything."""

ORCHESTRATION = {"lab_helpers.lab", "lab_helpers.reference"}
"""What runs a section or exports its results: may import everything but the presentation."""

BOTTOM = {"lab_helpers.record_schema", "lab_helpers.recipe_defaults", "lab_helpers.config_error"}
"""Shared definitions every layer reads: import nothing of the lab."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ("lab_helpers", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_layers_exist():
    modules = set(_modules())
    assert PRESENTATION | ORCHESTRATION | BOTTOM <= modules, (PRESENTATION | ORCHESTRATION | BOTTOM) - modules


def test_no_module_imports_a_layer_above_it():
    wrong = []
    for module, imported in _graph().items():
        if module in BOTTOM and imported:
            wrong.append(f"{module} (bottom) imports {sorted(imported)}")
        if module not in PRESENTATION:
            wrong += [f"{module} imports the presentation module {m}" for m in imported & PRESENTATION]
        if module not in PRESENTATION | ORCHESTRATION:
            wrong += [f"{module} imports the orchestration module {m}" for m in imported & ORCHESTRATION]
    assert wrong == []


def test_there_is_no_import_cycle():
    graph = _graph()
    cycles = []
    for start in graph:  # a path from a module back to itself, found by a depth-first walk
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for nxt in graph[module]:
                if nxt == start:
                    cycles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert cycles == []


def test_the_layers_hold_when_imported():
    """The lower layers really import without pulling in the lab or its presentation (in a fresh interpreter)."""
    lower = ["lab_helpers.run_record", "lab_helpers.predict", "lab_helpers.launch", "lab_helpers.records"]
    code = (
        "import sys, importlib\n"
        f"for m in {lower!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m in {sorted(PRESENTATION | ORCHESTRATION)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_walk_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a module below the lab that imports it lazily is caught; a comment is not."""
    fake = tmp_path / "lab_helpers"
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "lab.py").write_text("from lab_helpers import records\n")
    (fake / "records.py").write_text("def f():\n    from lab_helpers.lab import x  # lazy\n# import lab_helpers.compare\n")
    (fake / "sub" / "__init__.py").write_text("from .. import records\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIR", fake)
    graph = _graph()
    assert graph["lab_helpers.records"] == {"lab_helpers.lab"}
    assert graph["lab_helpers.sub"] == {"lab_helpers.records"}
    assert "lab_helpers.compare" not in graph["lab_helpers.records"]
