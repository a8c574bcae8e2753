"""The bound from the device's side: two runs of one experiment on one GPU get one label unless
their busy figures differ beyond their noise, and then each row says which figure differs and by how much.

Records built for it: each run's NVML samples written as the sampler writes a timeline, its fields computed by the
record layer (``time_bound.where_time_goes``), stored and read back by the lab's reader (``records.load_results``).
"""

from __future__ import annotations

import csv
from pathlib import Path

from lab_helpers.config.paths import reference_dir
from lab_helpers.record import time_bound
from lab_helpers.record.records import append_records, load_results

H200 = "NVIDIA H200"
LOOP_START_S = 10.0


def _record(results: Path, run_id: str, experiment: str, samples: list[float], device: str = H200) -> dict:
    """A finished run whose GPU 0 read ``samples`` every 0.15 s inside its timed loop (and 0 % outside it)."""
    timeline = results / "runs" / run_id / "timeline.csv"
    timeline.parent.mkdir(parents=True)
    end = LOOP_START_S + 0.15 * (len(samples) - 1)
    with open(timeline, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("t_s", "gpu", "util_pct", "mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib"))
        for i, util in enumerate([0.0] * 5 + samples + [0.0] * 5):
            t = LOOP_START_S + 0.15 * (i - 5)
            writer.writerow([f"{t:.3f}", "", "", "", "", "99.0", "3.0"])
            writer.writerow([f"{t:.3f}", 0, f"{util:.1f}", "28.0", "400.0", "", ""])
    report = {"device_name": device, "loop_monotonic_s": [1000 + LOOP_START_S - 0.01, 1000 + end + 0.01]}
    fields = time_bound.where_time_goes(report, timeline_path=timeline, timeline_t0_monotonic_s=1000.0, gpu_index=0,
                                        world_size=1)  # fmt: skip
    return {"run_id": run_id, "experiment": experiment, "status": "ok", "profile": "gpu", "device_name": device,
            "world_size": 1, "host_core_pct": 99.0, "timeline_path": f"runs/{run_id}/timeline.csv", **fields}  # fmt: skip


def _rows(results: Path, experiment: str) -> list[dict]:
    frame = load_results(results / "runs.jsonl")
    return [r for r in frame.to_dict("records") if r["experiment"] == experiment]


def test_two_runs_within_their_noise_get_one_label(results):
    """89 and 92.5 % busy, each from 8 samples that swing by 20 points: alone one reads `both`, the other `gpu`,
    across the 90 % line; 3.5 points apart is inside their joint noise, so both take their pooled figure's label."""
    a = _record(results, "a", "grad-accum", [80, 95, 85, 100, 80, 95, 85, 92])
    b = _record(results, "b", "grad-accum", [85, 100, 90, 95, 88, 99, 90, 93])
    assert (a["bound"], b["bound"]) == ("both", "gpu")  # what each record stores: one run alone
    apart = abs(a["gpu_busy_pct"] - b["gpu_busy_pct"])
    assert apart < (a["gpu_busy_spread_pct"] ** 2 + b["gpu_busy_spread_pct"] ** 2) ** 0.5
    other_gpu = _record(results, "c", "grad-accum", [60, 62, 58, 61], device="NVIDIA H100 80GB HBM3")
    append_records([a, b, other_gpu], path=results / "runs.jsonl")
    rows = {r["run_id"]: r for r in _rows(results, "grad-accum")}
    assert rows["a"]["bound"] == rows["b"]["bound"] == "gpu"
    assert "pooled with 1 other run(s) of `grad-accum` on this GPU" in rows["a"]["bound_reason"]
    assert rows["c"]["bound"] == "both" and "pooled" not in rows["c"]["bound_reason"]  # another GPU: not pooled


def test_two_runs_beyond_their_noise_say_which_figure_differs_and_by_how_much(results):
    """The H200's two `small-batch` runs as sampled (timelines of 20261126-074240 and -101404): a stall of three
    samples in the first one's loop; 20 points apart, beyond their joint noise of 16."""
    speed = _record(results, "speed", "small-batch", [96, 78, 78, 90, 0, 45, 45, 98, 89, 95, 93, 93, 94])
    padding = _record(results, "padding", "small-batch", [95, 100, 98, 95, 95, 98, 95])
    append_records([speed, padding], path=results / "runs.jsonl")
    rows = {r["run_id"]: r for r in _rows(results, "small-batch")}
    assert (rows["speed"]["bound"], rows["padding"]["bound"]) == ("both", "gpu")
    assert rows["speed"]["bound_reason"].endswith(
        "the other `small-batch` run on this GPU (padding) is `gpu`: GPU busy 97 ± 1 % there against 76 ± 16 % "
        "here, 20 points apart, 4 beyond their joint noise (±16)"
    )
    assert "(speed) is `both`: GPU busy 76 ± 16 % there against 97 ± 1 % here" in rows["padding"]["bound_reason"]


def test_an_older_record_gets_its_noise_from_its_timeline_on_read(results):
    """A record written before ``gpu_busy_spread_pct`` (and with the old rule's label): the reader derives the noise
    from the samples its timeline holds inside ``loop_window_s`` and labels it by today's rule."""
    new = _record(results, "old", "bf16-mixed", [36, 81, 83, 83, 77, 68])
    old = {k: v for k, v in new.items() if k not in ("gpu_busy_spread_pct", "gpu_busy_sample_count")}
    old.update(bound="host", bound_reason="GPU busy 71 %, host 97 % of a core: GPU busy < 80 %, host >= 80 % of a core")
    append_records([old], path=results / "runs.jsonl")
    [row] = _rows(results, "bf16-mixed")
    assert row["gpu_busy_sample_count"] == 6 and row["gpu_busy_spread_pct"] == new["gpu_busy_spread_pct"] > 0
    assert row["bound"] == "both" and row["bound_reason"] == new["bound_reason"]
    assert "host" not in row["bound_reason"].split(":")[0]  # the figures are the device's, not the host's core


def test_the_shipped_h200_small_batch_runs_agree_or_say_why():
    """The verdict rule on the shipped records: the same label, or the row names the figure that differs and
    by how much beyond its noise."""
    frame = load_results(reference_dir() / "h200-141gb.jsonl")
    runs = [r for r in frame.to_dict("records") if r["experiment"] == "small-batch" and r["status"] == "ok"]
    assert len(runs) == 2
    if runs[0]["bound"] != runs[1]["bound"]:
        for run in runs:
            assert "GPU busy" in run["bound_reason"] and "beyond their joint noise" in run["bound_reason"]
