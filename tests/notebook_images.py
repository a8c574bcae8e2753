"""Which notebook cells draw, and whether an executed cell showed its drawing as an image.

Shared by the image check that runs inside every nbval execution of the notebooks (notebooks/conftest.py) and by
tests/test_notebook_figures.py. A cell "draws" when it calls one of the lab's drawing functions
(``figures.plot_*``, ``what_if.show``, ``what_if.draw_answer``, ``lab.plot_step``), read from the cell's
syntax tree: a call that is commented out does not count. Such a cell must leave an ``image/png`` output: a bare
``<Figure size ...>`` text is what a student saw when the figures were not displayable. The one way out is a
cell that says in its own output that there is nothing to draw (03's timeline cell when the chosen experiment
has no finished run), so the student is told why no chart appears.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from typing import Any

DRAWING_CALL = re.compile(r"^(figures\.plot_\w+|what_if\.show|what_if\.draw_answer|lab\.plot_step)$")
SAYS_NOTHING_TO_DRAW = re.compile(r"\bto draw\b")


def draws(source: str) -> bool:
    """True when the cell's code calls a drawing function (IPython magics and shell lines left out)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.Call) and DRAWING_CALL.match(ast.unparse(node.func)) for node in ast.walk(tree)
    )


def has_image(outputs: Iterable[Mapping[str, Any]]) -> bool:
    return any("image/png" in (output.get("data") or {}) for output in outputs)


def missing_image(source: str, outputs: Iterable[Mapping[str, Any]]) -> str | None:
    """Why this executed cell fails the check, or None: a drawing cell with no ``image/png`` output that does
    not say there was nothing to draw."""
    outputs = list(outputs)
    if not draws(source) or has_image(outputs):
        return None
    said = "".join(str(output.get("text", "")) for output in outputs if output.get("output_type") == "stream")
    if SAYS_NOTHING_TO_DRAW.search(said):
        return None
    shown = [
        (output.get("data") or {}).get("text/plain", output.get("text", ""))
        for output in outputs
        if output.get("output_type") in ("display_data", "execute_result", "stream")
    ]
    return f"a drawing cell showed no image/png; it showed {shown!r}"
