"""The figures written by the rule of every folder and file the lab writes: one it cannot write is one line naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.paths import describe_os_error, lab_folder, results_dir, shown_path, write_lab_file


def made_figures_dir(out_dir: Path | str | None) -> Path:
    if out_dir is not None and not str(out_dir).strip():  # `--out "$FIGURES"` unset: Path("") is the working folder
        raise LabConfigError("figures folder: an empty name (an unset variable?); give a folder, or leave --out out "
                             "for results/figures")  # fmt: skip
    folder = Path(out_dir) if out_dir is not None else results_dir() / "figures"
    results = results_dir()  # in it, figures/ is a real folder: a link there sent the CSV and figures elsewhere
    inside = results if Path(os.path.abspath(folder)).is_relative_to(os.path.abspath(results)) else None
    try:
        return lab_folder(folder, inside=inside)
    except OSError as exc:
        raise LabConfigError(f"figures folder {shown_path(folder)}: {describe_os_error(exc)}") from None


def write_figure_file(folder: Path | str | None, filename: str, data) -> Path:
    path = made_figures_dir(folder) / filename
    try:
        return write_lab_file(path, data)
    except OSError as exc:
        raise LabConfigError(f"{shown_path(path)}: not written: {describe_os_error(exc)}") from None


def save_table(table: pd.DataFrame, folder: Path | str | None) -> Path:
    return write_figure_file(folder, "comparison.csv", table.to_csv(index=False).encode())


def save_figure(figure: Any, out_dir: Path | str | None, filename: str) -> Any:
    path = write_figure_file(out_dir, filename, lambda fh: figure.savefig(fh, format="png", dpi=110))
    figure.lab_path = path  # where it went, for save_all and for the notebook to show
    return figure
