#!/usr/bin/env python3
"""Issue 44's move, as a re-runnable codemod: the layers of ``lab_helpers`` become subpackages.

Step 2 of ``apply.sh``. Run at the root of a checkout (``python scripts/relayout/move.py``; ``--check`` only reports
what it would do). It

1. ``git mv``-s every top-level module of ``lab_helpers/`` into its layer package (``PLACES``); ``distributed/`` and
   ``planner/`` move whole, ``launch/`` and ``assets/`` stay and receive their layer's modules. A module that moves
   one folder deeper keeps what ``Path(__file__)`` meant (``.parent`` chains get one more step);
2. rewrites every reference to a moved module in the tracked text files (``SCOPE``): ``import lab_helpers.X``,
   ``from lab_helpers.X import``, ``from lab_helpers import X`` (split by new package), relative imports that leave
   their package, ``python -m lab_helpers.X``, string module paths (subprocess argv, ``importlib``, monkeypatch
   targets) and file paths (``lab_helpers/X.py``); notebooks are rewritten in their cells' sources (JSON kept as
   nbformat writes it);
3. makes ``assets/__init__`` import its names on first use (PEP 562, as ``planner/__init__`` does): ``assets`` now
   holds ``wheelhouse``, which the CLI imports for every command, and the CLI must not import torch;
4. writes ``.importlinter`` as layer contracts over the packages (any other contract of main's is kept, its module
   paths moved);
5. sorts the imports it touched (``ruff check --select I --fix``).

Deterministic and idempotent: a second run changes nothing. It stops, changing nothing, on a top-level module or
package it has no place for (one added on main since): give it a place in ``PLACES`` and run it again.
Recorded outputs (``benchmarks/*.out.txt``, ``reference_results/`` logs, ``*.jsonl``) are history and not rewritten.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = "lab_helpers"

# The layers, top to bottom; the docstring each new package's __init__ gets.
LAYERS = {
    "present": "Presenting: tables, figures, what-if answers, the commands and guesses the notebooks show.",
    "record": "Recording: a finished run's record, the durable results file, references and recovery.",
    "launch": None,  # the package exists (the launchers); its __init__ stays as it is
    "training": "Training: what runs inside the training process (litgpt's wrapper, its report, the measures).",
    "assets": None,  # the package exists (offline assets); prepare and wheelhouse join it
    "planning": "Planning: what a run will need and whether it fits, before it runs (the planner and its callers).",
    "hardware": "The node: what this machine has (GPUs, driver, CPU speed, peaks, links), described once.",
    "config": "Configuration: experiments, recipes, the record schema, paths, secrets: read by every layer above.",
}

# What stays at the top: what notebooks and the CLI call.
TOP = ("__init__", "__main__", "cli", "lab", "node_plan")

# Every top-level module or package of today's lab_helpers -> its layer. A name missing here stops the run.
PLACES = {
    # present
    "compare": "present",
    "what_if": "present",
    "step_memory": "present",
    "commands": "present",
    "guesses": "present",
    "doctor": "present",
    "plan_command": "present",
    "figure_display": "present",
    "figure_source": "present",
    "table_display": "present",
    "timeline_phases": "present",
    "answers": "present",  # the answer key (issue 43)
    "padding": "present",  # what grouping by length changed, in sentences (issue 43)
    # record
    "run_record": "record",
    "records": "record",
    "results_folder": "record",
    "reference": "record",
    "recovery": "record",
    "exit_cause": "record",
    "time_bound": "record",
    # launch (the package launch/ stays: launcher_for, litgpt_cli, lightning_strategy)
    "runner": "launch",
    "warm_start": "launch",
    "sampler": "launch",
    "interrupts": "launch",
    "time_limit": "launch",
    # training
    "child_litgpt": "training",
    "child_report": "training",
    "quick_mode": "training",
    "tensor_peak": "training",
    "step_profile": "training",
    "activation_checkpointing": "training",
    "orphan_guard": "training",
    "step_memory_measure": "training",
    "distributed": "training",
    # assets (the package assets/ stays)
    "prepare": "assets",
    "wheelhouse": "assets",
    # planning
    "predict": "planning",
    "decision": "planning",
    "arithmetic": "planning",
    "activations_by_hand": "planning",
    "flops": "planning",
    "data_lengths": "training",  # the data's sample lengths, padded as quick mode's sampler orders them (issue 43)
    "launch_cost": "planning",  # measures this node, but with the planner's op counter: above the planner
    "planner": "planning",
    # hardware
    "node": "hardware",
    "cuda_compat": "hardware",
    "cpu_speed": "hardware",
    "gpu_peaks": "hardware",
    "bandwidth": "hardware",
    # config
    "experiments": "config",
    "recipe_check": "config",
    "recipe_defaults": "config",
    "record_schema": "config",
    "paths": "config",
    "config_error": "config",
    "iteration_times": "config",
    "secrets": "config",
    "yaml_values": "config",
}

# Modules that leave a package which otherwise moves whole: old dotted path (below lab_helpers) -> new.
SUBMODULE_MOVES = {
    "distributed.notebook": "present.multi_gpu",  # the multi-GPU notebook's helpers present; they train nothing
}

# Text files rewritten (git-tracked, under these roots); recorded outputs are left as they were recorded.
SCOPE = (
    "lab_helpers/",
    "tests/",
    "notebooks/",
    "benchmarks/",
    "scripts/",
    "docs/",
    "configs/",
    ".ci/",
    "provisioning/",
    "README.md",
    "pyproject.toml",
    "reference_results/README.md",
)
NOT_REWRITTEN = re.compile(r"(\.out\.txt|\.jsonl|\.log|\.tsv|\.png|\.svg|\.whl|\.json)$")

IMPORTLINTER = """\
; The lab's layers, checked by import-linter (tests/test_layering.py runs it in the fast tier).
; Top to bottom, each line a layer: a module imports only from its own line (":" = may import each other) or the
; lines below. Each layer below the top two lines is a package; inside one, modules may import each other (without
; cycles). "exhaustive": every entry of lab_helpers must be named here, so a new module has to take a place.
[importlinter]
root_package = lab_helpers
exclude_type_checking_imports = True

