#!/usr/bin/env python3
"""Step 1 of issue 44's relayout: one namespace for the notebooks, ``lab``.

It runs first, on main's flat layout, so that no commit of the relayout leaves a notebook cell longer than the tests
allow (the move splits a notebook's one import line by package: 01's first cell would be 16 lines). The move and the
splits after it rewrite ``lab``'s lazy table (dotted paths) and its ``TYPE_CHECKING`` imports like any other
reference, and the notebooks' ``compare`` becomes ``tables`` and ``figures`` (``KEEP`` names every form).

The notebooks keep a few modules they use as vocabularies (``KEEP``: ``node_plan.decide``, ``arithmetic.show``,
``tables.comparison_table``, ``figures.plot_time``, ``what_if.show``); every other name a cell takes from the
package becomes part of ``lab``'s public API:

1. ``lab.py`` gets each such name in ``__all__``, imported on first use (PEP 562, as ``planner``'s and ``assets``'
   names are: ``python -m lab_helpers run`` imports ``lab`` and must not pay for pandas), with the same imports
   under ``TYPE_CHECKING`` for readers, linters and type checkers. A name ``lab`` already binds to the same object
   only joins ``__all__``; one it binds to something else stops the step.
2. In every notebook, ``from lab_helpers.X import a, b`` becomes ``from lab_helpers.lab import a, b`` (one line per
   cell where they carry no comment), and ``module.name`` through a module binding outside ``KEEP`` (code and
   Markdown) becomes ``lab.name`` (``ALIASES`` renames where ``lab`` needs a clearer name); the module leaves its
   import line. Only those lines and names change: the rest of each notebook stays byte for byte.
3. The tests that read the notebooks' source (``NOTEBOOK_TESTS``) follow: the same qualified names in their strings
   and patterns, and the stated exact edits (``TEST_EDITS``).

It prints the distinct lab_helpers modules each notebook imports, before and after, and across all of them.
Run at the root of a checkout (``--check``: only report; ``--count``: only count what the notebooks import now,
failing over six, apply.sh's last check).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from splitlib import Edit, Stop  # noqa: E402

KEEP = (
    "lab_helpers.lab",
    "lab_helpers.node_plan",
    "lab_helpers.arithmetic",  # on main; planning.arithmetic once moved
    "lab_helpers.planning.arithmetic",
    "lab_helpers.compare",  # present.compare once moved, then tables and figures once split
    "lab_helpers.present.compare",
    "lab_helpers.present.tables",
    "lab_helpers.present.figures",
    "lab_helpers.what_if",
    "lab_helpers.present.what_if",
)
LIMIT = 6
# (module's last name, name) -> the name lab gives it, where the module's own name says too little beside lab's others
ALIASES = {
    ("activations_by_hand", "summary"): "activations_summary",
    ("activations_by_hand", "misses"): "activations_missed",
}
NOTEBOOK_TESTS = ("tests/test_notebooks.py", "tests/notebook_images.py")
TEST_EDITS = [
    Edit(
        "tests/test_step_memory.py",
        """    assert draws('step_memory.plot_step("full-7b", profile=PROFILE)')""",
        """    assert draws('lab.plot_step("full-7b", profile=PROFILE)')  # as the notebooks call it""",
    ),
    Edit(
        "tests/test_notebooks.py",
        '    assert "from lab_helpers.prepare import prepare" in [\n'
        "        ast.unparse(node) for cell in _code_cells(nb) for node in ast.parse(cell.source).body\n"
        "    ]\n",
        "    assert [\n"
        "        node for cell in _code_cells(nb) for node in ast.parse(cell.source).body\n"
        '        if isinstance(node, ast.ImportFrom) and node.module == "lab_helpers.lab"\n'
        '        and "prepare" in [alias.name for alias in node.names]\n'
        "    ]  # fmt: skip\n",
    ),
    Edit(
        "tests/test_notebooks.py",
        '"""One way to pick the profile (lab.default_profile) and one call that prepares it (lab_helpers.prepare)."""',
        '"""One way to pick the profile (lab.default_profile) and one call that prepares it (lab.prepare)."""',
    ),
]
LAB = "lab_helpers/lab.py"

_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>lab_helpers(?:\.\w+)*)[ \t]+import[ \t]+"
                     r"(?P<names>[^\n#(]+?)(?P<tail>[ \t]*#[^\n]*)?$", re.M)  # fmt: skip


