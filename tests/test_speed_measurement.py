"""Where a run's time goes and how its time figures are derived: steady statistics, one token count
for tokens/s and MFU, the GPU-busy share and ``bound``, and the ``--trace-steps`` summary.

No GPU here: the NVML timeline and the CUDA kernels of a trace are FIXTURES shaped as the sampler and torch's
Chrome trace write them; what a CPU can produce (a record, a real trace) is tested for real, in the slow tier.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from lab_helpers.config import iteration_times, record_schema
from lab_helpers.record import time_bound
from lab_helpers.record.records import load_results
from lab_helpers.training import torch_trace

REPO = Path(__file__).resolve().parent.parent
H100 = REPO / "reference_results" / "h100-80gb.jsonl"


# ------------------------------------------------------------------------------------- honest statistics


def test_iteration_stats_are_the_median_iqr_and_count_of_the_samples():
    times = [0.30, 0.10, 0.20, 0.40, 0.25, 0.35]
    stats = iteration_times.iteration_stats(times)
    q1, _, q3 = statistics.quantiles(times, n=4)
    assert stats["iter_median_s"] == pytest.approx(0.275) and stats["iter_count"] == 6
    assert stats["iter_iqr_s"] == pytest.approx(q3 - q1)
    # halves: median(0.30, 0.10, 0.20) = 0.20 against median(0.40, 0.25, 0.35) = 0.35
    assert stats["iter_halves_pct"] == pytest.approx(100 * 0.15 / 0.275)
    assert iteration_times.iteration_stats([])["iter_median_s"] is None


def test_time_figures_come_from_steady_iterations_and_leave_the_profiled_ones_out():
    rows = [{"iter": i, "iter_time_s": t} for i, t in enumerate([5.0, 1.0, 9.0, 9.0, 1.0, 1.2, 0.8], start=1)]
    record = {"per_iteration": rows, "warmup_iterations": 1, "iterations": 6, "tokens": 600, "tokens_padded": 800,
              "train_s": 22.0, "torch_profile_iters": [3, 4]}  # fmt: skip
    timing = iteration_times.steady_timing(record)
    assert timing["iter_count"] == 4 and timing["iter_median_s"] == pytest.approx(1.0)  # iters 2, 5, 6, 7
    assert timing["tokens_per_s_padded"] == pytest.approx(800 / 6 / 1.0)
    assert timing["tokens_per_s"] == pytest.approx(600 / 6 / 1.0)
    assert timing["padding_pct"] == pytest.approx(25.0)
    # no per-iteration times: the mean iteration stands in for the median
    fallback = iteration_times.steady_timing({**record, "per_iteration": None})
    assert fallback["iter_median_s"] == pytest.approx(22.0 / 6) and fallback["iter_count"] == 0


@pytest.mark.parametrize("experiment", ["full-7b", "bf16-true", "lora-1b"])
def test_mfu_is_recomputed_by_hand_from_a_records_own_columns(experiment):
    """The H100 reference records are old (their stored MFU came from train_s and padded tokens, their tokens/s
    from unpadded ones); the reader re-derives both from what they measured. A student's arithmetic on the
    table's columns gives the table's MFU."""
    stored = next(json.loads(line) for line in H100.read_text().splitlines() if f'"experiment": "{experiment}"' in line)
    frame = load_results(H100)
    record = frame[frame["experiment"] == experiment].iloc[0].to_dict()
    # from the raw measurement: the median of the logged iterations after warm-up
    timed = [row["iter_time_s"] for row in stored["per_iteration"] if row["iter"] > stored["warmup_iterations"]]
    by_hand = stored["flops_per_step"] / statistics.median(timed) / stored["gpu_peak_flops"]
    assert record["mfu"] == pytest.approx(by_hand, rel=0.01)
    # from the table's columns: padded tokens/s x FLOPs per padded token / the GPU's peak
    from_columns = record["tokens_per_s_padded"] * record["flops_per_token"] / record["gpu_peak_flops"]
    assert record["mfu"] == pytest.approx(from_columns, rel=0.01)
    # the unpadded count gives a smaller figure, by exactly the padding share shown beside it
    unpadded = record["tokens_per_s"] * record["flops_per_token"] / record["gpu_peak_flops"]
    assert unpadded / record["mfu"] == pytest.approx(1 - record["padding_pct"] / 100, rel=0.01)
    assert stored["train_s"] == record["train_s"] and stored["per_iteration"] == record["per_iteration"]  # unedited


def test_the_schema_documents_the_bound_thresholds_the_code_uses():
    doc = {f.name: f.doc for f in record_schema.RECORD_FIELDS}["bound"]
    assert f"gpu_busy_pct >= {time_bound.GPU_BOUND_BUSY_PCT:.0f}" in doc
    assert f"gpu_busy_pct <= {time_bound.HOST_BOUND_BUSY_PCT:.0f}" in doc and "both between" in doc
    assert "host_core_pct is no evidence" in doc  # 97-100 % of a core in every GPU record
    for name in iteration_times.STEADY_TIMING_FIELDS:
        assert name in record_schema.UNITS


# ------------------------------------------------------------------------------- where the time goes


def _timeline(path: Path) -> Path:
    """A FIXTURE timeline as the sampler writes it (host rows and one row per GPU per sample), for a node with two
    GPUs: GPU 0 is 20 % busy while the loop runs (t 10-20 s) and 100 % before it (loading), GPU 1 idle."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("t_s", "gpu", "util_pct", "mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib"))
        for tenth in range(0, 300, 5):
            t = tenth / 10
            writer.writerow([f"{t:.3f}", "", "", "", "", "50.0", "3.0"])
            writer.writerow([f"{t:.3f}", 0, "20.0" if 10 <= t <= 20 else "100.0", "10.0", "200.0", "", ""])
            writer.writerow([f"{t:.3f}", 1, "0.0", "0.5", "60.0", "", ""])
    return path


