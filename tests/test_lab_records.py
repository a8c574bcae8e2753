"""How a run's outcome becomes records: one per rank, statuses in order of trust (report, log, exit code)."""

from __future__ import annotations

from pathlib import Path

import torch

from lab_helpers import launch
from lab_helpers.config.experiments import resolve
from lab_helpers.launch.runner import ProcessOutcome
from lab_helpers.launch.sampler import TimelineSummary
from lab_helpers.record.run_record import base_record as _base_record
from lab_helpers.record.run_record import records_from


def _records_from(run, base, outcome, run_dir):
    """The records the lab builds for ``run``: one per rank its launcher starts."""
    return records_from(run, base, outcome, run_dir, launch.ranks(run))


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


def test_mfu_is_computed_for_a_known_gpu(ci_assets, tmp_path):
    """A CUDA device name cannot come from a CPU run: this report stands in for one from an H100."""
    run = resolve("grad-accum", "ci")
    report = {"status": "ok", "train_s": 2.0, "tokens": 900, "tokens_padded": 1024, "iterations": 2,
              "device_name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    [record] = _records_from(run, _base_record(run), _outcome(tmp_path, returncode=0, reports={0: report}), tmp_path)
    from lab_helpers.hardware.gpu_peaks import dense_peak_flops

    params = sum(t.numel() for t in torch.load(ci_assets["ci-llama-xs"] / "lit_model.pth").values())
    rough = 6 * params * 1024 / 2.0 / dense_peak_flops("NVIDIA H100 80GB HBM3", "32-true")  # 6 N D per second
    assert 0.5 * rough < record["mfu"] < 3 * rough  # attention and the lm head add to 6 N D
    assert record["flops_per_step"] > 0 and record["gpu_peak_flops"] == dense_peak_flops("NVIDIA H100 80GB HBM3", "32-true")
    cpu = {**report, "device_name": "cpu (x86_64)"}
    [record] = _records_from(run, _base_record(run), _outcome(tmp_path, returncode=0, reports={0: cpu}), tmp_path)
    assert record["mfu"] is None


def test_a_failure_counting_mfu_never_costs_the_run_its_record(tmp_path):
    """Counting FLOPs needs the model's config; where that fails the record is kept, MFU is None with the reason."""
    import dataclasses

    run = resolve("grad-accum", "ci", check_files=False)
    run = dataclasses.replace(run, recipe={**run.recipe, "checkpoint_dir": str(tmp_path / "no-such-model")})
    report = {"status": "ok", "train_s": 2.0, "tokens": 900, "tokens_padded": 1024, "iterations": 2,
              "device_name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    [record] = _records_from(run, _base_record(run), _outcome(tmp_path, returncode=0, reports={0: report}), tmp_path)
    assert record["status"] == "ok" and record["tokens_per_s"] == 450.0
    assert record["mfu"] is None and record["flops_per_step"] is None
    assert "model_config.yaml" in record["mfu_error"]