[importlinter:contract:layers]
name = Layers: each imports only those below it
type = layers
containers =
    lab_helpers
exhaustive = true
layers =
    __main__ : cli
    lab : node_plan
{layers}

[importlinter:contract:acyclic]
name = No import cycles between the modules of a package
type = acyclic_siblings
ancestors =
    lab_helpers

[importlinter:contract:planner-inputs]
name = The planner reads no records and probes no hardware: its inputs are arguments
type = forbidden
source_modules =
    lab_helpers.planning.planner
forbidden_modules =
    lab_helpers.hardware.node
    lab_helpers.hardware.cuda_compat
    lab_helpers.hardware.bandwidth
    lab_helpers.planning.launch_cost
    lab_helpers.record.records
    lab_helpers.launch.sampler
"""


class NoPlace(SystemExit):
    pass


def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], check=check, capture_output=True, text=True).stdout


# ---------------------------------------------------------------------------------------------------------------
# The mapping: old dotted name -> new dotted name (longest matching prefix decides)


def moves() -> dict[str, str]:
    table = {f"{PACKAGE}.{old}": f"{PACKAGE}.{layer}.{old}" for old, layer in PLACES.items()}
    table.update({f"{PACKAGE}.{old}": f"{PACKAGE}.{new}" for old, new in SUBMODULE_MOVES.items()})
    # a new name must never start with an old one that moves, or a second run would move it again
    for new in table.values():
        for old in table:
            assert not (new == old or new.startswith(old + ".")), (old, new)
    return table


MOVES = moves()


def new_name(dotted: str) -> str | None:
    """The new dotted name of ``dotted`` (a module, or a name inside one), or None if nothing in it moved."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        head = ".".join(parts[:n])
        if head in MOVES:
            return ".".join([MOVES[head], *parts[n:]])
    return None


# ---------------------------------------------------------------------------------------------------------------
# 1. git mv


