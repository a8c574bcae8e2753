"""Figures say what they show: the source and mode in every title, like-with-like time panels, the
GPU's capacity line with the legend in stack order, and timelines with their phases, the OOM moment and a fixed
0-100 % axis. Drawn from the shipped reference records (real H100 and CPU stand-in data) and small synthetic ones."""

from __future__ import annotations

import pytest

from lab_helpers.present import figure_source, figures, tables, timeline_phases
from lab_helpers.record import time_bound
from lab_helpers.record.records import append_record, load_results

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def h100():
    return tables.load_reference("h100-80gb")


@pytest.fixture(scope="module")
def cpu():
    return tables.load_reference("ci-cpu")


def _titles(figure) -> str:
    return " | ".join([figure.get_suptitle(), *(ax.get_title() for ax in figure.axes)])


def test_every_figure_names_the_gpu_and_the_mode_and_marks_the_odd_mode_out(h100, tmp_path):
    for plot in (figures.plot_memory, figures.plot_time, figures.plot_memory_vs_time):
        figure = plot(h100, out_dir=tmp_path)
        titles = _titles(figure)
        assert f"{H100}, quick mode (full: one-gpu)" in titles, (plot.__name__, titles)
        assert "CPU" not in titles and "code path" not in titles
        ticks = [t.get_text() for t in figure.axes[-1].get_xticklabels()]
        if plot is not figures.plot_memory_vs_time:
            assert "one-gpu [full]" in ticks and "full-7b [quick]" in ticks, ticks


def test_cpu_figures_say_cpu_stand_in_and_code_path_only_on_every_time_panel(cpu, tmp_path):
    figure = figures.plot_time(cpu, out_dir=tmp_path)
    assert figure.get_suptitle().endswith("CPU stand-in (code path only), full mode")
    assert all(ax.get_title().endswith("CPU: code path only") for ax in figure.axes)
    assert "[full]" not in " ".join(t.get_text() for t in figure.axes[-1].get_xticklabels())  # one mode: the title
    assert "CPU stand-in" in figures.plot_memory(cpu, out_dir=tmp_path).axes[0].get_title()
    assert figure_source.gpu_capacity_gib(cpu.to_dict("records")) is None


def test_time_panels_put_the_steady_per_sample_time_first_and_train_s_last(h100, tmp_path):
    """quick-mode full-7b and full-mode one-gpu run the same 7B setup: their steady time per sample agrees within
    their spread, while train_s (the steps run) differs several-fold -- the panel a student compares first must be
    the steady one."""
    figure = figures.plot_time(h100, out_dir=tmp_path)
    ticks = [t.get_text().split(" [")[0] for t in figure.axes[-1].get_xticklabels()]

    def heights(ax):
        bars = [p for p in ax.patches if not p.get_hatch()][: len(ticks)]
        return dict(zip(ticks, (b.get_height() for b in bars), strict=True))

    per_sample, train_s = heights(figure.axes[0]), heights(figure.axes[3])
    assert "per training sample, steady" in figure.axes[0].get_title() and "train_s" in figure.axes[3].get_title()
    assert per_sample["full-7b"] == pytest.approx(per_sample["one-gpu"], rel=0.2)
    assert train_s["one-gpu"] > 4 * train_s["full-7b"]
    assert not [p for p in figure.axes[2].patches if p.get_hatch()]  # throughput: nothing hatched


def test_memory_draws_the_gpus_capacity_and_a_legend_in_stack_order(h100, tmp_path):
    ax = figures.plot_memory(h100, out_dir=tmp_path).axes[0]
    capacity = [line for line in ax.get_lines() if line.get_label().startswith("GPU capacity")]
    assert len(capacity) == 1 and capacity[0].get_ydata()[0] == 80.0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("GPU capacity: 80 GiB") and labels[1] == "predicted peak"
    assert labels[-1].startswith("measured peak")
    parts = labels[2:-1]
    stacked = [p.replace("_", " ") for p in figures.BREAKDOWN_PARTS if p.replace("_", " ") in parts]
    assert parts == stacked[::-1]  # the top of the stack first, as the bars read


