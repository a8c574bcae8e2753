"""How a run's outcome becomes records: one per rank, statuses in order of trust (report, log, exit code)."""

from __future__ import annotations

from pathlib import Path

from lab_helpers.experiments import resolve
from lab_helpers.lab import _base_record, _records_from
from lab_helpers.runner import ProcessOutcome
from lab_helpers.sampler import TimelineSummary


def _outcome(tmp_path: Path, *, returncode: int, reports: dict, tail: list[str] = ()) -> ProcessOutcome:
    return ProcessOutcome(
        returncode=returncode,
        interrupted=False,
        wall_s=3.0,
        log_path=tmp_path / "output.log",
        timeline=TimelineSummary(path=tmp_path / "timeline.csv"),
        reports=reports,
        tail=list(tail),
    )


def test_a_rank_killed_before_reporting_still_gets_an_error_record(tmp_path):
    run = resolve("ddp", "ci", check_files=False)
    base = _base_record(run)
    assert base["world_size"] == 2  # two gloo processes on a CPU
    ok = {"status": "ok", "train_s": 1.0, "tokens": 100, "tokens_padded": 120, "iterations": 2}
    records = _records_from(run, base, _outcome(tmp_path, returncode=-9, reports={1: ok}), tmp_path)
    assert [(r["rank"], r["status"]) for r in records] == [(0, "error"), (1, "ok")]
    assert "wrote no report" in records[0]["reason"]
    assert records[1]["tokens_per_s"] == 100.0


def test_an_oom_line_in_the_log_is_an_oom_even_without_a_report(tmp_path):
    run = resolve("small-batch", "ci", check_files=False)
    tail = ["...", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    [record] = _records_from(run, _base_record(run), _outcome(tmp_path, returncode=1, reports={}, tail=tail), tmp_path)
    assert record["status"] == "oom" and "Tried to allocate 2.00 GiB" in record["reason"]
    assert record["rank"] is None