def is_module(root: Path, dotted: str) -> bool:
    path = root / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def code_of(nb: dict) -> list[str]:
    return ["".join(c.get("source", [])) for c in nb["cells"] if c.get("cell_type") == "code"]


def imported_modules(root: Path, sources: list[str]) -> set[str]:
    """The distinct lab_helpers modules a notebook's code imports (a module or names from one)."""
    found: set[str] = set()
    for source in sources:
        if re.search(r"^\s*import\s+lab_helpers|^\s*from\s+lab_helpers\S*\s+import\s*\(", source, re.M):
            raise Stop("a notebook imports lab_helpers in a form this step does not read (import x / parentheses)")
        for m in _IMPORT.finditer(source):
            for item in m.group("names").split(","):
                name = item.split(" as ")[0].strip()
                full = f"{m.group('mod')}.{name}"
                found.add(full if is_module(root, full) else m.group("mod"))
    return found


class Plan:
    """What moves into lab's namespace, gathered over every notebook."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.api: dict[str, tuple[str, str]] = {}  # lab's name -> (module, name)

    def expose(self, module: str, name: str, where: str) -> str:
        exposed = ALIASES.get((module.rpartition(".")[2], name), name)
        if self.api.setdefault(exposed, (module, name)) != (module, name):
            raise Stop(f"{where}: lab.{exposed} would be both {self.api[exposed]} and {(module, name)}")
        return exposed

    def rewrite_cell(self, source: str, bindings: dict[str, str], where: str) -> str:
        """One cell: its import lines, and ``binding.name`` through the bindings leaving for lab."""

        def qualified(m: re.Match[str]) -> str:
            return f"lab.{self.expose(bindings[m.group(1)], m.group(2), where)}"

        if bindings:
            pattern = rf"(?<![\w.])({'|'.join(map(re.escape, bindings))})\.(\w+)"
            source = re.sub(pattern, qualified, source)
        lines = source.splitlines(keepends=True)
        out: list[str] = []
        merged_at: int | None = None
        for line in lines:
            m = _IMPORT.match(line.rstrip("\n"))
            if m is None:
                out.append(line)
                continue
            module, tail = m.group("mod"), m.group("tail") or ""
            items = [i.strip() for i in m.group("names").split(",") if i.strip()]
            keep, to_lab = [], []
            for item in items:
                name, _, alias = (p.strip() for p in item.partition(" as "))
                full = f"{module}.{name}"
                if is_module(self.root, full):
                    if full in KEEP or (alias or name) not in bindings:
                        keep.append(item)
                elif module in KEEP:
                    keep.append(item)
                else:
                    exposed = self.expose(module, name, where)
                    to_lab.append(exposed if (alias or name) == exposed else f"{exposed} as {alias or name}")
            newline = "\n" if line.endswith("\n") else ""
            if keep:
                out.append(f"{m.group('indent')}from {module} import {', '.join(keep)}{tail if not to_lab else ''}"
                           f"{newline}")  # fmt: skip
            if to_lab:
                if tail or merged_at is None:
                    out.append(f"{m.group('indent')}from lab_helpers.lab import {', '.join(to_lab)}{tail}{newline}")
                    if not tail:
                        merged_at = len(out) - 1
                else:
                    previous = out[merged_at]
                    names = previous.rstrip("\n").split(" import ", 1)[1].split(", ") + to_lab
                    out[merged_at] = previous.split(" import ", 1)[0] + " import " + ", ".join(sorted(set(names)))
                    out[merged_at] += "\n" if previous.endswith("\n") else ""
        text = "".join(out)
        return text.lstrip("\n") if not source.startswith("\n") else text  # an import line that left the top


def notebook_bindings(root: Path, sources: list[str]) -> dict[str, str]:
    """binding -> module, for the modules a notebook imports that leave for lab."""
    out: dict[str, str] = {}
    for source in sources:
        for m in _IMPORT.finditer(source):
            for item in m.group("names").split(","):
                name, _, alias = (p.strip() for p in item.strip().partition(" as "))
                full = f"{m.group('mod')}.{name}"
                if is_module(root, full) and full not in KEEP:
                    out[alias or name] = full
    return out


def check_no_bare_use(sources: list[str], bindings: dict[str, str], where: str) -> None:
    for source in sources:
        body = _IMPORT.sub("", source)
        for binding in bindings:
            if re.search(rf"(?<![\w.]){re.escape(binding)}\b(?!\.)", body):
                raise Stop(f"{where}: the module {binding} is used other than as {binding}.name; do it by hand")


# ---------------------------------------------------------------------------------------------------------------
# lab.py


def lab_bindings(tree: ast.Module) -> dict[str, str | None]:
    """Names lab.py binds at the top -> the module they come from (None: defined in lab.py)."""
    out: dict[str, str | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}:{a.name}"
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = None
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = None
    return out


LAZY = """

