"""Real distributed runs on a CPU (2 gloo processes, tiny random-weight llamas) through lab.run_experiment.

Notebook 02 runs every multi-GPU experiment on the ci profile in CI (two loopback nodes included) and its last
cell checks each rank's record (``distributed.notebook.check_records``); the runs here cover what it does not:
the full report contract, bf16 DeepSpeed in quick mode, torchrun, and failures.

Each test starts real training processes (20-60 s each on 2 cores). DeepSpeed compiles none of its C++ ops
here: without CUDA torch's AdamW steps the offloaded states (``deepspeed_cpu``), so no test waits minutes for g++.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from lab_helpers.lab import run_experiment
from lab_helpers.record.records import append_record, read_records

pytestmark = pytest.mark.slow
SMALL = {"checkpoint_dir": "checkpoints/lab-ci/ci-llama-xs"}  # the smallest model: process start dominates


def _assert_one_ok_record_per_rank(
    records: list[dict], world_size: int, strategy_word: str, *, warmup: int = 1, timed: int = 1
) -> None:
    assert sorted(r["rank"] for r in records) == list(range(world_size))
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["world_size"] == world_size
        assert strategy_word in record["strategy_used"]
        assert record["peak_alloc_gib"] is None  # a CPU has no CUDA peaks: null, never 0
        assert record["train_s"] > 0 and record["tokens_padded"] >= record["tokens"] > 0
        # `warmup` micro-batches timed apart (by default 2 steps without accumulation: the first), then `timed`
        assert record["warmup_iterations"] == warmup and record["iterations"] == timed and record["warmup_s"] > 0
        # the same report contract as the litgpt child: the device named the same way, one row per micro-batch
        assert record["device_name"].startswith("cpu (")
        assert [row["iter"] for row in record["per_iteration"]] == list(range(1, warmup + timed + 1))
        assert all(row["iter_time_s"] > 0 and row["tokens"] > 0 for row in record["per_iteration"])
        assert len(record["seq_lens"]) == warmup + timed and min(record["seq_lens"]) > 0  # this rank's lengths
        # where the time went, as the litgpt child reports it: this rank's CPU over the timed loop, and the loop on
        # the host's clock (on a GPU, gpu_busy_pct averages NVML over it; on a CPU there is no GPU to be busy)
        start, end = record["loop_monotonic_s"]
        assert end - start == pytest.approx(record["train_s"], abs=0.25), "the window is the timed loop"
        assert 0 < record["host_core_pct"] and 0 <= record["loop_window_s"][0] < record["loop_window_s"][1]
        assert record["gpu_busy_pct"] is None and "no GPU" in record["gpu_busy_reason"]


def _kill_rank1_after_first_iteration(results: Path, killed: dict, timeout_s: float = 240) -> None:
    """Find the run's rank 1 (a child of the training process) once rank 0 printed an iteration; SIGKILL it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = list((results / "runs").glob("*/output.log")) if (results / "runs").exists() else []
        if logs and "iter 1" in logs[0].read_text():
            for proc in psutil.process_iter(["cmdline", "environ"]):
                try:
                    cmd = " ".join(proc.info["cmdline"] or [])
                    env = proc.info["environ"] or {}
                except psutil.Error:
                    continue
                if "lab_helpers.training.distributed.train" in cmd and env.get("LOCAL_RANK") == "1":
                    if env.get("LAB_RESULTS") == os.environ["LAB_RESULTS"]:
                        killed["pid"] = proc.pid
                        killed["at"] = time.monotonic()
                        proc.kill()
                        return
        time.sleep(0.2)


def test_killing_one_rank_ends_every_rank_and_records_the_failure(ci_assets, results):
    earlier = {"run_id": "earlier", "experiment": "ddp", "status": "ok", "rank": 0}
    append_record(earlier)
    killed: dict = {}
    killer = threading.Thread(target=_kill_rank1_after_first_iteration, args=(results, killed), daemon=True)
    killer.start()
    records = run_experiment("ddp", profile="ci", overrides={**SMALL, "train.max_steps": 200}, echo=False)
    ended = time.monotonic()
    killer.join(timeout=1)
    assert "pid" in killed, "rank 1 was never found"
    assert ended - killed["at"] < 30, "the other rank outlived its dead peer"
    assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE
    leftovers = [
        p for p in psutil.process_iter(["cmdline", "environ"])
        if "lab_helpers.training.distributed.train" in " ".join(p.info["cmdline"] or [])
        and (p.info["environ"] or {}).get("LAB_RESULTS") == os.environ["LAB_RESULTS"]
    ]  # fmt: skip
    assert leftovers == []
    by_rank = {r["rank"]: r for r in records}
    assert set(by_rank) == {0, 1}
    assert all(r["status"] == "error" for r in records)
    assert "local rank 1" in by_rank[0]["reason"] and "SIGKILL" in by_rank[0]["reason"]
    assert "SIGKILL" in by_rank[1]["error"]
    stored = read_records(results / "runs.jsonl")
    assert stored[0] == earlier and stored[1:] == records