def test_gpu_busy_pct_averages_nvml_over_the_training_loop_only(tmp_path):
    path = _timeline(tmp_path / "timeline.csv")
    report = {"device_name": "NVIDIA H100 80GB HBM3", "loop_monotonic_s": [1010.0, 1020.0], "host_core_pct": 97.0}
    fields = time_bound.where_time_goes(report, timeline_path=path, timeline_t0_monotonic_s=1000.0, gpu_index=0,
                                        world_size=1)  # fmt: skip
    assert fields["gpu_busy_pct"] == pytest.approx(20.0)  # the 100 % of loading does not count
    assert fields["gpu_busy_pct_per_gpu"] == {"0": pytest.approx(20.0), "1": 0.0}
    assert fields["gpu_busy_sample_count"] == 21 and fields["gpu_busy_spread_pct"] == 0.0  # every sample 20 %
    assert fields["bound"] == "host" and "GPU busy 20 ± 0 % (21 NVML samples" in fields["bound_reason"]
    assert "97" not in fields["bound_reason"]  # the host's core is no evidence


def test_bound_follows_the_stated_thresholds():
    gpu, host = time_bound.GPU_BOUND_BUSY_PCT, time_bound.HOST_BOUND_BUSY_PCT
    labels = [time_bound.classify(busy, world_size=1)[0] for busy in (gpu, gpu - 0.1, host + 0.1, host)]
    assert labels == ["gpu", "both", "both", "host"]  # a middle band, named, between two stated lines
    # several ranks: NVML counts collective kernels as busy, so only a profile's collective share says communication
    assert time_bound.classify(40.0, world_size=4)[0] == "host"  # no kernel ran, not even a collective one
    assert time_bound.classify(95.0, world_size=4, trace={"collective_pct": 70.0})[0] == "communication"
    assert time_bound.classify(95.0, world_size=4, trace={"collective_pct": 10.0})[0] == "gpu"
    assert "may be communication" in time_bound.classify(95.0, world_size=4)[1]
    assert "may be communication" in time_bound.classify(70.0, world_size=4)[1]
    assert time_bound.classify(95.0, 8.0, world_size=1)[1].endswith("(the 90 % line is inside its noise)")
    # a profile stands in where NVML has no sample inside the loop: its device-idle share
    assert time_bound.classify(None, world_size=1, trace={"device_idle_pct": 16.0, "steps": 2})[0] == "both"
    assert time_bound.classify(None, world_size=1)[0] is None


def test_a_cpu_run_has_no_gpu_figures_and_says_why(tmp_path):
    fields = time_bound.where_time_goes({"device_name": "cpu (x86_64)", "loop_monotonic_s": [1.0, 2.0]},
                                        timeline_path=tmp_path / "none.csv", timeline_t0_monotonic_s=0.0,
                                        gpu_index=None, world_size=1)  # fmt: skip
    assert fields["gpu_busy_pct"] is None and fields["bound"] is None
    assert fields["gpu_busy_reason"] == time_bound.NO_GPU_REASON


