"""Split a module by name: whole top-level definitions move into sibling modules, every reference follows.

Used by the ``split_*.py`` steps of ``apply.sh``; each step is a ``Split`` (which names go where, the new modules'
docstrings, a few renames and exact text edits) handed to :func:`run`. Deterministic and loud: a named definition
that is not there, a text edit whose old text is not there (exactly as often as stated), an import cycle between
the pieces, a reference it cannot rewrite safely, or ruff finding a problem afterwards stops the step with the
reason. Nothing inside a moved function is edited (only renamed names), so edits made inside functions on main
since the script was written carry over unchanged.

What it does, in order:

1. the text edits stated as ``edits`` (on main's text, before anything moves);
2. cuts the source module into statements (each with the comments and blank lines above it; an attribute
   docstring stays with its assignment) and hands each to the module that receives its name;
3. writes each module: docstring, the source's imports (the ones a module does not use are dropped by ruff),
   imports of what it uses from the other pieces, its statements in their old order;
4. rewrites every reference in the tracked text files: ``from SRC import a, b`` (split by new home),
   ``SRC.name`` through any binding of the module (``from PKG import SRC [as x]``; notebooks across cells,
   Markdown included), ``setattr(SRC, "name", ...)``, dotted and slashed paths (``lab_helpers.x.SRC.name``,
   monkeypatch strings, ``python -m``, ``lab_helpers/x/SRC.py``);
5. ``ruff check --select I,F401 --fix`` on every Python file it wrote, then ``ruff check`` on them must pass.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "lab_helpers"

# Text files whose references follow a move (git-tracked, under these roots); recorded outputs are history.
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
OWN_DIR = "scripts/relayout/"

RULE = re.compile(r"# -{10,}")


class Stop(SystemExit):
    """The step cannot go on safely; the message says why (nothing after it is written)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"relayout: {message}")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` in ``path``: exactly ``count`` occurrences must be there."""

    path: str
    old: str
    new: str
    count: int = 1

    def apply(self, root: Path) -> None:
        file = root / self.path
        text = file.read_text()
        found = text.count(self.old)
        if found != self.count:
            raise Stop(f"{self.path}: expected {self.count} x {self.old[:70]!r}, found {found}; "
                       "main changed there: look at the text and update the step")  # fmt: skip
        if self.path.endswith(".ipynb"):
            file.write_text(edit_notebook(text, lambda s: s.replace(self.old, self.new)))
        else:
            file.write_text(text.replace(self.old, self.new))


def edit_notebook(text: str, change: Callable[[str], str], kinds: Iterable[str] = ("code", "markdown")) -> str:
    """The notebook with ``change`` applied to each cell's source; JSON as nbformat writes it."""
    notebook = json.loads(text)
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") not in kinds:
            continue
        source = "".join(cell.get("source", []))
        new = change(source)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
    out = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    return out


@dataclass
class Part:
    """A module that receives the top-level definitions ``names`` (a new module when ``doc`` is given, else an
    existing one, appended to)."""

    module: str
    names: list[str]
    doc: str | None = None
    later: list[str] = field(default_factory=list)  # names main added after the split was written: moved if there


@dataclass
class Split:
    source: str  # dotted name of the module that is split
    parts: list[Part]
    rest: str | None = None  # where the names not listed go: None = they stay in the source; else a new module
    rest_doc: str | None = None  # its docstring (the source is removed)
    renames: dict[str, str] = field(default_factory=dict)  # old name -> new (whole words, in the moved code)
    edits: list[Edit] = field(default_factory=list)  # exact text edits on main's text, before the split
    after: list[Edit] = field(default_factory=list)  # exact text edits once references are rewritten
    relative: bool = False  # imports between the pieces as ``from .x import`` (the planner's style)
    main_guard: str | None = None  # the module that gets ``if __name__ == "__main__":`` (default: the rest)
    imports: dict[str, list[str]] = field(default_factory=dict)  # module -> import lines it needs beyond names
    optional: bool = False  # a module main may not have yet (added later): absent, the split is skipped


def path_of(module: str) -> str:
    return module.replace(".", "/") + ".py"


def leaf(module: str) -> str:
    return module.rpartition(".")[2]


def parent(module: str) -> str:
    return module.rpartition(".")[0]


# ---------------------------------------------------------------------------------------------------------------
# cutting a module into statements


def names_of(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        out = []
        for target in node.targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    out.append(sub.id)
        return out
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__")


def is_import(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


@dataclass
class Cut:
    doc: str  # the module docstring, as written (with its quotes)
    imports: list[str]  # each top-level import statement's text
    segments: list[tuple[list[str], str, ast.stmt]]  # (names, text with the lines above it, node)


def cut(path: Path) -> Cut:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    body = tree.body
    if not body or not is_docstring(body[0]):
        raise Stop(f"{path}: no module docstring")
    doc = "".join(lines[: body[0].end_lineno])
    i = 1
    imports: list[str] = []
    while i < len(body) and is_import(body[i]):
        imports.append("".join(lines[body[i].lineno - 1 : body[i].end_lineno]))
        i += 1
    if i == 1:
        raise Stop(f"{path}: no imports after the docstring")
    prev_end = body[i - 1].end_lineno
    segments = []
    for node in body[i:]:
        if is_import(node):
            raise Stop(f"{path}:{node.lineno}: a top-level import below the definitions; move it up first")
        segments.append((names_of(node), "".join(lines[prev_end : node.end_lineno]), node))
        prev_end = node.end_lineno
    tail = "".join(lines[prev_end:])
    if tail.strip():
        names, seg, node = segments[-1]
        segments[-1] = (names, seg + tail, node)
    return Cut(doc, imports, segments)


def clean(text: str) -> str:
    """A module body: no leading blank lines, no section rule without a section under it."""
    text = re.sub(r"\A\s*", "\n\n", text)
    text = re.sub(r"# -{10,}[^\n]*\n\n\n(?=# -{10,})", "", text)
    text = re.sub(r"\n*(# -{10,}[^\n]*\n)\s*\Z", "\n", text)
    return text.rstrip() + "\n"


def rename_in(text: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def top_level_names(text: str) -> set[str]:
    """Names bound at the top of a module: definitions and imports."""
    out: set[str] = set()
    for node in ast.parse(text).body:
        out.update(names_of(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif is_import(node):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    out.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return out


def used_names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}


def annotation_only(text: str) -> set[str]:
    """Names a module's text reads only in annotations (never evaluated under ``from __future__ import
    annotations``): imported from a sibling under ``TYPE_CHECKING``, they make no import cycle."""
    tree = ast.parse(text)
    in_annotations: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, ast.arg):
            parts.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        for part in parts:
            if part is not None:
                in_annotations.update(id(n) for n in ast.walk(part))
    annotated = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) in in_annotations}
    elsewhere = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in in_annotations}
    return annotated - elsewhere


def is_reexport(import_text: str) -> bool:
    """``from x import y as y`` or an import marked ``noqa: F401``: kept for readers elsewhere."""
    if "noqa: F401" in import_text:
        return True
    node = ast.parse(import_text).body[0]
    return isinstance(node, ast.ImportFrom) and any(a.asname == a.name for a in node.names)


# ---------------------------------------------------------------------------------------------------------------
# the split


@dataclass
class Layout:
    """Where each name of the source lives after the split (for rewriting references)."""

    source: str
    order: list[str]  # the modules in the order a name the source imported is looked for
    defined: dict[str, tuple[str, str]]  # source's definition -> (module, new name)
    bound: dict[str, set[str]]  # module -> the names its final text binds
    removed: bool  # the source module is gone

    def home(self, name: str) -> tuple[str, str] | None:
        if name in self.defined:
            return self.defined[name]
        for module in self.order:
            if name in self.bound[module]:
                return module, name
        return None


def split_module(root: Path, spec: Split) -> tuple[Layout | None, list[str]]:
    src_path = root / path_of(spec.source)
    if not src_path.is_file():
        raise Stop(f"{path_of(spec.source)} is not there")
    piece = cut(src_path)
    all_names = [n for names, _, _ in piece.segments for n in names]
    for part in spec.parts:
        part.names = [*part.names, *(n for n in part.later if n in all_names and n not in part.names)]
        part.later = []
    spec.parts = [part for part in spec.parts if part.names]  # a part made only of later names not there yet
    if not spec.parts:
        return None, []
    wanted = [n for part in spec.parts for n in part.names]
    if missing := [n for n in wanted if n not in all_names]:
        raise Stop(f"{path_of(spec.source)}: no top-level definition of {', '.join(missing)}; main renamed or "
                   "removed it: update the step's list")  # fmt: skip
    if twice := sorted({n for n in wanted if wanted.count(n) > 1}):
        raise Stop(f"{', '.join(twice)} listed for two modules")
    rest = spec.rest or spec.source
    where = {n: part.module for part in spec.parts for n in part.names}

    # each statement to its module; an attribute docstring to its assignment
    chunks: dict[str, list[str]] = {rest: []} | {part.module: [] for part in spec.parts}
    last_assign: tuple[str, int] | None = None  # (module, index in its chunks) of the last assignment seen
    documented: set[tuple[str, int]] = set()
    assigns: list[tuple[str, int]] = []
    prev: ast.stmt | None = None
    for names, text, node in piece.segments:
        if names:
            homes = {where.get(n, rest) for n in names}
            if len(homes) > 1:
                raise Stop(f"{path_of(spec.source)}:{node.lineno}: one statement binds names for two modules")
            (module,) = homes
            chunks[module].append(text)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                last_assign = (module, len(chunks[module]) - 1)
                assigns.append(last_assign)
        elif is_docstring(node):
            if isinstance(prev, (ast.Assign, ast.AnnAssign)) and last_assign is not None:
                module, index = last_assign
                chunks[module][index] += text
            else:  # written below something else: back under the last assignment that has no docstring yet
                undocumented = [a for a in assigns if a not in documented]
                if not undocumented:
                    raise Stop(f"{path_of(spec.source)}:{node.lineno}: a string that documents nothing")
                module, index = last_assign = undocumented[-1]
                chunks[module][index] += text.strip("\n") + "\n"
            documented.add(last_assign)
        elif is_main_guard(node):
            chunks[spec.main_guard or rest].append(text)
        else:
            raise Stop(f"{path_of(spec.source)}:{node.lineno}: a top-level statement without a name "
                       f"({type(node).__name__}); give the step a rule for it")  # fmt: skip
        prev = node

    docs = {rest: spec.rest_doc if spec.rest else None} | {part.module: part.doc for part in spec.parts}
    bodies = {module: rename_in(clean("".join(texts)), spec.renames) for module, texts in chunks.items()}
    defined_in = {
        module: {n for node in ast.parse(body).body for n in names_of(node)} for module, body in bodies.items()
    }
    source_imports = [rename_in(t, spec.renames) for t in piece.imports]

    # the text of each module before ruff
    written: dict[str, str] = {}
    for module, body in bodies.items():
        existing = root / path_of(module)
        uses = used_names(body)
        cross, typed_block = [], ""
        typing_only = annotation_only(body) if "from __future__ import annotations" in piece.imports[0] else set()
        for other, names in defined_in.items():
            if other == module:
                continue
            needed = sorted((uses & names) - defined_in[module])
            where_from = f".{leaf(other)}" if spec.relative else other
            if runtime := [n for n in needed if n not in typing_only]:
                cross.append(f"from {where_from} import {', '.join(runtime)}\n")
            if typed := [n for n in needed if n in typing_only]:
                typed_block += f"    from {where_from} import {', '.join(typed)}\n"
        if typed_block:
            cross.append("from typing import TYPE_CHECKING\n")
        imports = [t for t in source_imports if module == rest or not is_reexport(t)]
        cross += [f"{line}\n" for line in spec.imports.get(module, [])]
        if typed_block:  # after every import (an import below an ``if`` is E402)
            cross.append(f"\nif TYPE_CHECKING:  # annotations only: no import at run time\n{typed_block}")
        if module == spec.source or docs[module] is not None:  # the source itself, or a new module
            doc = rename_in(piece.doc, spec.renames) if module == spec.source else f'"""{docs[module].rstrip()}\n"""'
            head = doc.rstrip("\n") + "\n\n" + "".join(imports) + "".join(cross)
            written[module] = head.rstrip("\n") + "\n\n\n" + body.lstrip("\n")
        else:  # an existing module receives definitions: the source's imports join its own
            if not existing.is_file():
                raise Stop(f"{path_of(module)}: not there, and the step gives it no docstring")
            old = existing.read_text()
            lines = old.splitlines(keepends=True)
            tree = ast.parse(old)
            last_import = max(n.end_lineno for n in tree.body if is_import(n))
            added = [t for t in imports if "from __future__" not in t] + cross
            new = "".join(lines[:last_import]) + "".join(added) + "".join(lines[last_import:])
            written[module] = new.rstrip("\n") + "\n\n\n" + body.lstrip("\n")

    for module, text in written.items():
        path = root / path_of(module)
        path.write_text(text)
    if spec.rest and spec.rest != spec.source:
        git("rm", "-q", "--cached", "-f", path_of(spec.source))
        src_path.unlink()
    git("add", *[path_of(m) for m in written])
    files = [path_of(m) for m in written]
    ruff_fix(files, select="I,F401")
    new_modules = [path_of(m) for m in written if docs[m] is not None]  # one name kept in parentheses: one line
    ruff_fix(new_modules, select="I", extra=["--config", "lint.isort.split-on-trailing-comma=false"])
    bound = {module: top_level_names((root / path_of(module)).read_text()) for module in written}
    check_cycles(root, spec, list(written))

    defined = {}
    for module, names in defined_in.items():
        for n in names:
            defined[n] = (module, n)
    for old, new in spec.renames.items():
        if new in defined:
            defined[old] = defined[new]
    # a name the source only imported: looked for in the rest first, then the parts in order
    order = [rest] + [p.module for p in spec.parts]
    layout = Layout(spec.source, order, defined, bound, removed=bool(spec.rest and spec.rest != spec.source))
    return layout, files


def check_cycles(root: Path, spec: Split, modules: list[str]) -> None:
    """The pieces must import each other one way only (import-linter's acyclic contract holds them to it)."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module in modules:
        tree = ast.parse((root / path_of(module)).read_text())
        typing_blocks = [n for n in tree.body if is_import(n) and isinstance(n, ast.If)]
        for node in ast.walk(tree):
            if any(node in ast.walk(block) for block in typing_blocks):
                continue  # under TYPE_CHECKING: no import at run time, none for import-linter either
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level:
                    target = parent(module) + ("." + target if target else "")
                for m in modules:
                    if m == module:
                        continue
                    if target == m or (target == parent(m) and any(a.name == leaf(m) for a in node.names)):
                        edges[module].add(m)
    for a in modules:
        for b in edges[a]:
            if a in edges[b]:
                raise Stop(f"{a} and {b} would import each other: move the shared definitions to one of them")


def ruff_fix(files: list[str], select: str, extra: list[str] | None = None) -> None:
    py = [f for f in files if f.endswith(".py")]
    if not py:
        return
    fix = [sys.executable, "-m", "ruff", "check", "--quiet", *(extra or []), "--select", select, "--fix", *py]
    subprocess.run(fix, check=False)
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", *py], capture_output=True, text=True)
    if found.returncode != 0:
        raise Stop("ruff finds problems in what the step wrote:\n" + found.stdout[-3000:] + found.stderr[-1000:])


# ---------------------------------------------------------------------------------------------------------------
# references


_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of one function (or the module) outside the functions nested in it."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return out


def shadowed(text: str, name: str, attributes: set[str]) -> bool:
    """Whether a function (or the module) of a Python file both reads ``name.attr`` (``attr`` one of
    ``attributes``, the module's names) and binds ``name`` otherwise than by importing it: the module of that name
    would be hidden there."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for scope in ast.walk(tree):
        if not isinstance(scope, _SCOPES):
            continue
        own = _own_nodes(scope)
        reads = any(
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == name
            and n.attr in attributes
            for n in own
        )
        binds = any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name for n in own)
        if not isinstance(scope, ast.Module):
            binds = binds or any(isinstance(n, ast.arg) and n.arg == name for n in ast.walk(scope.args))
        if reads and binds:
            return True
    return False
    for scope in ast.walk(tree):
        if not isinstance(scope, _SCOPES):
            continue
        own = _own_nodes(scope)
        reads = any(
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == name
            and n.attr in attributes
            for n in own
        )
        binds = any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name for n in own)
        binds = (
            binds or any(isinstance(n, ast.arg) and n.arg == name for n in ast.walk(scope.args))
            if not isinstance(scope, ast.Module)
            else binds
        )
        if reads and binds:
            return True
    return False


_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>[\w.]+)[ \t]+import[ \t]+"
    r"(?:\((?P<pcomment>[ \t]*#[^\n]*)?(?P<paren>[^)]*)\)|(?P<plain>[^\n#;()]*?))(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.M,
)


def _items(body: str) -> list[str]:
    body = re.sub(r"#[^\n]*", "", body)
    return [n.strip() for n in body.replace("\\\n", " ").split(",") if n.strip()]


def _format_from(indent: str, module: str, items: list[str], multiline: bool, comment: str) -> str:
    if multiline:
        inner = "".join(f"{indent}    {item},\n" for item in items)
        return f"{indent}from {module} import ({comment}\n{inner}{indent})"
    return f"{indent}from {module} import {', '.join(items)}{comment}"


class Rewriter:
    """Rewrites the references to a split module in one file's text (a notebook: all its cells at once)."""

    def __init__(self, layout: Layout, renames: dict[str, str]) -> None:
        self.layout = layout
        self.renames = renames
        self.src = layout.source
        self.pkg = parent(layout.source)
        self.renamed_here: dict[str, str] = {}

    def new_home(self, name: str, where: str) -> tuple[str, str]:
        home = self.layout.home(name)
        if home is None:
            raise Stop(f"{where}: {self.src}.{name} has no home after the split")
        return home

    # from SRC import a, b
    def from_imports(self, text: str, where: str, module_name: str | None = None) -> str:
        def fix(m: re.Match[str]) -> str:
            mod = m.group("mod")
            if mod.startswith("."):
                return m.group(0)
            if mod != self.src:
                return m.group(0)
            paren = m.group("paren")
            body = paren if paren is not None else m.group("plain")
            multiline = paren is not None and "\n" in paren
            comment = (m.group("pcomment") or "") if paren is not None else ""
            tail = m.group("tail") or ""
            groups: dict[str, list[str]] = {}
            for item in _items(body):
                name, _, alias = (p.strip() for p in item.partition(" as "))
                module, new = self.new_home(name, where)
                shown = new if not alias else f"{new} as {alias}"
                if not alias and new != name:
                    self.renamed_here[name] = new
                groups.setdefault(module, []).append(shown)
            if list(groups) == [self.src] and not self.renames:
                return m.group(0)
            out = []
            for module, items in sorted(groups.items()):
                if multiline and len(items) > 3:  # a short group on one line (ruff wraps a long one)
                    out.append(_format_from(m.group("indent"), module, items, True, comment) + tail)
                else:
                    out.append(_format_from(m.group("indent"), module, items, False, comment.rstrip() or tail))
            return "\n".join(out)

        return _FROM.sub(fix, text)

    def bindings(self, text: str) -> list[str]:
        """The names a file binds the source module to (``from PKG import SRC [as x]``, ``import SRC as x``)."""
        out = []
        for m in _FROM.finditer(text):
            if m.group("mod") != self.pkg:
                continue
            body = m.group("paren") if m.group("paren") is not None else m.group("plain")
            for item in _items(body):
                name, _, alias = (p.strip() for p in item.partition(" as "))
                if name == leaf(self.src):
                    out.append(alias or name)
        for m in re.finditer(rf"^[ \t]*import[ \t]+{re.escape(self.src)}[ \t]+as[ \t]+(\w+)", text, re.M):
            out.append(m.group(1))
        return sorted(set(out))

    def attributes(self, text: str, binding: str, where: str) -> tuple[str, set[str], bool]:
        """``binding.name`` -> ``newleaf.newname``; returns the text, the new modules used, and whether the source
        is still used through ``binding``."""
        used: set[str] = set()
        keep = False
        known = set(self.layout.defined) | set().union(*self.layout.bound.values()) | set(self.renames)

        def fix(m: re.Match[str]) -> str:
            nonlocal keep
            name = m.group(1)
            if name not in known:
                keep = True
                return m.group(0)
            module, new = self.new_home(name, where)
            if module == self.src:
                keep = True
                return f"{binding}.{new}"
            used.add(module)
            return f"{leaf(module)}.{new}"

        text = re.sub(rf"(?<![\w.]){re.escape(binding)}\.(\w+)", fix, text)

        def fix_setattr(m: re.Match[str]) -> str:
            nonlocal keep
            name = m.group("name")
            if name not in known:
                keep = True
                return m.group(0)
            module, new = self.new_home(name, where)
            if module == self.src:
                keep = True
                return f"{m.group('head')}{binding}{m.group('sep')}{m.group('q')}{new}{m.group('q')}"
            used.add(module)
            return f"{m.group('head')}{leaf(module)}{m.group('sep')}{m.group('q')}{new}{m.group('q')}"

        text = re.sub(
            rf"(?P<head>setattr\(\s*){re.escape(binding)}(?P<sep>\s*,\s*)(?P<q>[\"'])(?P<name>\w+)(?P=q)",
            fix_setattr,
            text,
        )
        # any other use of the binding (passed as an object, a local of the same name): keep the import
        rest = re.sub(rf"^[ \t]*from[ \t]+{re.escape(self.pkg)}[ \t]+import[^\n]*", "", text, flags=re.M)
        if re.search(rf"(?<![\w.]){re.escape(binding)}(?![\w])(?!\.)", rest):
            keep = True
        return text, used, keep

    def module_imports(self, text: str, binding: str, used: set[str], keep: bool, where: str) -> str:
        """``from PKG import ..., SRC, ...``: the new modules used join, SRC leaves when nothing uses it."""
        for module in used:
            if parent(module) != self.pkg:
                raise Stop(f"{where}: {module} is not beside {self.src}")
            if where.endswith(".py") and shadowed(text, leaf(module), self.layout.bound.get(module, set())):
                raise Stop(f"{where}: a function there binds {leaf(module)} itself and reads {leaf(module)}.X")

        def fix(m: re.Match[str]) -> str:
            if m.group("mod") != self.pkg:
                return m.group(0)
            paren = m.group("paren")
            body = paren if paren is not None else m.group("plain")
            items = _items(body)
            mine = [i for i in items if i.partition(" as ")[0].strip() == leaf(self.src)
                    and (i.partition(" as ")[2].strip() or leaf(self.src)) == binding]  # fmt: skip
            if not mine:
                return m.group(0)
            others = [i for i in items if i not in mine]
            new_items = list(others)
            if keep and not self.layout.removed:
                new_items += mine
            for module in sorted(used):
                if leaf(module) not in [i.partition(" as ")[2].strip() or i for i in new_items]:
                    new_items.append(leaf(module))
            if items == sorted(items, key=str.lower) or items == sorted(items):
                new_items = (
                    sorted(new_items, key=lambda s: s.lower())
                    if items == sorted(items, key=str.lower)
                    else sorted(new_items)
                )
            if not new_items:
                return "" if not m.group("tail") else m.group(0)
            indent, tail = m.group("indent"), m.group("tail") or ""
            if paren is not None and "\n" in paren:
                return _format_from(indent, self.pkg, new_items, True, m.group("pcomment") or "") + tail
            return _format_from(indent, self.pkg, new_items, False, tail)

        return _FROM.sub(fix, text)

    def dotted(self, text: str, where: str) -> str:
        known = set(self.layout.defined) | set().union(*self.layout.bound.values()) | set(self.renames)
        rest = self.layout.order[0]

        def fix(m: re.Match[str]) -> str:
            name = m.group(1)
            if name and name[1:] in known:
                module, new = self.new_home(name[1:], where)
                return f"{module}.{new}"
            if self.layout.removed:
                return rest + (name or "")
            return m.group(0)

        text = re.sub(rf"(?<![\w.]){re.escape(self.src)}(\.\w+)?(?![\w])", fix, text)
        if self.layout.removed:
            text = re.sub(rf"(?<![\w./]){re.escape(self.src.replace('.', '/'))}\.py\b", path_of(rest), text)
        return text

    def rewrite(self, text: str, where: str) -> str:
        self.renamed_here = {}
        new = self.from_imports(text, where)
        new = self.bare_renames(new)
        new = self.attributes_and_imports(new, where)
        return self.dotted(new, where)

    def bare_renames(self, text: str) -> str:
        """A renamed name imported by name is renamed where the file uses it too."""
        for old, new in self.renamed_here.items():
            text = re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, text)
        return text

    def attributes_and_imports(self, text: str, where: str) -> str:
        for binding in self.bindings(text):
            text, used, keep = self.attributes(text, binding, where)
            text = self.module_imports(text, binding, used, keep, where)
        return text


def rewrite_notebook(rw: Rewriter, text: str, where: str) -> str:
    notebook = json.loads(text)
    cells = notebook.get("cells", [])
    sources = ["".join(c.get("source", [])) for c in cells]
    code = "\n".join(s for s, c in zip(sources, cells, strict=True) if c.get("cell_type") == "code")
    rw.renamed_here = {}
    news = [rw.from_imports(s, where) for s in sources]
    news = [rw.bare_renames(s) for s in news]
    for binding in rw.bindings(code):
        used: set[str] = set()
        keep = False
        for i, s in enumerate(news):
            news[i], u, k = rw.attributes(s, binding, where)
            used |= u
            keep = keep or (k and cells[i].get("cell_type") == "code")
        news = [rw.module_imports(s, binding, used, keep, where) for s in news]
    news = [rw.dotted(s, where) for s in news]
    for cell, old, new in zip(cells, sources, news, strict=True):
        if new != old:
            cell["source"] = new.splitlines(keepends=True)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def files_in_scope(root: Path) -> list[str]:
    tracked = git("ls-files", "--", *SCOPE).splitlines()
    return [p for p in tracked if not NOT_REWRITTEN.search(p) and not p.startswith(OWN_DIR) and (root / p).is_file()]


def rewrite_references(root: Path, layout: Layout, renames: dict[str, str], skip: set[str]) -> list[str]:
    rw = Rewriter(layout, renames)
    changed = []
    for rel in files_in_scope(root):
        if rel in skip:
            continue
        path = root / rel
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if leaf(layout.source) not in text:
            continue
        if rel.endswith(".ipynb"):
            new = rewrite_notebook(rw, text, rel)
        else:
            new = rw.rewrite(text, rel)
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed


def check(root: Path, spec: Split) -> bool:
    """Say what ``spec`` would do here; False where a name or an edit it expects is not there."""
    path = root / path_of(spec.source)
    if not path.is_file():
        print(f"  {path_of(spec.source)}: not there" + (": skipped" if spec.optional else ": STOP"))
        return spec.optional
    ok = True
    piece = cut(path)
    present = {n for names, _, _ in piece.segments for n in names}
    for edit in spec.edits:
        text = (root / edit.path).read_text() if (root / edit.path).is_file() else ""
        found = text.count(edit.old)
        ok = ok and found == edit.count
        state = "ok" if found == edit.count else f"EXPECTED {edit.count}x, FOUND {found}x"
        print(f"  edit {edit.path}: {edit.old.strip()[:60]!r}: {state}")
    for part in spec.parts:
        missing = [n for n in part.names if n not in present]
        later = [n for n in part.later if n in present]
        ok = ok and not missing
        print(f"  {path_of(spec.source)} -> {path_of(part.module)}: {len(part.names) + len(later)} definitions"
              + (f" ({len(later)} of them added on main later)" if later else "")
              + (f"; MISSING {', '.join(missing)}" if missing else ""))  # fmt: skip
    stays = sorted(present - {n for part in spec.parts for n in [*part.names, *part.later]})
    into = path_of(spec.rest) + " (the source is removed)" if spec.rest else path_of(spec.source)
    print(f"  stays in {into}: {len(stays)} definitions")
    return ok


def apply(root: Path, spec: Split) -> None:
    if spec.optional and not (root / path_of(spec.source)).is_file():
        print(f"relayout: {path_of(spec.source)} is not there: its split is skipped")
        return
    for edit in spec.edits:
        edit.apply(root)
    layout, files = split_module(root, spec)
    if layout is None:
        print(f"relayout: {path_of(spec.source)}: none of the names to move is there: nothing to split")
        return
    skip = set(files) | {path_of(spec.source)}
    changed = rewrite_references(root, layout, spec.renames, skip)
    for edit in spec.after:
        edit.apply(root)
    touched = sorted(p for p in set(changed) | {e.path for e in spec.edits + spec.after} if (root / p).is_file())
    ruff_fix([f for f in touched if f.endswith(".py") and not f.endswith("__init__.py")], select="I,F401")
    ruff_fix([f for f in touched if f.endswith("__init__.py")], select="I")
    sizes = ", ".join(f"{f} {len((root / f).read_text().splitlines())}" for f in files)
    print(f"relayout: split {path_of(spec.source)}: {sizes}; rewrote {len(changed)} files")


def run(*specs: Split, argv: list[str] | None = None) -> int:
    """Apply each spec in turn at the root of a checkout (``--check``: only say what would move where)."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path.cwd()
    if not (root / PACKAGE / "__init__.py").is_file():
        raise Stop("run it at the root of a checkout of the lab")
    if "--check" in args:
        results = [check(root, spec) for spec in specs]
        return 0 if all(results) else 1
    for spec in specs:
        apply(root, spec)
    return 0
