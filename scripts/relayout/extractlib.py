"""Extract a clearly delimited block of a function into a helper function, checked, or stop.

An ``Extract`` names the function (top level, by name), the block (its first statement's first line, and either how
many statements or the first line of the statement after it), a digest of the block's text, and the helper (name,
parameters with their annotations, return annotation, docstring, the names it returns, and any imports it needs
itself). The step stops, changing nothing in that file, where

- the function, or exactly one statement starting with the anchor inside it, is not there;
- the block's text is not what the digest says (main edited inside it since: look at it and update the step);
- the block reads a local of the function that is not a parameter of the helper, or sets one the function reads
  after it that the helper does not return, or contains ``return``, ``yield``, ``break``/``continue`` of a loop
  outside it, ``global`` or ``nonlocal``.

The block moves verbatim (dedented); where it ends by assigning the one name it returns, that statement becomes
the ``return``. The helper goes right below the function (below the helpers extracted from it before).
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class Stop(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"relayout: {message}")


@dataclass(frozen=True)
class Extract:
    path: str
    function: str
    first: str  # the block's first line, stripped (a prefix of it)
    helper: str
    params: list[str]  # "name: annotation", in call order
    returns_type: str
    doc: str
    digest: str  # sha1 of the block's dedented text, first 12 hex digits
    count: int | None = None  # statements in the block; or
    until: str | None = None  # the stripped first line (prefix) of the statement after the block
    returns: list[str] = field(default_factory=list)
    prelude: list[str] = field(default_factory=list)  # import lines the helper starts with


def digest(text: str) -> str:
    return hashlib.sha1(textwrap.dedent(text).encode()).hexdigest()[:12]


def _bodies(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        body = getattr(node, name, None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            yield body
    for handler in getattr(node, "handlers", []) or []:
        yield handler.body
    for case in getattr(node, "cases", []) or []:
        yield case.body


def _statement_lists(function: ast.FunctionDef) -> Iterator[list[ast.stmt]]:
    """Every statement list of ``function`` outside nested functions and classes."""
    todo: list[ast.AST] = [function]
    while todo:
        node = todo.pop()
        for body in _bodies(node):
            yield body
            todo.extend(s for s in body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def _start(node: ast.stmt) -> int:
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)  # fmt: skip


def _bound_in_scope(scope: ast.AST) -> set[str]:
    """Names a nested scope binds itself (its arguments, assignments, imports, comprehension targets)."""
    bound: set[str] = set()
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                bound.add(a.arg)
    for node in _walk_scope(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not scope:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def _walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope, nested scopes left out (their names and decorators included)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo.extend(node.decorator_list)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _outside(node: ast.AST) -> list[ast.AST]:
    """The parts of a nested scope evaluated in the enclosing one: decorators, defaults, bases."""
    out: list[ast.AST] = list(getattr(node, "decorator_list", []))
    args = getattr(node, "args", None)
    if isinstance(args, ast.arguments):
        out += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    if isinstance(node, ast.ClassDef):
        out += [*node.bases, *(k.value for k in node.keywords)]
    return out


def _free_loads(nodes: list[ast.AST], shadow: frozenset[str] = frozenset()) -> Iterator[tuple[str, int]]:
    """(name, line) of each name read by ``nodes`` that the nodes' own nested scopes do not bind."""
    todo: list[tuple[ast.AST, frozenset[str]]] = [(node, shadow) for node in nodes]
    while todo:
        node, hidden = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in hidden:
            yield node.id, node.lineno
        if isinstance(node, _SCOPES):
            outside = _outside(node)
            todo.extend((o, hidden) for o in outside)
            inner = hidden | frozenset(_bound_in_scope(node))
            todo.extend((c, inner) for c in ast.iter_child_nodes(node) if all(c is not o for o in outside))
            continue
        todo.extend((c, hidden) for c in ast.iter_child_nodes(node))