def entries(root: Path) -> set[str]:
    """Top-level modules and packages of lab_helpers/ that git tracks."""
    names = set()
    for path in git("ls-files", "--", f"{PACKAGE}/").splitlines():
        rest = Path(path).relative_to(PACKAGE).parts
        if len(rest) == 1 and rest[0].endswith(".py"):
            names.add(rest[0][:-3])
        elif len(rest) > 1:
            names.add(rest[0])
    return names


def plan_moves(root: Path) -> list[tuple[Path, Path]]:
    pkg = root / PACKAGE
    homeless = sorted(entries(root) - set(TOP) - set(LAYERS) - set(PLACES))
    if homeless:
        raise NoPlace(
            "relayout: no place for "
            + ", ".join(f"lab_helpers/{n}" for n in homeless)
            + ": add each to PLACES in scripts/relayout/move.py (and to the README's Layout), then run it again"
        )
    todo = []
    for old, new in SUBMODULE_MOVES.items():
        src = pkg.joinpath(*old.split(".")).with_suffix(".py")
        dst = pkg.joinpath(*new.split(".")).with_suffix(".py")
        if src.exists():
            todo.append((src, dst))
    for name, layer in sorted(PLACES.items()):
        for src in (pkg / name, pkg / f"{name}.py"):
            if src.exists():
                todo.append((src, pkg / layer / src.name))
    return todo


_FILE_PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)((?:\.parent)+|\.parents\[(\d+)\])")


def deepen_file_paths(path: Path, by: int) -> None:
    """``Path(__file__).resolve().parent`` in a module moved ``by`` folders deeper still names the same folder."""

    def deeper(m: re.Match[str]) -> str:
        up = int(m.group(2)) if m.group(2) is not None else m.group(1).count(".parent") - 1
        return f"Path(__file__).resolve().parents[{up + by}]"

    text = path.read_text()
    new = _FILE_PARENTS.sub(deeper, text)
    if new != text:
        path.write_text(new)


def do_moves(root: Path, todo: list[tuple[Path, Path]]) -> None:
    for layer, doc in LAYERS.items():
        init = root / PACKAGE / layer / "__init__.py"
        if doc is not None and not init.exists():
            init.parent.mkdir(exist_ok=True)
            init.write_text(f'"""{doc}"""\n')
            git("add", str(init.relative_to(root)))
    for src, dst in todo:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not (dst.parent / "__init__.py").exists():
            raise NoPlace(f"relayout: {dst.parent} is no package")
        git("mv", str(src.relative_to(root)), str(dst.relative_to(root)))
        by = len(dst.relative_to(root).parts) - len(src.relative_to(root).parts)
        files = [dst] if dst.is_file() else sorted(dst.rglob("*.py"))
        for f in files:
            if by:
                deepen_file_paths(f, by)


# ---------------------------------------------------------------------------------------------------------------
# 2. references

_DOTTED = re.compile(r"(?<![\w.])lab_helpers((?:\.[A-Za-z_]\w*)+)")
_SLASHED = re.compile(r"(?<![\w.])lab_helpers((?:/[A-Za-z_]\w*)+)")
_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>lab_helpers(?:\.\w+)*)[ \t]+import[ \t]+"
    r"(?:\((?P<paren>[^)]*)\)|(?P<plain>[^\n#;]*?))(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.M,
)
_RELATIVE = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<dots>\.+)(?P<mod>\w+(?:\.\w+)*)?[ \t]+import[ \t]+", re.M)