def test_an_oom_timeline_marks_the_moment_and_keeps_percent_axes_at_0_to_100(h100, tmp_path):
    latest = tables.latest_runs(h100)
    baseline = latest[latest["experiment"] == "baseline"].iloc[0].to_dict()
    figure = figures.plot_timeline(baseline, out_dir=tmp_path)
    frame = figures.read_timeline(figures._timeline_path(baseline)[0])
    oom_s = timeline_phases.oom_moment_s(baseline, frame)
    gpu = frame[frame["gpu"].notna()]
    before = gpu[gpu["t_s"] < oom_s]["mem_used_gib"]
    assert before.max() < timeline_phases.OOM_PEAK_SHARE * gpu["mem_used_gib"].max()  # the first sample at the peak
    assert oom_s < gpu["t_s"].max() - 1.0  # before the teardown that frees it
    for ax in figure.axes:
        assert oom_s in [line.get_xdata()[0] for line in ax.get_lines() if line.get_color() == "#b00020"]
    by_label = {ax.get_ylabel(): ax for ax in figure.axes}
    assert by_label["host CPU %"].get_ylim() == (0, 105) and by_label["GPU util %"].get_ylim() == (0, 105)
    assert figure.get_suptitle().startswith(f"Timeline: baseline -- {H100}, quick mode")


def test_a_timeline_with_its_loop_window_is_split_into_load_loop_and_teardown(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    csv = tmp_path / "runs" / "r" / "timeline.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("t_s,gpu,util_pct,mem_used_gib,power_w,host_cpu_pct,host_ram_gib\n"
                   + "".join(f"{t / 5},,,,,{97 + t % 3},1.0\n" for t in range(50)))  # fmt: skip
    record = {"experiment": "lora-1b", "run_id": "r", "status": "ok", "profile": "ci", "mode": "full",
              "device_name": "cpu (x86_64)", "timeline_path": "runs/r/timeline.csv", "loop_window_s": [3.0, 8.0]}  # fmt: skip
    append_record(record, path=tmp_path / "runs.jsonl")
    record = load_results(tmp_path / "runs.jsonl").iloc[0].to_dict()
    figure = figures.plot_timeline(record, out_dir=tmp_path)
    names = [t.get_text() for t in figure.axes[0].texts]
    assert names == [timeline_phases.LOAD, timeline_phases.LOOP, timeline_phases.TEARDOWN]
    dotted = sorted(line.get_xdata()[0] for line in figure.axes[0].get_lines() if line.get_linestyle() == ":")
    assert dotted == [3.0, 8.0]
    assert figure.axes[0].get_ylim() == (0, 105)  # 97-99 % is drawn as nearly full, not as a swing
    assert "CPU stand-in (code path only), full mode" in figure.get_suptitle()
    del record["loop_window_s"]
    older = figures.plot_timeline(record, out_dir=tmp_path)
    assert not older.axes[0].texts and "load / loop / teardown not in this record" in older.get_suptitle()


def test_the_loop_window_is_recorded_on_the_timelines_clock_on_a_cpu_too(tmp_path):
    fields = time_bound.where_time_goes({"device_name": "cpu (x86_64)", "loop_monotonic_s": [1003.5, 1010.25]},
                                        timeline_path=tmp_path / "none.csv", timeline_t0_monotonic_s=1000.0,
                                        gpu_index=None, world_size=1)  # fmt: skip
    assert fields["loop_window_s"] == [3.5, 10.25]
    none = time_bound.where_time_goes({"device_name": "cpu (x86_64)", "loop_monotonic_s": None},
                                      timeline_path=None, timeline_t0_monotonic_s=1000.0, gpu_index=None,
                                      world_size=1)  # fmt: skip
    assert none["loop_window_s"] is None


def test_a_skipped_gpu_run_is_named_by_the_nodes_gpu_not_as_an_unnamed_one():
    """The H200 export of 2026-11-26: adamw-8bit was skipped (no bitsandbytes) before a process started, so its
    record has no device_name; the figures' titles read "NVIDIA H200 + a GPU (name not recorded)"."""
    records = tables.load_reference("h200-141gb").to_dict("records")
    skipped = [r for r in records if r["status"] == "skipped"]
    assert skipped and all(not isinstance(r.get("device_name"), str) for r in skipped)
    assert figure_source.describe(records).startswith("NVIDIA H200, quick mode")
    assert figure_source.gpu_capacity_gib(records) is not None
