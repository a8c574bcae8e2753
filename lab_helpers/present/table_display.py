"""The comparison table as a person reads it, while its data (``table["mfu"]``, ``to_csv``) stay complete. Raw, a CPU's
table is ~250 characters wide: a third of its columns NaN, whole OOM messages in ``reason``.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from typing import Any

import pandas as pd

from lab_helpers.planning.cost import usd_text

REASON_CHARS = 72  # a reason is the first line of the record's text, cut here; the record keeps all of it
TEXT_COLUMNS = ("experiment", "gpu", "status", "bound", "steady_basis", "reason")
TERMINAL_WIDTH = 120  # where the terminal's width is not known (a pipe, a log, CI)
TERMINAL_COLUMNS = (
    "experiment", "gpu", "status", "cost_usd", "peak_alloc_gib", "peak_tensor_gib", "predicted_peak_alloc_gib",
    "prediction_error_pct", "ms_per_sample", "steady_ms_per_sample", "first_seen_count", "tokens_per_s_padded",
    "gpu_busy_pct", "bound", "mfu", "padding_pct", "train_s",
)  # fmt: skip
"""In the order they are kept while the width allows; the reason fills what is left. ``--wide`` shows all."""
MIN_REASON_CHARS = 20
TERMINAL_HEADERS = {
    "peak_alloc_gib": "peak GiB", "peak_tensor_gib": "tensors GiB", "predicted_peak_alloc_gib": "predicted GiB",
    "prediction_error_pct": "error %", "ms_per_sample": "ms/sample", "steady_ms_per_sample": "steady ms/sample",
    "first_seen_count": "first-seen", "tokens_per_s_padded": "padded tok/s",
    "gpu_busy_pct": "GPU busy %", "padding_pct": "padding %", "train_s": "train s", "mfu": "MFU",
    "cost_usd": "cost USD",
}  # fmt: skip
SIMULATED_LABEL = re.compile(r" \(simulated rank 0 of (\d+), no communication\)")


def readable_table(table: pd.DataFrame) -> pd.DataFrame:
    shown = pd.DataFrame(table).copy()
    empty = [column for column in shown.columns if shown[column].map(_is_missing).all()]
    shown = shown.drop(columns=empty)
    for column in shown.columns:
        if column == "reason":
            shown[column] = shown[column].map(first_line)
        elif column not in TEXT_COLUMNS:
            shown[column] = shown[column].map(lambda value, c=column: format_number(c, value))
        else:
            shown[column] = shown[column].map(lambda value: "" if _is_missing(value) else printable(str(value)))
    return shown


def printable(text: str) -> str:
    """A record's field holding an escape code, a bell or a direction override is shown, never obeyed."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _columns(line: str) -> int:
    """UTF-8 bytes: a tool that counts bytes (awk, ``cut -c``) saw a 120-character line with a "…" as 122."""
    return len(line.encode("utf-8"))


def terminal_table(table: pd.DataFrame, *, width: int | None = None, wide: bool = False) -> str:
    """``wide``: every column (the CSV always has them all)."""
    shown = readable_table(table)
    if wide or not len(shown):
        return shown.to_string(index=False)
    if "experiment" in shown.columns:  # "fsdp (simulated rank 0 of 4, no communication)" -> "fsdp (sim. 0 of 4)"
        shown["experiment"] = shown["experiment"].map(lambda name: SIMULATED_LABEL.sub(r" (sim. 0 of \1)", name))
    shown = shown.rename(columns=TERMINAL_HEADERS)
    keep = [TERMINAL_HEADERS.get(c, c) for c in TERMINAL_COLUMNS]
    if width is None:
        width = shutil.get_terminal_size((TERMINAL_WIDTH, 24)).columns if sys.stdout.isatty() else TERMINAL_WIDTH

    def widest(columns: list[str]) -> int:
        return max(_columns(line) for line in shown[columns].to_string(index=False).splitlines())

    chosen: list[str] = []
    for column in (c for c in keep if c in shown.columns):
        if column in ("experiment", "gpu", "status") or widest([*chosen, column]) <= width:
            chosen.append(column)
    left = width - widest(chosen) - 1  # one space between columns
    if "reason" in shown.columns and shown["reason"].astype(bool).any() and left >= MIN_REASON_CHARS:
        reasons = shown["reason"]
        while left >= MIN_REASON_CHARS:  # the reason cut to what is left of the width, as the table lays it out
            shown["reason"] = reasons.map(lambda text, limit=left: first_line(text, limit=limit))
            if (over := widest([*chosen, "reason"]) - width) <= 0:
                chosen.append("reason")
                break
            left -= over
    text = shown[chosen].to_string(index=False)
    if omitted := len(shown.columns) - len(chosen):
        text += f"\n({omitted} more columns: --wide shows them, and the CSV has them all)"
    return text


def first_line(text: Any, limit: int = REASON_CHARS) -> str:
    """A CUDA OOM message is a paragraph."""
    if _is_missing(text):
        return ""
    line = printable(next((part.strip() for part in str(text).splitlines() if part.strip()), ""))
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def format_number(column: str, value: Any) -> str:
    """By the column's name: GiB with the digits its size needs, as CPU stand-ins are tens of MiB."""
    if _is_missing(value):
        return ""
    if isinstance(value, str):
        return printable(value)
    number = float(value)
    if column == "mfu":
        return f"{number:.1%}"
    if column == "cost_usd":
        return usd_text(number)
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
    if column.endswith(("_s", "_ms", "_ms_per_sample")) or column.startswith("ms_"):
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
    """Shown as ``readable_table``; anything computed from it works on the complete data."""

    @property
    def _constructor(self):
        return ComparisonTable

    def readable(self) -> pd.DataFrame:
        return readable_table(pd.DataFrame(self))

    def __repr__(self) -> str:
        return self.readable().to_string(index=False) if len(self) else pd.DataFrame(self).__repr__()

    def _repr_html_(self) -> str:
        return self.readable().to_html(index=False) if len(self) else pd.DataFrame(self)._repr_html_()