def rewrite_from(m: re.Match[str]) -> str:
    """``from lab_helpers[.X] import a, b`` with each name that is a moved module under its new package."""
    mod, indent, tail = m.group("mod"), m.group("indent"), m.group("tail")
    body = m.group("paren") if m.group("paren") is not None else m.group("plain")
    if "#" in body:  # names from one module keep their comments (the module's path is rewritten below)
        base = new_name(mod) or mod
        for n in re.findall(r"^\s*(\w[^,#\n]*)", body, re.M):
            moved = new_name(f"{mod}.{n.split()[0]}")
            if moved is not None and moved != f"{base}.{n.split()[0]}":
                raise NoPlace(f"relayout: cannot split an import with comments inside: {m.group(0)!r}")
        return m.group(0)
    names = [n.strip() for n in body.replace("\\\n", " ").split(",") if n.strip()]
    base = new_name(mod) or mod
    groups: dict[str, list[str]] = {}
    for item in names:
        name, _, alias = (p.strip() for p in item.partition(" as "))
        moved = new_name(f"{mod}.{name}")
        if moved is not None and moved != f"{base}.{name}":
            parent, _, leaf = moved.rpartition(".")
            groups.setdefault(parent, []).append(leaf if leaf == (alias or name) else f"{leaf} as {alias or name}")
        else:
            groups.setdefault(base, []).append(item)
    if list(groups) == [mod]:
        return m.group(0)  # nothing moved
    if len(groups) == 1 and m.group("paren") is not None and "\n" in body:
        ((parent, _),) = groups.items()
        return f"{indent}from {parent} import ({body}){tail}"
    lines = [f"{indent}from {parent} import {', '.join(items)}" for parent, items in sorted(groups.items())]
    lines[0] += tail
    return "\n".join(lines)


def rewrite_text(text: str) -> str:
    text = _FROM.sub(rewrite_from, text)
    text = _DOTTED.sub(lambda m: new_name(m.group(0)) or m.group(0), text)

    def slashed(m: re.Match[str]) -> str:
        moved = new_name(m.group(0).replace("/", "."))
        return moved.replace(".", "/") if moved else m.group(0)

    return _SLASHED.sub(slashed, text)


def rewrite_notebook(text: str) -> str:
    notebook = json.loads(text)
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", []))
        new = rewrite_text(source)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def files_in_scope() -> list[str]:
    tracked = git("ls-files", "--", *SCOPE).splitlines()
    return [
        p for p in tracked
        if not NOT_REWRITTEN.search(p) and Path(p).is_file() and not p.startswith("scripts/relayout")  # these scripts
    ]  # fmt: skip


def rewrite_references(root: Path) -> list[str]:
    changed = []
    for rel in files_in_scope():
        path = root / rel
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "lab_helpers" not in text and not (rel.startswith(f"{PACKAGE}/") and rel.endswith(".py")):
            continue
        new = rewrite_notebook(text) if rel.endswith(".ipynb") else rewrite_text(text)
        if rel.startswith(f"{PACKAGE}/") and rel.endswith(".py"):
            module = rel[:-3].replace("/", ".")
            if module.endswith(".__init__"):
                module = module[: -len(".__init__")]
            new = rewrite_relative_in(new, module, rel.endswith("__init__.py"))
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed


def rewrite_relative_in(text: str, module: str, is_package: bool) -> str:
    """Relative imports of a module (named by its new dotted name) that pointed at a module that moved apart."""
    old = None
    for o, n in MOVES.items():
        if module == n or module.startswith(n + "."):
            if old is None or len(n) > len(MOVES[old]):
                old = o
    old_module = old + module[len(MOVES[old]) :] if old else module

    def resolve(name: str, dots: int, rest: str | None) -> str:
        parts = name.split(".")
        keep = len(parts) - dots + (1 if is_package else 0)
        return ".".join(parts[:keep] + ([rest] if rest else []))

    def fix(m: re.Match[str]) -> str:
        dots, rest = len(m.group("dots")), m.group("mod")
        was = resolve(old_module, dots, rest)
        target = new_name(was) or was
        if target == resolve(module, dots, rest):
            return m.group(0)
        if rest is None:
            raise NoPlace(f"relayout: {module}: 'from {m.group('dots')} import' of a moved package; rewrite it by hand")
        return f"{m.group('indent')}from {target} import "

    return _RELATIVE.sub(fix, text)


# ---------------------------------------------------------------------------------------------------------------
# 3. assets/__init__: names on first use

