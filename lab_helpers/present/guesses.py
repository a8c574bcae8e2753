"""Guess first, then compare: the student's number beside the prediction and the measurement, so they see how far
their own model of memory was off, and which way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

GUESS_COLUMNS = (
    "experiment",
    "status",
    "your_guess_gib",
    "predicted_peak_alloc_gib",
    "measured_peak_gib",
    "measured_as",
    "guess_off_pct",
)


def check_guess(guess_gib: Any) -> float | None:
    """The guess as GiB, or None where the student left it blank; a clear one-line error for anything else."""
    if guess_gib is None:
        return None
    if isinstance(guess_gib, bool) or not isinstance(guess_gib, (int, float)) or not guess_gib > 0:
        raise ValueError(f"a guess is a number of GiB above 0 (e.g. 12.5) or None; got {guess_gib!r}")
    return float(guess_gib)


def measured_peak(record: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """``peak_tensor_gib`` on a CPU: the live tensor bytes the planner predicts there."""
    for field in ("peak_alloc_gib", "peak_tensor_gib"):
        value = record.get(field)
        if isinstance(value, (int, float)) and value == value:  # not NaN
            return float(value), field
    return None, None


def guess_table(records: Iterable[Mapping[str, Any]], guess_gib: float | None) -> pd.DataFrame:
    """The largest peak over ranks: the rank that runs out first decides. Positive: the guess was too high."""
    guess = check_guess(guess_gib)
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        exp_id = str(record.get("experiment"))
        measured, field = measured_peak(record)
        row = rows.setdefault(
            exp_id,
            {
                "experiment": exp_id,
                "status": record.get("status"),
                "your_guess_gib": guess,
                "predicted_peak_alloc_gib": record.get("predicted_peak_alloc_gib"),
                "measured_peak_gib": None,
                "measured_as": field,
            },
        )
        if measured is not None and (row["measured_peak_gib"] is None or measured > row["measured_peak_gib"]):
            row["measured_peak_gib"], row["measured_as"] = measured, field
    for row in rows.values():
        measured = row["measured_peak_gib"]
        row["guess_off_pct"] = None if guess is None or not measured else 100 * (guess - measured) / measured
    return pd.DataFrame(list(rows.values()), columns=list(GUESS_COLUMNS)).astype(
        {c: float for c in ("your_guess_gib", "predicted_peak_alloc_gib", "measured_peak_gib", "guess_off_pct")}
    )