# ------------------------------------------------------------------------------------------- profiling


def test_the_profile_summary_of_a_gpu_trace(tmp_path):
    """A FIXTURE Chrome trace as torch.profiler writes one on CUDA (no GPU here): host ops, two kernels that
    overlap on two streams, a memcpy; 2 steps in a 10 ms window."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 2000, "dur": 2000},  # overlaps: union 4 ms
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 100, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1000, "dur": 2000},
        {"ph": "X", "cat": "kernel", "name": "add", "ts": 2500, "dur": 1500},  # overlaps gemm: union 3 ms
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 6000, "dur": 1000},
        {"ph": "i", "cat": "kernel", "name": "instant, not complete", "ts": 0},
    ]
    summary = torch_trace.summarize(events, wall_s=0.010, steps=2, top_ops=[])
    assert summary["wall_ms_per_step"] == pytest.approx(5.0)
    assert summary["host_op_ms_per_step"] == pytest.approx(2.0)
    assert summary["device_busy_ms_per_step"] == pytest.approx(2.0)  # (3 + 1) ms over 2 steps
    assert summary["device_idle_pct"] == pytest.approx(60.0)
    assert summary["kernels_per_step"] == 1.0 and summary["aten_ops_per_step"] == 1.0
    assert summary["top_ops_by"] == "device time"
    assert any("device idle 60 %" in line for line in torch_trace.summary_lines(summary))
    assert summary["collective_ms_per_step"] == 0.0 and summary["collective_pct"] == 0.0


def test_the_profile_summary_counts_collective_kernels_apart():
    """NCCL's kernels are device time NVML calls busy: the summary gives their share, which ``bound`` reads."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "ts": 1000, "dur": 3000},
    ]  # fmt: skip
    summary = torch_trace.summarize(events, wall_s=0.004, steps=1, top_ops=[])
    assert summary["collective_ms_per_step"] == pytest.approx(3.0) and summary["collective_pct"] == pytest.approx(75.0)
    report = {"device_name": "NVIDIA H100 80GB HBM3", "torch_profile_summary": summary}
    assert time_bound.classify(99.0, world_size=4, trace=summary)[0] == "communication"
    assert report["torch_profile_summary"]["collective_pct"] >= time_bound.COMMUNICATION_BOUND_PCT


def test_trace_steps_is_checked_in_one_line():
    assert torch_trace.check_steps(None) is None and torch_trace.check_steps(0) is None
    assert torch_trace.check_steps(3) == 3
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="trace_steps must be a positive whole number"):
            torch_trace.check_steps(bad)
    # 10**18 was accepted and recorded: a trace's size grows with each step, and the run gets N + 1 more steps
    assert torch_trace.check_steps(torch_trace.MAX_TRACE_STEPS) == torch_trace.MAX_TRACE_STEPS
    for bad in (torch_trace.MAX_TRACE_STEPS + 1, 10**18):
        with pytest.raises(ValueError, match=rf"trace_steps is at most {torch_trace.MAX_TRACE_STEPS} "):
            torch_trace.check_steps(bad)


@pytest.mark.slow
def test_a_profiled_cpu_run_writes_a_trace_and_a_summary_and_says_so(ci_assets, results):
    """The real thing on the ci profile: litgpt on a CPU, profiled for two optimizer steps after warm-up (03's
    profiler exercise), and the words 03 prints of it."""
    from lab_helpers.lab import run_experiment
    from lab_helpers.present import tables

    [record] = run_experiment("small-batch", profile="ci", overrides={"train.max_steps": 3}, echo=False,
                              trace_steps=2)  # fmt: skip
    assert record["status"] == "ok" and record["torch_profile_steps"] == 2
    assert record["config"]["train"]["max_steps"] == 6  # 2 profiled + 1 that stops the profiler, added
    trace = results / record["torch_profile_trace_path"]
    assert any(e.get("cat") == "cpu_op" for e in json.loads(trace.read_text())["traceEvents"])
    summary = record["torch_profile_summary"]
    assert summary["device_idle_pct"] is None and summary["kernels_per_step"] is None  # a CPU: no device figures
    assert summary["top_ops_by"].startswith("CPU time") and any(op["name"] == "aten::mm" for op in summary["top_ops"])
    assert json.loads((trace.parent / torch_trace.SUMMARY_FILENAME).read_text()) == summary
    # micro-batch 1 is warm-up, 2 and 3 profiled (a step each), 4 stopped the profiler: the time figures are of 5, 6
    assert record["torch_profile_iters"] == [2, 4] and record["iter_count"] == 2 and summary["steps"] == 2
    assert record["gpu_busy_pct"] is None and record["gpu_busy_reason"] == time_bound.NO_GPU_REASON
    assert record["bound"] is None and record["host_core_pct"] > 0
    words = tables.trace_words(record)
    assert f"wall {summary['wall_ms_per_step']:.1f} ms" in words and "a CPU run has no device" in words
    assert "device busy" not in words and "matrix multiplies and attention" in words
    table = tables.trace_table(record)
    assert list(table.columns) == ["op", "kind", "calls_per_step", "self_cpu_ms_per_step"]
    for shown, op in zip(table["op"], summary["top_ops"], strict=True):  # a long name is cut, marked with …
        assert shown == op["name"] or (shown.endswith("…") and op["name"].startswith(shown[:-1]))
    assert tables.trace_regime(record)[0] is None  # no device: no regime from the device's side


