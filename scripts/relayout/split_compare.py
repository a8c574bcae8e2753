#!/usr/bin/env python3
"""Step 3 of issue 44's relayout: ``present/compare.py`` split into ``tables.py`` and ``figures.py``.

tables: the comparison table, markdown table, one-offs, the shipped reference results and the sentences the
notebooks print. figures: every plot, the timeline, save_all. The two helpers what_if and step_memory borrowed
(``_new_figure``, ``_breakdown_colors``) join ``figure_display`` under public names, beside ``LabFigure``; the
helpers used across tables and figures get public names (``measured_memory``, ``rank0_records``, ``as_mapping``).
Every other definition moves unchanged; a definition added to compare.py on main since goes to tables unless it is
named below. Run at the root of a checkout (``--check``: only report).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from splitlib import Edit, Part, Split, run  # noqa: E402

FIGURES = [
    "NO_RUNS", "figures_dir", "_figures_dir", "_save", "_empty_plot", "plot_memory", "_legend_in_stack_order",
    "_breakdown_for", "plot_time", "_micro_batch", "_labels_with_mode", "_iqr_bars", "_bound_labels",
    "_one_off_spans", "plot_memory_vs_time", "plot_time_prediction", "read_timeline", "_timeline_path",
    "plot_timeline", "_timeline_title", "_mark_phases", "_broken_line", "_idle_spans", "save_all",
]  # fmt: skip

# added to compare.py on main after the split was first made (02bc781): moved where they are there
FIGURES_LATER = ["figures_folder", "write_figure_file", "save_table"]

TABLES_DOC = """\
The comparison table the notebooks show after a section: measured beside predicted, per experiment, and the
reference results shipped with the lab.

Why its own module: it only presents data, so it reads records (lab_helpers.record.records) and never runs anything;
a student without a GPU can point it at the reference results shipped with the lab and see the same table a GPU
node would give. Missing values stay NaN (an OOM'd run has no training time; it did not take 0 s), and runs that
did not finish keep their status. The plots of the same table are ``figures``.
"""

FIGURES_DOC = """\
The plots the notebooks show after a section: memory, time, memory against time, the time model's
prediction, and one run's timeline, from the same records as ``tables``' comparison table.

Runs that did not finish are drawn as their status text, not as an empty bar. Plots use
``matplotlib.figure.Figure`` directly rather than pyplot: no GUI backend is needed (PNG files are written with Agg
on a machine with no display) and no global figure state leaks between calls. Such a figure is not pyplot's, so
Jupyter shows it as ``<Figure size ...>`` unless something registered a PNG formatter; the figures are therefore
``LabFigure``s (``figure_display.new_figure``), which render as a PNG on their own.
"""

COMPARE = "lab_helpers/present/compare.py"

SPEC = Split(
    source="lab_helpers.present.compare",
    rest="lab_helpers.present.tables",
    rest_doc=TABLES_DOC,
    parts=[
        Part("lab_helpers.present.figures", FIGURES, FIGURES_DOC, later=FIGURES_LATER),
        Part("lab_helpers.present.figure_display", ["_new_figure", "_breakdown_colors"]),
    ],
    renames={
        "_new_figure": "new_figure",
        "_breakdown_colors": "breakdown_colors",
        "_measured_memory": "measured_memory",
        "_rank0_records": "rank0_records",
        "_mapping": "as_mapping",
    },
    edits=[
        Edit(
            COMPARE,
            '    """A figure without pyplot; ``layout=None`` for figures that set their own margins (see '
            '``plot_timeline``)."""\n    from lab_helpers.present.figure_display import LabFigure\n\n',
            '    """A figure without pyplot; ``layout=None`` for figures that set their own margins (see\n'
            '    ``figures.plot_timeline``). Returns ``(figure, axes)`` as pyplot\'s ``subplots`` does."""\n',
        ),
        Edit(
            COMPARE,
            "def _breakdown_colors() -> dict[str, str]:\n",
            "def _breakdown_colors() -> dict[str, str]:\n"
            '    """One color per part of the memory breakdown (``record_schema.BREAKDOWN_PARTS``), the same in every '
            'figure."""\n',
        ),
        Edit(
            "lab_helpers/present/figure_display.py",
            "see\nlab_helpers.present.compare)",
            "see\nlab_helpers.present.figures)",
        ),
        Edit("tests/notebook_images.py", "(``compare.plot_*``,", "(``figures.plot_*``,"),
        Edit("tests/notebook_images.py", r"^(compare\.plot_\w+|", r"^(figures\.plot_\w+|"),
    ],
)

if __name__ == "__main__":
    sys.exit(run(SPEC))
