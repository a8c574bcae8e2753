"""The record schema: one table of fields and units that every writer and reader of a run record uses."""

from __future__ import annotations

import json

import pytest

from lab_helpers.config import record_schema as schema
from lab_helpers.config.paths import lab_home
from lab_helpers.record.records import append_record, load_results, read_records

REFERENCE = lab_home() / "reference_results" / "ci-cpu.jsonl"


def test_the_committed_reference_results_load_through_the_schema():
    """Records written by an earlier lab (the reference file shipped with it) still read, field for field."""
    raw = [json.loads(line) for line in REFERENCE.read_text().splitlines() if line.strip()]
    assert raw, "the reference file holds records"
    for record in raw:
        assert schema.record_problems(record) == [], record["experiment"]
    frame = load_results(REFERENCE)
    assert len(frame) == len(raw)
    assert set(schema.RECORD_FIELD_NAMES) <= set(frame.columns)  # older records get the newer fields as None
    assert list(frame["experiment"]) == [r["experiment"] for r in raw]


def test_record_problems_names_unknown_fields_and_non_numbers():
    bad = {"experiment": "x", "status": "ok", "peak_alloc_gib": "3 GiB", "peak_alloc_gb": 3.0}
    problems = schema.record_problems(bad)
    assert "unknown field 'peak_alloc_gb'" in problems
    assert any(p.startswith("peak_alloc_gib (GiB) is not a number") for p in problems)
    assert schema.record_problems({"status": "finished"}) == ["status 'finished' is not one of " + ", ".join(schema.STATUSES)]


def test_mfu_is_derived_when_reading_from_the_stored_inputs(tmp_path):
    """A record stores FLOPs per step and the peak-table entry; MFU is worked out by the reader, like tokens/s."""
    path = tmp_path / "runs.jsonl"
    append_record({"experiment": "x", "status": "ok", "flops_per_step": 2e12, "iterations": 10, "train_s": 4.0,
                   "gpu_peak_flops": 1e15}, path=path)  # fmt: skip
    append_record({"experiment": "y", "status": "ok", "flops_per_step": None, "iterations": 10, "train_s": 4.0,
                   "gpu_peak_flops": 1e15}, path=path)  # fmt: skip
    assert "mfu" not in read_records(path)[0]
    frame = load_results(path)
    assert frame.loc[0, "mfu"] == pytest.approx(2e12 * 10 / 4.0 / 1e15)
    assert frame.loc[1, "mfu"] is None or frame["mfu"].isna()[1]  # unknown, never 0


def test_readers_name_only_schema_fields():
    """The comparison table and the multi-GPU notebook's rows read fields the schema defines, with its units."""
    from lab_helpers.present import multi_gpu as notebook
    from lab_helpers.present import tables

    for column in (*tables.MEMORY_COLUMNS, *tables.RANK0_COLUMNS, *notebook.RANK_COLUMNS):
        assert column in schema.UNITS, column
    assert {schema.UNITS[c] for c in tables.MEMORY_COLUMNS} == {"GiB"}
    assert schema.UNITS["train_s"] == "s" and schema.UNITS["tokens_per_s"] == "tokens/s"


def test_a_report_with_a_field_outside_the_contract_is_refused(tmp_path):
    from lab_helpers.training.child_report import write_report

    with pytest.raises(ValueError, match="unknown report fields"):
        write_report({"status": "ok", "peak_alloc_gb": 1.0}, directory=tmp_path)
    assert write_report({"status": "ok", "train_s": 1.0}, directory=tmp_path).exists()
