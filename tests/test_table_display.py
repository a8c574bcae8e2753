"""The comparison table as a person reads it (lab_helpers.present.table_display), on the shipped records.

The shipped records are the lab's own: ``ci-cpu`` recorded on a CPU by the ci profile, ``h100-80gb`` on an H100
(its OOM reason is the CUDA message as the GPU gave it). No GPU is needed to read them.
"""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from lab_helpers.present import tables
from lab_helpers.present.table_display import REASON_CHARS, first_line, format_number, readable_table


def _cpu_table() -> pd.DataFrame:
    return tables.comparison_table(tables.load_reference("ci-cpu"))


def test_a_cpu_table_shows_no_all_empty_column_and_keeps_every_column_as_data():
    table = _cpu_table()
    empty = [c for c in table.columns if table[c].isna().all()]
    assert {"peak_alloc_gib", "mfu", "gpu_used_peak_gib"} <= set(empty)  # what a CPU cannot measure
    shown = readable_table(table)
    assert not [c for c in shown.columns if (shown[c] == "").all()]
    assert not set(empty) & set(shown.columns)
    assert "NaN" not in repr(table) and "nan" not in table._repr_html_()  # the notebook and print show that view
    assert "MFU" not in repr(table) and "mfu" not in repr(table)  # never an MFU for a CPU
    assert list(table.columns) == list(tables.TABLE_COLUMNS)  # the data and the CSV keep them all
    assert "mfu" in table.to_csv(index=False).splitlines()[0]


def test_reason_is_its_first_line_and_the_record_keeps_the_whole_message():
    frame = tables.load_reference("h100-80gb")
    full = frame.loc[frame["status"] == "oom", "reason"].iloc[0]
    shown = readable_table(tables.comparison_table(frame))
    reason = shown.loc[shown["experiment"] == "baseline", "reason"].iloc[0]
    assert full.startswith("CUDA out of memory") and len(full) > REASON_CHARS
    assert "\n" not in reason and len(reason) <= REASON_CHARS and full.startswith(reason.rstrip("…"))
    assert first_line("\n  first\nsecond") == "first" and first_line(None) == ""


@pytest.mark.parametrize(
    ("column", "value", "text"),
    [
        ("tokens_per_s", 1913.4, "1,913"),  # was 1.9e+03
        ("mfu", 0.2314, "23.1%"),
        ("peak_tensor_gib", 0.03489, "0.0349"),  # CPU stand-ins: tens of MiB keep 3 digits
        ("peak_alloc_gib", 64.69, "64.7"),
        ("prediction_error_pct", -2.25, "-2.2"),
        ("flops_per_token", 6.43e9, "6.43 G"),
        ("train_s", 24.31, "24.3"),
        ("samples", 304.0, "304"),
        ("mfu", float("nan"), ""),
    ],
)
def test_numbers_are_formatted_for_people(column, value, text):
    assert format_number(column, value) == text


def test_markdown_uses_the_quantity_measured_on_that_device():
    lines = tables.markdown_table(_cpu_table()).splitlines()
    assert "measured peak GiB (peak of live tensors, CPU run)" in lines[0]
    baseline = [cell.strip() for cell in lines[2].split("|")]
    assert baseline[1:4] == ["baseline", "ok", "0.1236"]  # peak_tensor_gib, not the empty GPU column
    assert baseline[4] == "0.124"  # the prediction of the same quantity, not rounded to 0.12


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(results):
    """`compare | head -1`: head exits after one line; the writer must not print a BrokenPipeError traceback."""
    shell = f"{sys.executable} -m lab_helpers compare --reference ci-cpu | head -1"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300)
    assert result.stdout.startswith("ci-cpu.jsonl: code path only") and len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["h100-80gb", "h200-141gb", "ci-cpu"])