def _stores(nodes: list[ast.stmt]) -> dict[str, int]:
    """Names the block binds in the function's own scope -> the first line binding each."""
    out: dict[str, int] = {}
    for top in nodes:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(top.name, top.lineno)
            continue
        for node in _walk_scope(top) if not isinstance(top, _SCOPES) else []:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out[node.id] = min(out.get(node.id, node.lineno), node.lineno)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(node.name, node.lineno)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    out.setdefault((a.asname or a.name).split(".")[0], node.lineno)
        if isinstance(top, (ast.Import, ast.ImportFrom)):
            for a in top.names:
                out.setdefault((a.asname or a.name).split(".")[0], top.lineno)
    return out


def _check_flow(block: list[ast.stmt], where: str) -> None:
    for top in block:
        loops = 0
        for node in _walk_scope(top) if not isinstance(top, _SCOPES) else []:
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.Await)):
                raise Stop(f"{where}: the block has {type(node).__name__.lower()}: it cannot move as it is")
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
                loops += 1
        if loops == 0 and any(isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(top)):
            raise Stop(f"{where}: the block leaves a loop outside it (break/continue)")


def find(text: str, spec: Extract) -> tuple[ast.FunctionDef, list[ast.stmt], list[ast.stmt]]:
    """The function, the block, and the statement list it is in."""
    tree = ast.parse(text)
    functions = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == spec.function
    ]
    if len(functions) != 1:
        raise Stop(f"{spec.path}: no top-level function {spec.function}() (found {len(functions)})")
    function = functions[0]
    lines = text.splitlines()
    hits = []
    for body in _statement_lists(function):
        for i, stmt in enumerate(body):
            if lines[_start(stmt) - 1].strip().startswith(spec.first):
                hits.append((body, i))
    if len(hits) != 1:
        raise Stop(f"{spec.path}: {spec.function}(): {len(hits)} statements start with {spec.first!r}, not one")
    body, i = hits[0]
    if spec.count is not None:
        block = body[i : i + spec.count]
        if len(block) != spec.count:
            raise Stop(f"{spec.path}: {spec.function}(): fewer than {spec.count} statements from {spec.first!r}")
    else:
        ends = [j for j in range(i + 1, len(body)) if lines[_start(body[j]) - 1].strip().startswith(spec.until or "")]
        if spec.until is None or not ends:
            raise Stop(f"{spec.path}: {spec.function}(): no statement {spec.until!r} after {spec.first!r}")
        block = body[i : ends[0]]
    return function, block, body


def block_text(text: str, block: list[ast.stmt]) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[_start(block[0]) - 1 : block[-1].end_lineno])


def check_names(text: str, spec: Extract, function: ast.FunctionDef, block: list[ast.stmt]) -> None:
    where = f"{spec.path}: {spec.function}() -> {spec.helper}()"
    _check_flow(block, where)
    params = [p.split(":")[0].strip() for p in spec.params]
    prelude = set()
    for line in filter(str.strip, spec.prelude):
        node = ast.parse(line.strip()).body[0]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            prelude.update((a.asname or a.name).split(".")[0] for a in node.names)
    local = _bound_in_scope(function)
    stored = _stores(block)
    needed = sorted(
        {
            name
            for name, line in _free_loads(list(block))
            if name in local and not (name in stored and stored[name] < line)
        }
    )
    if extra := [n for n in needed if n not in params and n not in prelude]:
        raise Stop(f"{where}: the block reads {', '.join(extra)} of the function; make each a parameter")
    if unused := [p for p in params if p not in needed]:
        raise Stop(f"{where}: parameter(s) {', '.join(unused)} not read by the block")
    end = block[-1].end_lineno
    later = [s for s in ast.walk(function) if isinstance(s, ast.stmt) and s.lineno > end and s is not function]
    read_after = {name for name, _ in _free_loads(later)} if later else set()
    # loads after the block, in the function's own statements (a nested scope's load counts too)
    read_after = {
        n.id for n in ast.walk(function)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.lineno > end
    } | read_after  # fmt: skip
    if missing := sorted((set(stored) & read_after) - set(spec.returns)):
        raise Stop(f"{where}: the function reads {', '.join(missing)} after the block; return it")
    if bad := [r for r in spec.returns if r not in stored]:
        raise Stop(f"{where}: the block does not set {', '.join(bad)}")