LAZY_NOTE = """
The names below are imported on first use (PEP 562, as ``planner``'s are): the checkpoints need torch (seconds to
import), and ``python -m lab_helpers`` imports ``assets.wheelhouse`` for every command, ``results`` included.
"""

LAZY_CODE = """
from __future__ import annotations

import importlib
from typing import Any

# public name -> the submodule that defines it
_EXPORTS = {exports}

__all__ = {all_}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    value = getattr(importlib.import_module(f".{{_EXPORTS[name]}}", __name__), name)
    globals()[name] = value  # found once, then an ordinary module attribute
    return value


def __dir__() -> list[str]:
    return sorted({{*globals(), *_EXPORTS}})
"""


def lazy_assets_init(root: Path) -> bool:
    path = root / PACKAGE / "assets" / "__init__.py"
    text = path.read_text()
    tree = ast.parse(text)
    if any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS" for t in n.targets) for n in tree.body):
        return False
    doc = ast.get_docstring(tree, clean=False)
    exports: dict[str, str] = {}
    all_: list[str] | None = None
    for node in tree.body[1:]:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            exports.update({a.name: node.module for a in node.names if a.asname is None})
        elif isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__all__"]:
            all_ = ast.literal_eval(node.value)
        elif not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            raise NoPlace(f"relayout: {path}: only imports and __all__ expected, found {ast.dump(node)[:80]}")
    if doc is None or all_ is None or sorted(all_) != sorted(exports):
        raise NoPlace(f"relayout: {path}: expected a docstring, imports and an __all__ naming them")
    body = "{\n" + "".join(f'    "{k}": "{v}",\n' for k, v in exports.items()) + "}"
    all_text = "[\n" + "".join(f'    "{n}",\n' for n in all_) + "]"
    path.write_text(f'"""{doc.rstrip()}\n{LAZY_NOTE}"""\n' + LAZY_CODE.format(exports=body, all_=all_text))
    return True


# ---------------------------------------------------------------------------------------------------------------
# 4. .importlinter


# the contracts IMPORTLINTER states itself; any other contract of main's .importlinter is kept, its paths moved
OWN_CONTRACTS = ("layers", "acyclic", "planner-inputs")


def other_contracts(text: str) -> str:
    """The contracts of ``text`` (main's .importlinter) that IMPORTLINTER does not state, with moved module paths."""
    sections = re.split(r"(?m)^(?=\[)", text)
    kept = []
    for section in sections:
        m = re.match(r"\[importlinter:contract:([^\]]+)\]", section)
        if m and m.group(1) not in OWN_CONTRACTS:
            kept.append(rewrite_text(section).rstrip("\n") + "\n")
    return "".join("\n" + k for k in kept)


def write_importlinter(root: Path) -> bool:
    path = root / ".importlinter"
    old = path.read_text()
    text = IMPORTLINTER.format(layers="\n".join(f"    {layer}" for layer in LAYERS)) + other_contracts(old)
    if old == text:
        return False
    path.write_text(text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what would move; change nothing")
    args = parser.parse_args(argv)
    root = Path.cwd()
    if not (root / PACKAGE / "__init__.py").is_file() or not (root / ".git").exists():
        raise SystemExit("relayout: run it at the root of a checkout of the lab")
    todo = plan_moves(root)
    if args.check:
        for src, dst in todo:
            print(f"{src.relative_to(root)} -> {dst.relative_to(root)}")
        print(f"relayout: {len(todo)} to move")
        return 0
    do_moves(root, todo)
    changed = rewrite_references(root)
    if lazy_assets_init(root):
        changed.append(f"{PACKAGE}/assets/__init__.py")
    if write_importlinter(root):
        changed.append(".importlinter")
    python_files = sorted({p for p in changed if p.endswith(".py")})
    if python_files:
        subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I", "--fix", *python_files], check=True
        )
    top = sorted(p.name for p in (root / PACKAGE).iterdir() if p.name != "__pycache__")
    print(
        f"relayout: moved {len(todo)}, rewrote {len(changed)} files; lab_helpers/ has {len(top)} entries: "
        + " ".join(top)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
