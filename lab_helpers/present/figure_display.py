"""A matplotlib figure that shows itself as a PNG in Jupyter, whatever the backend.

Why: the lab draws on ``matplotlib.figure.Figure`` without pyplot (no GUI backend, no global state; see
lab_helpers.present.figures). IPython only has a PNG formatter for ``Figure`` once the inline backend has been activated
(``%matplotlib inline``, or pyplot imported under it). Without that, a notebook executed by nbclient, or a
JupyterLab kernel started with another ``MPLBACKEND``, shows ``<Figure size 800x240 with 1 Axes>`` instead of
the chart. IPython falls back to an object's own ``_repr_png_`` when no formatter is registered for its type,
so a figure that has one renders everywhere, and where the inline formatter is registered that one is used
(also a PNG).
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
    """A figure without pyplot; ``layout=None`` for figures that set their own margins (see
    ``figures.plot_timeline``). Returns ``(figure, axes)`` as pyplot's ``subplots`` does."""
    figure = LabFigure(figsize=(width, height), layout=layout)
    axes = figure.subplots(rows, cols, **kwargs)
    return figure, axes


def breakdown_colors() -> dict[str, str]:
    """One color per part of the memory breakdown (``record_schema.BREAKDOWN_PARTS``), the same in every figure."""
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")
    return dict(zip(BREAKDOWN_PARTS, palette, strict=True))
