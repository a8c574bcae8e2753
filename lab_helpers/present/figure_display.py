"""A matplotlib figure that shows itself as a PNG in Jupyter, whatever the backend.

Why: the lab draws on ``matplotlib.figure.Figure`` without pyplot (no GUI backend, no global state; see
lab_helpers.present.compare). IPython only has a PNG formatter for ``Figure`` once the inline backend has been activated
(``%matplotlib inline``, or pyplot imported under it). Without that, a notebook executed by nbclient, or a
JupyterLab kernel started with another ``MPLBACKEND``, shows ``<Figure size 800x240 with 1 Axes>`` instead of
the chart. IPython falls back to an object's own ``_repr_png_`` when no formatter is registered for its type,
so a figure that has one renders everywhere, and where the inline formatter is registered that one is used
(also a PNG).
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

DISPLAY_DPI = 100  # on screen; files are saved at their own dpi by the caller


class LabFigure(Figure):
    """A ``Figure`` with ``_repr_png_``: PNG bytes (drawn by Agg, no display needed) when a notebook shows it."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=DISPLAY_DPI, bbox_inches="tight")
        return buffer.getvalue()
