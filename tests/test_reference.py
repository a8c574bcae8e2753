"""Exporting recorded runs as the lab's reference results, and reading them back for the analysis."""

from __future__ import annotations

import pytest
from conftest import REPO

from lab_helpers.compare import load_reference
from lab_helpers.experiments import LabConfigError
from lab_helpers.records import append_record
from lab_helpers.reference import export_reference


@pytest.fixture
def lab_home(tmp_path, monkeypatch, results):
    home = tmp_path / "home"
    home.mkdir()
    (home / "configs").symlink_to(REPO / "configs")
    monkeypatch.setenv("LAB_HOME", str(home))
    return home


def test_export_keeps_the_latest_record_per_experiment_and_its_timeline(lab_home, results):
    (results / "runs" / "b").mkdir(parents=True)
    (results / "runs" / "b" / "timeline.csv").write_text(
        "t_s,gpu,util_pct,mem_used_gib,power_w,host_cpu_pct,host_ram_gib\n"
    )
    append_record(
        {
            "experiment": "grad-accum",
            "profile": "ci",
            "status": "ok",
            "run_id": "a",
            "started_at": "2026-01-01T00:00:00",
            "train_s": 9.0,
        }
    )
    append_record(
        {
            "experiment": "grad-accum",
            "profile": "ci",
            "status": "ok",
            "run_id": "b",
            "started_at": "2026-01-02T00:00:00",
            "train_s": 1.0,
            "timeline_path": "runs/b/timeline.csv",
        }
    )
    append_record(
        {
            "experiment": "bf16-true",
            "profile": "gpu",
            "status": "ok",
            "run_id": "c",
            "started_at": "2026-01-02T00:00:00",
        }
    )
    path = export_reference("cpu-ci", profile="ci", note="test export")
    assert path == lab_home / "reference_results" / "cpu-ci.jsonl"
    assert (lab_home / "reference_results" / "runs" / "b" / "timeline.csv").is_file()
    frame = load_reference("cpu-ci")
    assert list(frame["experiment"]) == ["grad-accum"] and list(frame["train_s"]) == [1.0]
    assert list(frame["reference_note"]) == ["test export"]
    assert "rank_n" not in frame.columns  # only what was recorded, nothing the analysis added


def test_export_refuses_bad_names_and_empty_profiles(lab_home, results):
    with pytest.raises(LabConfigError, match="letters, digits"):
        export_reference("../H100", profile="ci")
    with pytest.raises(LabConfigError, match="no records of profile 'gpu'"):
        export_reference("H100", profile="gpu")


def test_exported_reference_can_be_analysed(lab_home, results):
    from lab_helpers.compare import comparison_table

    for rank in (0, 1):
        append_record(
            {
                "experiment": "ddp",
                "profile": "ci",
                "status": "ok",
                "rank": rank,
                "run_id": "r1",
                "started_at": "2026-01-01T00:00:00",
                "train_s": 2.0,
            }
        )
    export_reference("cpu-ci", profile="ci")
    table = comparison_table(load_reference("cpu-ci"))
    assert list(table["experiment"]) == ["ddp"] and list(table["train_s"]) == [2.0]