# ---------------------------------------------------------------------------------------------------------------
# The notebooks' one namespace: what their cells call from the layers below, as ``lab.NAME`` or
# ``from lab_helpers.lab import NAME``. Each is imported on first use (PEP 562, as ``planner``'s names are): the CLI
# imports this module for every run and must not pay for pandas or matplotlib.

_NOTEBOOK_API = {api}


def __getattr__(name: str) -> Any:
    if name not in _NOTEBOOK_API:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    module, _, attribute = _NOTEBOOK_API[name].rpartition(".")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # found once, then an ordinary module attribute
    return value


def __dir__() -> list[str]:
    return sorted({{*globals(), *_NOTEBOOK_API}})
"""


def extend_lab(root: Path, api: dict[str, tuple[str, str]]) -> list[str]:
    path = root / LAB
    text = path.read_text()
    if "_NOTEBOOK_API" in text:
        raise Stop(f"{LAB} has a _NOTEBOOK_API already: this step ran here before")
    tree = ast.parse(text)
    bound = lab_bindings(tree)
    lazy: dict[str, tuple[str, str]] = {}
    for exposed, (module, name) in sorted(api.items()):
        if exposed in bound:
            if bound[exposed] != f"{module}:{name}":
                raise Stop(f"{LAB} binds {exposed} to {bound[exposed] or 'its own definition'}, not {module}.{name}")
        else:
            lazy[exposed] = (module, name)
    alls = [
        n for n in tree.body if isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"]
    ]
    if len(alls) != 1 or not isinstance(alls[0].value, ast.List):
        raise Stop(f"{LAB}: expected one __all__ = [...] list")
    node = alls[0]
    names = ast.literal_eval(node.value)
    added = sorted(n for n in api if n not in names)
    lines = text.splitlines(keepends=True)
    new_all = "__all__ = [\n" + "".join(f'    "{n}",\n' for n in [*names, *added]) + "]\n"
    lines[node.lineno - 1 : node.end_lineno] = [new_all]
    text = "".join(lines)
    # the imports for readers and type checkers, after the last top-level import
    tree = ast.parse(text)
    last = max(n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    typing = "\nif TYPE_CHECKING:  # for readers and type checkers; at run time each is imported on first use (below)\n"
    for module, name, exposed in sorted((m, n, e) for e, (m, n) in lazy.items()):
        typing += f"    from {module} import {name}" + (f" as {exposed}" if exposed != name else "") + "\n"
    lines = text.splitlines(keepends=True)
    head = "import importlib\n"
    text = "".join(lines[:last]) + head + "from typing import TYPE_CHECKING\n" + typing + "".join(lines[last:])
    entries = "".join(f'    "{e}": "{m}.{n}",\n' for e, (m, n) in sorted(lazy.items()))
    text = text.rstrip("\n") + "\n" + LAZY.format(api="{\n" + entries + "}")
    path.write_text(text)
    subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I", "--fix", str(path)], check=False)
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--quiet", str(path)], capture_output=True, text=True
    )
    if found.returncode:
        raise Stop(f"ruff finds problems in {LAB}:\n{found.stdout[-2000:]}")
    return added


def check_names_resolve(root: Path, notebooks: Iterable[str]) -> None:
    """Every name of lab's __all__ resolves, and every ``lab.NAME`` and ``from lab_helpers.lab import NAME`` of the
    notebooks is one of lab's (in a fresh interpreter: the lazy imports run for real)."""
    used: set[str] = set()
    for text in notebooks:
        for source in code_of(json.loads(text)):
            used.update(re.findall(r"(?<![\w.])lab\.(\w+)", source))
            for m in re.finditer(r"^\s*from lab_helpers\.lab import ([^\n#]+)", source, re.M):
                used.update(item.split(" as ")[0].strip() for item in m.group(1).split(","))
    probe = (
        "import sys\nfrom lab_helpers import lab\n"
        "[getattr(lab, n) for n in lab.__all__]\n"
        f"missing = sorted(n for n in {sorted(used)!r} if not hasattr(lab, n))\n"
        "sys.exit(f'not in lab: {missing}' if missing else 0)\n"
    )
    found = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
    if found.returncode:
        raise Stop(f"the notebooks' names do not all resolve in lab: {found.stderr.strip()[-1500:]}")


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    root = Path.cwd()
    if not (root / LAB).is_file():
        raise Stop("run it at the root of a checkout of the lab")
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    plan = Plan(root)
    before: dict[str, set[str]] = {}
    rewritten: dict[Path, str] = {}
    renamed: dict[str, str] = {}  # "module_binding.name" -> "lab.exposed", for the tests
    for path in notebooks:
        text = path.read_text()
        nb = json.loads(text)
        if json.dumps(nb, indent=1, ensure_ascii=False) + "\n" != text:
            raise Stop(f"{path.name} is not as nbformat writes it; this step would change more than its imports")
        sources = code_of(nb)
        before[path.name] = imported_modules(root, sources)
        bindings = notebook_bindings(root, sources)
        check_no_bare_use(sources, bindings, path.name)
        for binding, module in bindings.items():
            for source in ["".join(c.get("source", [])) for c in nb["cells"]]:
                for name in re.findall(rf"(?<![\w.]){re.escape(binding)}\.(\w+)", source):
                    renamed[f"{binding}.{name}"] = f"lab.{ALIASES.get((module.rpartition('.')[2], name), name)}"
        for cell in nb["cells"]:
            if cell.get("cell_type") not in ("code", "markdown"):
                continue
            source = "".join(cell.get("source", []))
            new = plan.rewrite_cell(source, bindings, path.name) if cell["cell_type"] == "code" else source
            if cell["cell_type"] == "markdown" and bindings:
                new = re.sub(rf"(?<![\w.])({'|'.join(map(re.escape, bindings))})\.(\w+)",
                             lambda m, b=bindings, w=path.name: f"lab.{plan.expose(b[m.group(1)], m.group(2), w)}",
                             source)  # fmt: skip
            if new != source:
                cell["source"] = new.splitlines(keepends=True)
        rewritten[path] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    after = {path.name: imported_modules(root, code_of(json.loads(text))) for path, text in rewritten.items()}

    def show(label: str, table: dict[str, set[str]]) -> None:
        every = set().union(*table.values())
        print(f"lab_helpers modules the notebooks import, {label}: {len(every)} in all")
        for name, modules in table.items():
            print(f"  {name}: {len(modules)}  " + " ".join(sorted(m.removeprefix("lab_helpers.") for m in modules)))

    if "--count" in argv:  # what the notebooks import now, at most LIMIT modules in all (apply.sh's last check)
        show("now", before)
        every = set().union(*before.values())
        return 0 if len(every) <= LIMIT else 1
    show("before", before)
    if "--check" in argv:
        print("lab's new names: " + ", ".join(f"{e} ({m}.{n})" for e, (m, n) in sorted(plan.api.items())))
        show("after", after)
        return 0
    added = extend_lab(root, plan.api)
    for path, text in rewritten.items():
        path.write_text(text)
    for rel in NOTEBOOK_TESTS:
        test = root / rel
        old = test.read_text()
        new = old
        for qualified, target in sorted(renamed.items()):
            binding, name = qualified.split(".")
            new = re.sub(rf"(?<![\w.]){re.escape(binding)}(\\?\.){re.escape(name)}\b",
                         lambda m, t=target: t.replace(".", m.group(1), 1), new)  # fmt: skip
        if new != old:
            test.write_text(new)
    for edit in TEST_EDITS:
        edit.apply(root)
    show("after", after)
    check_names_resolve(root, rewritten.values())
    every = set().union(*after.values())
    print(f"relayout: lab gained {len(added)} names in __all__: {', '.join(added)}")
    if len(every) > LIMIT:
        raise Stop(f"the notebooks still import {len(every)} lab_helpers modules (at most {LIMIT})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