def test_the_terminal_table_fits_120_columns_and_wide_shows_them_all(name):
    """`compare` printed 26 columns, 419 characters wide. The terminal view keeps what a person compares
    (experiment, status, memory measured and predicted first), a cut reason where a run did not finish, and says how
    many columns --wide adds; the data keep every column."""
    from lab_helpers.present.table_display import terminal_table

    table = tables.comparison_table(tables.load_reference(name))
    text = terminal_table(table, width=120)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120, text
    header = lines[0].split()
    assert header[:2] == ["experiment", "status"] and ("peak" in header or "tensors" in header)
    assert "predicted" in header and "more columns: --wide" in lines[-1]
    assert len(lines) == len(table) + 2  # header, one line per run, the note
    wide = terminal_table(table, wide=True)
    assert max(len(line) for line in wide.splitlines()) > 120
    assert terminal_table(table, width=80).splitlines()[0].split()[:2] == ["experiment", "status"]


@pytest.mark.parametrize("name", ["h100-80gb", "h200-141gb", "ci-cpu"])
def test_the_piped_table_fits_120_columns_counted_in_bytes_too(name):
    """Piped (`compare | cat`, the width unknown), the H100 table's OOM row was 120 characters and 122
    bytes (its reason ends in "…", three bytes in UTF-8): a tool that counts bytes (awk, `cut -c`) saw 122
    columns. The terminal table now fits 120 by any count, and so do the notes under it (the steady note was 287)."""
    from lab_helpers.present.table_display import terminal_table

    table = tables.comparison_table(tables.load_reference(name))
    lines = terminal_table(table).splitlines()  # pytest's stdout is no terminal: the width is TERMINAL_WIDTH
    assert max(len(line.encode("utf-8")) for line in lines) <= 120, "\n".join(lines)
    for note in (tables.steady_notes(table), tables.cost_note(2.5)):  # the lines compare prints under it
        assert note and max(len(line.encode("utf-8")) for line in note.splitlines()) <= 120, note


ESCAPE = "\x1b[31m"


def _records_with_escapes() -> pd.DataFrame:
    """The ci reference's first run with a terminal's escape codes (and a bell, a direction override) in the
    string fields a table shows: experiment, reason, GPU name, steady basis."""
    frame = tables.load_reference("ci-cpu").drop(columns=["reference", "measured_on"], errors="ignore")
    frame = frame.drop_duplicates("experiment").head(4).reset_index(drop=True)
    frame.loc[0, "experiment"] = f"base{ESCAPE}line\x07"
    frame.loc[1, "status"] = "error"
    frame.loc[1, "reason"] = f"boom {ESCAPE}red\x1b[0m\u202e"
    frame.loc[2, "device_name"] = f"NVIDIA {ESCAPE}H100"
    frame.loc[3, "steady_basis"] = f"why {ESCAPE}"
    frame.loc[3, "steady_iter_s"] = None
    return frame


def test_a_records_escape_codes_are_shown_escaped_never_obeyed():
    """`compare` printed a record's escape codes raw, so a record could recolour or rewrite the
    reader's terminal. Every string a table shows from a record is written with its escapes (\\x1b, \\u202e)."""
    from lab_helpers.present.table_display import terminal_table

    table = tables.comparison_table(_records_with_escapes())
    shown = [
        terminal_table(table, width=200),
        terminal_table(table, wide=True),
        tables.steady_notes(table),
        tables.markdown_table(table),
        repr(table),
    ]
    for text in shown:
        assert not any(not c.isprintable() for line in text.splitlines() for c in line), repr(text)
    wide = terminal_table(table, wide=True)
    assert "base\\x1b[31mline\\x07" in wide and "boom \\x1b[31mred\\x1b[0m\\u202e" in wide
    assert "why \\x1b[31m" in tables.steady_notes(table)
    assert f"boom {ESCAPE}red\x1b[0m\u202e" in set(table["reason"].dropna())  # the data keep the record's text
    from lab_helpers.present.table_display import printable

    assert printable("plain … text") == "plain … text"
