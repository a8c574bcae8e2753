"""A matplotlib figure that shows itself as a PNG in Jupyter, whatever the backend: IPython has a PNG formatter for
``Figure`` only once the inline backend is active, so under nbclient or another ``MPLBACKEND`` a plain one shows as
``<Figure size 800x240 with 1 Axes>``. An object's own ``_repr_png_`` works everywhere.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.figure import Figure

from lab_helpers.config.record_schema import BREAKDOWN_PARTS

DISPLAY_DPI = 100  # on screen; files are saved at their own dpi by the caller


class LabFigure(Figure):
    """A ``Figure`` with ``_repr_png_``: PNG bytes (drawn by Agg, no display needed) when a notebook shows it."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=DISPLAY_DPI, bbox_inches="tight")
        return buffer.getvalue()


def new_figure(
    width: float, height: float, rows: int = 1, cols: int = 1, *, layout: str | None = "constrained", **kwargs: Any
):
    """``layout=None`` for figures that set their own margins."""
    figure = LabFigure(figsize=(width, height), layout=layout)
    axes = figure.subplots(rows, cols, **kwargs)
    return figure, axes


def breakdown_colors() -> dict[str, str]:
    """One color per part of the memory breakdown (``record_schema.BREAKDOWN_PARTS``), the same in every figure."""
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")
    return dict(zip(BREAKDOWN_PARTS, palette, strict=True))
