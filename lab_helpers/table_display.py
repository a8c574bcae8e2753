"""The comparison table as a person reads it: no all-empty columns, one line of ``reason``, numbers for people.

Why its own module: the table (lab_helpers.compare.comparison_table) keeps every column and full values for code,
the CSV and the records' readers; only what is *shown* changes. On a CPU, a table of 20-odd columns, a third of
them NaN (no GPU memory, no MFU), with whole CUDA OOM messages in ``reason`` and ``1.9e+03`` for a throughput, was
about 250 characters wide. ``readable_table`` gives the shown view; ``ComparisonTable`` is a DataFrame that shows
itself that way in a notebook and in ``print``, while its data (``table["mfu"]``, ``to_csv``) stay complete.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

REASON_CHARS = 72  # a reason is the first line of the record's text, cut here; the record keeps all of it
TEXT_COLUMNS = ("experiment", "status", "bound", "reason")


def readable_table(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` for reading: columns that are empty in every row dropped, ``reason`` shortened to its
    first line, each number formatted by what it measures (its column's unit suffix) and missing values blank."""
    shown = pd.DataFrame(table).copy()
    empty = [column for column in shown.columns if shown[column].map(_is_missing).all()]
    shown = shown.drop(columns=empty)
    for column in shown.columns:
        if column == "reason":
            shown[column] = shown[column].map(first_line)
        elif column not in TEXT_COLUMNS:
            shown[column] = shown[column].map(lambda value, c=column: format_number(c, value))
        else:
            shown[column] = shown[column].map(lambda value: "" if _is_missing(value) else str(value))
    return shown


def first_line(text: Any, limit: int = REASON_CHARS) -> str:
    """The first non-empty line of a reason (a CUDA OOM message is a paragraph), at most ``limit`` characters."""
    if _is_missing(text):
        return ""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def format_number(column: str, value: Any) -> str:
    """One number as a person reads it, chosen by the column's name: GiB with the digits its size needs (CPU
    stand-ins are tens of MiB), throughput with thousands separators, MFU as a percentage, FLOPs with an SI
    prefix, counts as integers; blank when missing."""
    if _is_missing(value):
        return ""
    if isinstance(value, str):
        return value
    number = float(value)
    if column == "mfu":
        return f"{number:.1%}"
    if column.startswith("tokens_per_s"):
        return f"{number:,.0f}"
    if "flops" in column:
        return _si(number)
    if column == "prediction_error_pct":
        return f"{number:+.1f}"
    if column.endswith("_pct"):
        return f"{number:.0f}" if abs(number) >= 10 else f"{number:.1f}"
    if column.endswith("_gib"):
        return f"{number:.1f}" if number >= 10 else f"{number:#.3g}"
    if column in ("samples",) or column.endswith("_count"):
        return f"{number:,.0f}"
    if column.endswith(("_s", "_ms")) or column.startswith("ms_"):
        return f"{number:,.0f}" if number >= 100 else f"{number:#.3g}"
    return f"{number:.4g}"


def _si(number: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= factor:
            return f"{number / factor:.3g} {prefix}"
    return f"{number:.3g}"


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value == ""


class ComparisonTable(pd.DataFrame):
    """The comparison table: every column and full value as data, shown as ``readable_table`` (notebook HTML, repr,
    ``print``). Anything computed from it (a filter, a column, ``to_csv``) works on the complete data."""

    @property
    def _constructor(self):
        return ComparisonTable

    def readable(self) -> pd.DataFrame:
        return readable_table(pd.DataFrame(self))

    def __repr__(self) -> str:
        return self.readable().to_string(index=False) if len(self) else pd.DataFrame(self).__repr__()

    def _repr_html_(self) -> str:
        return self.readable().to_html(index=False) if len(self) else pd.DataFrame(self)._repr_html_()