@pytest.mark.slow
def test_a_profiled_quick_run_times_what_an_unprofiled_one_times_then_profiles(ci_assets, results):
    """Quick mode profiles after its timing ends: its timed micro-batches start right after warm-up, as an
    unprofiled quick run's do. (On the H200 the profile right after warm-up moved bf16-true's timed window onto
    sequence lengths not seen before, 238 ms a micro-batch against 87 ms on the lengths warm-up had seen:
    benchmarks/speed_diagnosis_h200.out.txt.)"""
    from lab_helpers.config.iteration_times import timed_iterations
    from lab_helpers.lab import run_experiment

    [record] = run_experiment("grad-accum", profile="ci", echo=False, quick=True, trace_steps=1)
    assert record["status"] == "ok" and record["quick_stop"] is not None
    timed = [iteration for iteration, _ in timed_iterations(record)]
    warmup = record["warmup_iterations"]
    first_profiled, stopped_at = record["torch_profile_iters"]
    assert timed == list(range(warmup + 1, warmup + 1 + len(timed)))  # the first steady micro-batch is timed
    assert first_profiled == timed[-1] + 1 and stopped_at == first_profiled + 4  # one step of 4 micro-batches
    assert record["iterations"] == len(timed) == record["iter_count"]  # the profiled ones are not counted as timed
    assert (results / record["torch_profile_trace_path"]).exists()
    assert record["torch_profile_summary"]["steps"] == 1


def test_a_simulated_rank_is_classified_as_the_one_process_it_is():
    """A simulated rank 0 of 4 runs alone with a fake process group: no collectives, so NVML's busy share is its
    own, with no caveat that part of it may be communication (the communication rule applies to several real
    ranks only)."""
    from lab_helpers.config.experiments import resolve

    run = resolve("ddp", "ci", {"train.global_batch_size": 8}, simulate_world=4)
    assert run.world_size == 4 and run.ranks_run == 1
    assert time_bound.classify(70.0, world_size=run.ranks_run) == time_bound.classify(70.0, world_size=1)
    assert "may be communication" in time_bound.classify(70.0, world_size=run.world_size)[1]


def test_the_old_names_of_the_trace_still_work_and_say_the_new_ones(capsys):
    """``profile`` is the hardware profile only: the torch.profiler names moved to ``trace``, the old ones kept."""
    from lab_helpers import lab
    from lab_helpers.present import tables

    assert lab._renamed_trace_steps(None, {"profile_steps": 2}) == 2
    assert "profile_steps= is now trace_steps=" in capsys.readouterr().err
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        lab._renamed_trace_steps(None, {"bogus": 1})
    assert tables.profile_words is tables.trace_words
    assert "tables.profile_words is now tables.trace_words" in capsys.readouterr().err
    from lab_helpers.cli import build_parser

    args = build_parser().parse_args(["run", "small-batch", "--profile-steps", "3"])
    assert args.old_profile_steps == 3 and args.trace_steps is None  # _cmd_run hands it on as profile_steps=


def test_a_trace_of_the_lightning_ranks_is_refused_in_one_line():
    from lab_helpers import lab
    from lab_helpers.config.experiments import LabConfigError, resolve

    with pytest.raises(LabConfigError, match="--trace-steps traces the single-GPU section's runs; ddp runs one"):
        lab._trace_steps(2, resolve("ddp", "ci", check_files=False))
    assert lab._trace_steps(2, resolve("small-batch", "ci", check_files=False)) == 2