def test_deepspeed_zero3_with_cpu_offload_runs_on_cpu_in_bf16_in_quick_mode(ci_assets, results):
    """bf16-true as on a GPU (the notebook's ci run is 32-true for speed): DeepSpeed's bf16 engine, bf16 shards and
    fp32 master weights in the offloaded optimizer run for real. In quick mode, as the GPU session runs it: each
    rank's second step opens with its share of the longest samples, QUICK_WARMUP_STEPS steps are warm-up, then
    whole steps of at least MIN_MEASURED_ITERATIONS micro-batches are timed."""
    from lab_helpers.training.quick_mode import MIN_MEASURED_ITERATIONS, QUICK_WARMUP_STEPS, quick_max_steps

    accumulation = 2  # global 4 = micro 1 x 2 ranks x 2
    asked = {**SMALL, "precision": "bf16-true", "train.max_steps": 20}  # quick mode decides the steps
    records = run_experiment("deepspeed-offload", profile="ci", overrides=asked, echo=False, quick=True)
    warmup = QUICK_WARMUP_STEPS * accumulation
    timed = (quick_max_steps(accumulation) - QUICK_WARMUP_STEPS) * accumulation
    assert timed >= MIN_MEASURED_ITERATIONS
    _assert_one_ok_record_per_rank(
        records, 2, "deepspeed zero3 + cpu offload (DeepSpeedStrategy on CPU", warmup=warmup, timed=timed
    )
    assert all(record["mode"] == "quick" for record in records)
    assert read_records(results / "runs.jsonl") == records
    run_dir = results / "runs" / records[0]["run_id"]
    log = (run_dir / "output.log").read_text()
    assert f"form micro-batch {accumulation + 1}, the first of the second optimizer step" in log
    assert "on each of 2 ranks" in log
    assert "[lab] optimizer: AdamW" in log  # torch's steps the offloaded states without CUDA
    assert "deepspeed_shm_comm" not in log  # DeepSpeed's inference-only shared-memory all-reduce was not compiled
    config = json.loads((run_dir / "deepspeed.json").read_text())
    assert config["bf16"]["enabled"] and config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_two_nodes_through_torchrun_on_loopback(ci_assets, tmp_path):
    """The launch docs/multi_node.md documents (torchrun per node), played as two nodes on this machine."""
    import subprocess

    from lab_helpers.config.experiments import resolve
    from lab_helpers.config.paths import lab_home
    from lab_helpers.training import child_report
    from lab_helpers.training.distributed import build_command

    argv = build_command(resolve("multi-node", "ci", SMALL), tmp_path / "run")
    argv.insert(argv.index("--"), "--launcher=torchrun")
    env = {**os.environ, child_report.REPORT_DIR_ENV: str(tmp_path / "reports")}
    done = subprocess.run(argv, cwd=lab_home(), env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = child_report.read_reports(tmp_path / "reports")
    assert sorted(reports) == [0, 1]
    for report in reports.values():
        assert report["status"] == "ok" and report["world_size"] == 2
        assert report["warmup_iterations"] == 1 and report["iterations"] == 1  # 2 steps: 1 warm-up, 1 timed


def test_terminating_the_process_group_records_every_rank_as_interrupted(ci_assets, tmp_path):
    """What the runner does on an interrupt (SIGTERM to the run's process group): every rank reports and ends."""
    import signal
    import subprocess

    from lab_helpers.config.experiments import resolve
    from lab_helpers.config.paths import lab_home
    from lab_helpers.training import child_report
    from lab_helpers.training.distributed import build_command

    argv = build_command(resolve("ddp", "ci", {**SMALL, "train.max_steps": 200}), tmp_path / "run")
    env = {**os.environ, child_report.REPORT_DIR_ENV: str(tmp_path / "reports"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, cwd=lab_home(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if b"iter 1" in line:
            break
    ranks = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGTERM)
    sent = time.monotonic()
    proc.stdout.read()
    proc.wait(timeout=60)
    assert time.monotonic() - sent < 20
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    reports = child_report.read_reports(tmp_path / "reports")
    assert sorted(reports) == [0, 1]
    assert {r["status"] for r in reports.values()} == {"interrupted"}, [
        r.get("error", "")[-600:] for r in reports.values()
    ]