def helper_text(text: str, spec: Extract, block: list[ast.stmt]) -> str:
    body = textwrap.dedent(block_text(text, block))
    last = block[-1]
    one = spec.returns[0] if len(spec.returns) == 1 else None
    assigns_last = (
        one is not None
        and (
            (isinstance(last, ast.Assign) and len(last.targets) == 1 and getattr(last.targets[0], "id", None) == one)
            or (isinstance(last, ast.AnnAssign) and getattr(last.target, "id", None) == one and last.value is not None)
        )
        and sum(1 for name in _stores(block) if name == one) == 1
        and one not in {n for n, _ in _free_loads([last.value])}
        and not any(isinstance(n, ast.Name) and n.id == one for s in block[:-1] for n in ast.walk(s))
    )
    if assigns_last:
        body_lines = body.splitlines(keepends=True)
        offset = last.lineno - _start(block[0])
        line = body_lines[offset]
        new = re.sub(rf"^{re.escape(one)}(\s*:\s*[^=]+)?\s*=\s*", "return ", line)
        if new == line:
            raise Stop(f"{spec.path}: cannot turn {line.strip()[:60]!r} into a return")
        body_lines[offset] = new
        body = "".join(body_lines)
    elif spec.returns:
        body += f"return {', '.join(spec.returns)}\n"
    prelude = "".join(f"{line}\n" for line in spec.prelude) + ("\n" if spec.prelude else "")
    doc = textwrap.fill(" ".join(spec.doc.split()), width=117, initial_indent='    """', subsequent_indent="    ")
    doc += '"""'
    signature = f"def {spec.helper}({', '.join(spec.params)}) -> {spec.returns_type}:"
    if len(signature) > 120:
        inner = "".join(f"    {p},\n" for p in spec.params)
        signature = f"def {spec.helper}(\n{inner}) -> {spec.returns_type}:"
    return f"{signature}\n{doc}\n{textwrap.indent(prelude + body, '    ')}"


def apply(root: Path, spec: Extract, placed: dict[tuple[str, str], str]) -> str:
    """Extract one block in ``spec.path``; returns the helper's name."""
    path = root / spec.path
    text = path.read_text()
    if re.search(rf"^def {re.escape(spec.helper)}\(", text, re.M):
        raise Stop(f"{spec.path}: a function {spec.helper}() is there already")
    function, block, _ = find(text, spec)
    current = digest(block_text(text, block))
    if current != spec.digest:
        raise Stop(f"{spec.path}: {spec.function}(): the block from {spec.first!r} changed on main (digest {current}, "
                   f"expected {spec.digest}); its text now:\n{block_text(text, block)}")  # fmt: skip
    check_names(text, spec, function, block)
    helper = helper_text(text, spec, block)
    lines = text.splitlines(keepends=True)
    indent = re.match(r"[ \t]*", lines[_start(block[0]) - 1]).group(0)
    args = ", ".join(p.split(":")[0].strip() for p in spec.params)
    lhs = f"{', '.join(spec.returns)} = " if spec.returns else ""
    call = f"{indent}{lhs}{spec.helper}({args})\n"
    if len(call) > 121:  # the arguments on lines of their own, as ruff format would put them
        wrapped = textwrap.fill(args, width=120 - len(indent) - 4, break_long_words=False, break_on_hyphens=False)
        call = f"{indent}{lhs}{spec.helper}(\n{textwrap.indent(wrapped, indent + '    ')}\n{indent})\n"
    # where the helper goes: below the function, or below the last helper taken from it
    after = placed.get((spec.path, spec.function), spec.function)
    tree = ast.parse(text)
    anchor = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == after)
    insert_at = anchor.end_lineno
    start, end = _start(block[0]) - 1, block[-1].end_lineno
    new = lines[:start] + [call] + lines[end:insert_at] + ["\n\n", helper] + lines[insert_at:]
    path.write_text("".join(new))
    placed[(spec.path, spec.function)] = spec.helper
    return spec.helper


def function_lengths(text: str) -> dict[str, int]:
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node.end_lineno - node.lineno + 1
    return out
