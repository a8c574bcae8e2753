"""The comparison table and plots, on small synthetic record files (this module only presents data)."""

from __future__ import annotations

import math
import statistics
import warnings

import pandas as pd
import pytest

from lab_helpers.present import figures, tables
from lab_helpers.record.records import append_record, load_results

BREAKDOWN = {
    "parameters": 2.0,
    "gradients": 2.0,
    "optimizer_states": 4.0,
    "activations": 3.0,
    "temporaries": 0.5,
    "communication_buffers": 0.0,
    "cuda_context": 0.5,
}


def _predicted(total: float) -> dict:
    return {"peak_alloc_gib": total, "breakdown_gib": BREAKDOWN, "host_gib": 1.0, "fits": total < 80}


def _write(tmp_path, records):
    path = tmp_path / "runs.jsonl"
    for record in records:
        append_record(record, path=path)
    return load_results(path)


def _gpu_records(tmp_path):
    timeline = tmp_path / "timelines" / "r-small.csv"
    timeline.parent.mkdir(parents=True)
    rows = ["t_s,gpu,util_pct,mem_used_gib,power_w,host_cpu_pct,host_ram_gib"]
    for i in range(40):
        t = i * 0.2 + (3.0 if i >= 30 else 0.0)  # a 3 s hole in the recording after sample 30
        util = 0.0 if 10 <= i < 20 else 95.0  # an idle stretch
        rows.append(f"{t:.1f},0,{util},{10 + i * 0.1:.2f},{300 if util else 80},,")
        rows.append(f"{t:.1f},,,,,{50 + i % 7},{3.5 + i * 0.01:.2f}")
    timeline.write_text("\n".join(rows) + "\n")
    return [
        # an earlier run of small-batch, replaced by the rerun below
        {
            "experiment": "small-batch",
            "status": "ok",
            "rank": 0,
            "started_at": "2025-01-01T10:00:00+00:00",
            "peak_alloc_gib": 99.0,
            "train_s": 999.0,
        },
        {
            "experiment": "baseline",
            "status": "oom",
            "rank": 0,
            "started_at": "2025-01-01T09:00:00+00:00",
            "reason": "CUDA out of memory",
            "peak_alloc_gib": 78.2,
            "predicted_peak_alloc_gib": 95.0,
            "predicted": _predicted(95.0),
            "train_s": None,
        },
        {
            "experiment": "small-batch",
            "status": "ok",
            "rank": 0,
            "started_at": "2025-01-01T11:00:00+00:00",
            "run_id": "r-small",
            "peak_alloc_gib": 11.0,
            "peak_reserved_gib": 12.5,
            "gpu_used_peak_gib": 13.1,
            "host_rss_peak_gib": 3.2,
            "train_s": 120.04,
            "tokens_per_s": 2345.67,
            "mfu": 0.41234,
            "predicted_peak_alloc_gib": 10.0,
            "predicted": _predicted(10.0),
            "timeline_path": "timelines/r-small.csv",
        },
        {
            "experiment": "full-13b",
            "status": "skipped",
            "rank": 0,
            "started_at": "2025-01-01T12:00:00+00:00",
            "reason": "needs CUDA",
        },
        # a distributed run: memory is the max over ranks, time comes from rank 0
        {
            "experiment": "fsdp",
            "status": "ok",
            "rank": 0,
            "world_size": 2,
            "started_at": "2025-01-01T13:00:00+00:00",
            "peak_alloc_gib": 20.0,
            "train_s": 50.0,
            "tokens_per_s": 900.0,
            "predicted_peak_alloc_gib": 25.0,
        },
        {
            "experiment": "fsdp",
            "status": "ok",
            "rank": 1,
            "world_size": 2,
            "started_at": "2025-01-01T13:00:01+00:00",
            "peak_alloc_gib": 22.5,
            "train_s": 51.0,
            "tokens_per_s": 880.0,
        },
    ]


ORDER = ["baseline", "small-batch", "full-13b", "fsdp"]


def test_latest_runs_keeps_the_rerun_and_the_lab_order(tmp_path):
    df = _write(tmp_path, _gpu_records(tmp_path))
    latest = tables.latest_runs(df, order=ORDER)
    assert list(zip(latest["experiment"], latest["rank_n"], strict=True)) == [
        ("baseline", 0),
        ("small-batch", 0),
        ("full-13b", 0),
        ("fsdp", 0),
        ("fsdp", 1),
    ]
    assert latest.loc[latest["experiment"] == "small-batch", "peak_alloc_gib"].item() == 11.0


def test_comparison_table_values_and_nan_not_zero(tmp_path):
    df = _write(tmp_path, _gpu_records(tmp_path))
    table = tables.comparison_table(df, order=ORDER).set_index("experiment")
    assert list(table.index) == ORDER
    assert list(table.reset_index().columns) == list(tables.TABLE_COLUMNS)
    small = table.loc["small-batch"]
    assert small["prediction_error_pct"] == pytest.approx(10.0)  # (11 - 10) / 10
    assert small["train_s"] == 120.0 and small["tokens_per_s"] == 2345.7 and small["mfu"] == 0.412
    baseline = table.loc["baseline"]
    assert baseline["status"] == "oom" and baseline["reason"] == "CUDA out of memory"
    assert math.isnan(baseline["train_s"])  # did not train: NaN, not 0 s
    assert baseline["predicted_peak_alloc_gib"] == 95.0
    assert math.isnan(baseline["prediction_error_pct"])  # an OOM stopped before its true peak: no error figure
    skipped = table.loc["full-13b"]
    assert skipped["status"] == "skipped" and skipped["reason"] == "needs CUDA"
    for column in ("peak_alloc_gib", "predicted_peak_alloc_gib", "prediction_error_pct", "train_s", "mfu"):
        assert math.isnan(skipped[column])
    fsdp = table.loc["fsdp"]
    assert fsdp["peak_alloc_gib"] == 22.5 and fsdp["train_s"] == 50.0 and fsdp["tokens_per_s"] == 900.0
    assert fsdp["prediction_error_pct"] == pytest.approx(-10.0)
    assert not (table["mfu"] == 0).any() and not (table["train_s"] == 0).any()


def test_prediction_falls_back_to_the_predicted_dict(tmp_path):
    df = _write(
        tmp_path, [{"experiment": "bf16-true", "status": "ok", "peak_alloc_gib": 9.0, "predicted": _predicted(12.0)}]
    )
    row = tables.comparison_table(df).iloc[0]
    assert row["predicted_peak_alloc_gib"] == 12.0 and row["prediction_error_pct"] == pytest.approx(-25.0)


def test_worst_rank_status_wins(tmp_path):
    df = _write(
        tmp_path,
        [
            {"experiment": "ddp", "status": "ok", "rank": 0, "peak_alloc_gib": 30.0, "train_s": 10.0},
            {"experiment": "ddp", "status": "oom", "rank": 1, "reason": "rank 1 OOM"},
        ],
    )
    row = tables.comparison_table(df).iloc[0]
    assert row["status"] == "oom" and row["reason"] == "rank 1 OOM" and row["peak_alloc_gib"] == 30.0


def _timed(seconds: list[float], *, warmup: int, start: int = 1) -> dict:
    """A record's per_iteration rows (litgpt's CSV as run_record reads it) and the fields derived from them."""
    rows = [{"iter": start + i, "loss": 1.0, "iter_time_s": t, "tokens": 100.0 * i} for i, t in enumerate(seconds)]
    timed = [t for i, t in enumerate(seconds) if start + i > warmup]
    return {"per_iteration": rows, "warmup_iterations": warmup, "iterations": len(timed), "train_s": sum(timed)}


def test_a_one_off_iteration_is_judged_against_its_runs_median_after_warm_up(tmp_path):
    """A timed iteration over ONE_OFF_FACTOR x the run's median timed iteration is a one-off; what it took beyond
    the median is its share of train_s. Warm-up iterations are not judged (train_s already leaves them out), a
    steady run shows 0, and a run with too few timed iterations to have a median shows NaN, never 0."""
    config = {"train": {"micro_batch_size": 4}}
    spiky = _timed([2.0, 0.3, 0.3, 0.3, 1.0, 0.2, 0.25, 0.2, 0.3, 0.2], warmup=4)  # iter 1 slow, but warm-up
    steady = _timed([0.9, 0.2, 0.25, 0.2, 0.3, 0.2], warmup=1)
    short = _timed([0.9, 5.0, 0.2, 0.2], warmup=1)  # 3 timed: no median to judge against
    df = _write(
        tmp_path,
        [
            {"experiment": "bf16-true", "status": "ok", "rank": None, "config": config, "tokens_per_s": 900.0, **spiky},
            {"experiment": "small-batch", "status": "ok", "rank": None, "config": config, **steady},
            {"experiment": "grad-accum", "status": "ok", "rank": None, "config": config, **short},
        ],
    )
    median = statistics.median([1.0, 0.2, 0.25, 0.2, 0.3, 0.2])
    assert 1.0 > tables.ONE_OFF_FACTOR * median > 0.3  # the fixture has exactly one one-off
    table = tables.comparison_table(df).set_index("experiment")
    assert table.loc["bf16-true", "one_off_pct"] == round(100 * (1.0 - median) / spiky["train_s"])
    assert table.loc["small-batch", "one_off_pct"] == 0
    assert math.isnan(table.loc["grad-accum", "one_off_pct"])
    found = tables.one_offs(df)
    assert found.to_dict("records") == [
        {"experiment": "bf16-true", "iter": 5, "iter_time_s": 1.0, "median_s": round(median, 3),
         "x_median": round(1.0 / median, 1), "pct_of_train_s": table.loc["bf16-true", "one_off_pct"]}
    ]  # fmt: skip
    figure = figures.plot_time(df, out_dir=tmp_path / "figures")
    hatched = [[patch for patch in ax.patches if patch.get_hatch()] for ax in figure.axes]
    # bf16-true's one span, in the train_s panel (the last) only: the steady panels and the rates leave it out
    assert [len(patches) for patches in hatched] == [0, 0, 0, 1]
    train_s, share = table.loc["bf16-true", "train_s"], table.loc["bf16-true", "one_off_pct"] / 100  # as shown
    span = hatched[3][0]
    assert span.get_y() + span.get_height() == pytest.approx(train_s)  # the top of its train_s bar
    assert span.get_height() == pytest.approx(train_s * share)  # what the one-off took beyond a median iteration
    assert span.get_height() == pytest.approx(1.0 - median, abs=0.05)
    assert tables.one_offs(df[df["experiment"] != "bf16-true"]).empty


def test_the_shipped_h100_records_show_the_longest_batchs_first_micro_batch_as_a_one_off():
    """Real data: in the first H100 records quick mode timed the peak step, and the first micro-batch of the
    longest batch took several times a steady iteration in bf16-true and full-7b (reference_results/README.md,
    "What the records show").
    The table, the label and the list say so; no other finished run of that file has a one-off."""
    frame = tables.load_reference("h100-80gb")
    found = tables.one_offs(frame)
    assert found["experiment"].tolist() == ["bf16-true", "full-7b"]
    latest = tables.latest_runs(frame).set_index("experiment")
    for row in found.to_dict("records"):
        assert row["iter"] == latest.loc[row["experiment"], "warmup_iterations"] + 1  # the first timed one
        assert row["x_median"] > 1.5 * tables.ONE_OFF_FACTOR
    for record in latest[latest["status"] == "ok"].reset_index().to_dict("records"):  # the factor sits in a gap
        timed = [r["iter_time_s"] for r in record["per_iteration"] if r["iter"] > record["warmup_iterations"]]
        ordered = sorted(timed)
        assert ordered[-2] < tables.ONE_OFF_FACTOR / 1.5 * statistics.median(timed), record["experiment"]
    table = tables.comparison_table(frame).set_index("experiment")
    assert (table.loc[["bf16-true", "full-7b"], "one_off_pct"] > 30).all()
    others = table.drop(["bf16-true", "full-7b"])
    assert (others.loc[others["status"] == "ok", "one_off_pct"] == 0).all()
    assert "(the time of bf16-true, full-7b includes a one-off iteration" in tables.reference_label(frame)


@pytest.mark.slow
def test_plots_are_written(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))  # timeline_path is relative to the results folder
    df = _write(tmp_path, _gpu_records(tmp_path))
    out = tmp_path / "figures"
    paths = figures.save_all(df, out, order=ORDER)
    names = sorted(p.name for p in paths)
    assert names == ["memory.png", "memory_vs_time.png", "time.png", "timeline_r-small.png"]
    assert all(p.exists() and p.stat().st_size > 5000 for p in paths)
    figure = figures.plot_memory(df, out_dir=out, order=ORDER)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "OOM" in texts and "skipped" in texts
    assert "CPU" not in figure.axes[0].get_title()


def test_timeline_reader_tolerates_missing_columns_and_shows_idle(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t_s,gpu,util_pct\n0,0,90\n0.2,0,1\n0.4,0,2\n0.6,0,95\n")
    frame = figures.read_timeline(path)
    assert {"mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib"} <= set(frame.columns)
    assert figures._idle_spans(frame[frame["gpu"].notna()]) == [(0.0, 0.6)]
    figure = figures.plot_timeline(path, out_dir=tmp_path)
    assert (tmp_path / "timeline_t.png").exists() and "shaded" in figure.get_suptitle()
    missing = figures.plot_timeline({"experiment": "x", "timeline_path": "nowhere.csv"}, out_dir=tmp_path)
    assert "no timeline" in missing.axes[0].texts[0].get_text()


def test_empty_frame(tmp_path):
    df = load_results(tmp_path / "none.jsonl")
    assert tables.latest_runs(df).empty
    table = tables.comparison_table(df)
    assert table.empty and list(table.columns) == list(tables.TABLE_COLUMNS)
    paths = figures.save_all(df, tmp_path / "figs")
    assert len(paths) == 3 and all(p.exists() for p in paths)
    figure = figures.plot_memory(df, out_dir=tmp_path / "figs")
    assert figures.NO_RUNS in [t.get_text() for t in figure.axes[0].texts]


STEADY = {"config": {"train": {"micro_batch_size": 2}}, "iter_median_s": 0.5}  # what the scatter's x comes from


@pytest.mark.slow
def test_cpu_only_runs_show_host_rss_and_say_so(tmp_path):
    df = _write(
        tmp_path,
        [
            {
                "experiment": "baseline",
                "profile": "ci",
                "status": "ok",
                "peak_alloc_gib": None,
                "host_rss_peak_gib": 1.8,
                "train_s": 12.0,
                "tokens_per_s": 80.0,
                "mfu": None,
                "predicted_peak_alloc_gib": 2.5,
                "predicted": _predicted(2.5),
                **STEADY,
            },
            {"experiment": "bf16-true", "profile": "ci", "status": "ok", "host_rss_peak_gib": 1.2, "train_s": 9.0,
             **STEADY},
        ],
    )
    table = tables.comparison_table(df, profile="ci")
    assert table["peak_alloc_gib"].isna().all() and table["mfu"].isna().all()
    assert table["host_rss_peak_gib"].tolist() == [1.8, 1.2]
    figure = figures.plot_memory(df, out_dir=tmp_path, profile="ci")
    assert "host RSS" in figure.axes[0].get_title()
    assert figures.plot_memory_vs_time(df, out_dir=tmp_path).axes[0].collections[0].get_offsets().shape[0] == 2
    assert tables.comparison_table(df, profile="gpu").empty


def test_load_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    with pytest.warns(UserWarning, match="no reference results are shipped yet"):
        assert tables.load_reference().empty
    folder = tmp_path / "reference_results"
    append_record({"experiment": "baseline", "status": "oom", "rank": 0}, path=folder / "NVIDIA-H100-80GB-HBM3.jsonl")
    append_record({"experiment": "lora-7b", "status": "ok", "peak_alloc_gib": 18.0}, path=folder / "NVIDIA-A100.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        both = tables.load_reference()
        one = tables.load_reference("NVIDIA-A100")
    assert sorted(both["reference"]) == ["NVIDIA-A100", "NVIDIA-H100-80GB-HBM3"]
    assert one["experiment"].tolist() == ["lora-7b"]
    with pytest.warns(UserWarning, match="shipped: NVIDIA-A100"):
        typo = tables.load_reference("V100")
    assert typo.empty
    # 03 with REFERENCE_NAME misspelt drew its empty figures and comparison.csv over your own in results/figures
    assert figures.figures_dir(typo) == figures.figures_dir() / "reference-none"
    assert isinstance(tables.comparison_table(both), pd.DataFrame)
    (folder / "NVIDIA-L4.jsonl").touch()  # named, and empty: the message was that every shipped file held none
    with pytest.warns(UserWarning, match=r"NVIDIA-L4\.jsonl holds no records"):
        assert tables.load_reference("NVIDIA-L4").empty


def test_time_per_sample_makes_grad_accum_comparable_with_small_batch(tmp_path):
    """grad-accum runs 4x the micro-batches of small-batch in the same number of optimizer steps: its train_s
    is about 4x by construction, its time per sample is not. The table shows both (LAB.md: compare fairly)."""
    config = {"train": {"micro_batch_size": 8}}
    df = _write(
        tmp_path,
        [
            {"experiment": "small-batch", "status": "ok", "rank": None, "train_s": 10.0, "iterations": 20, "config": config},
            {"experiment": "grad-accum", "status": "ok", "rank": None, "train_s": 38.0, "iterations": 80, "config": config},
            {"experiment": "baseline", "status": "oom", "rank": None, "train_s": None, "iterations": None, "config": config},
        ],
    )
    table = tables.comparison_table(df).set_index("experiment")
    assert table.loc["small-batch", "samples"] == 160 and table.loc["grad-accum", "samples"] == 640
    assert table.loc["small-batch", "ms_per_sample"] == pytest.approx(62.5)
    assert table.loc["grad-accum", "ms_per_sample"] == pytest.approx(59.38, abs=0.01)
    assert math.isnan(table.loc["baseline", "ms_per_sample"])  # no time: NaN, never 0
    columns = list(table.reset_index().columns)
    assert columns.index("ms_per_sample") == columns.index("train_s") + 2  # beside train_s, after samples


def test_gpu_references_are_labelled_and_never_mixed_with_cpu_stand_ins(tmp_path, monkeypatch):
    """Rows are tagged real GPU measurement or code path only; with no name, the GPU files alone are loaded, so a
    table never shows one experiment from an H100 beside another from a CPU. Records here are written by the
    test (a GPU record's fields as the lab writes them on CUDA)."""
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    folder = tmp_path / "reference_results"
    gpu = {"experiment": "lora-7b", "status": "ok", "rank": 0, "profile": "gpu", "mode": "quick",
           "device_name": "NVIDIA H100 80GB HBM3", "random_weights": True, "peak_alloc_gib": 27.8,
           "predicted_peak_alloc_gib": 27.93, "train_s": 3.4, "tokens_per_s": 2537.8, "mfu": 0.0967}  # fmt: skip
    append_record(gpu, path=folder / "h100-80gb.jsonl")
    append_record({"experiment": "full-13b", "status": "ok", "rank": 0, "profile": "ci"}, path=folder / "ci-cpu.jsonl")
    default = tables.load_reference()
    assert default["reference"].tolist() == ["h100-80gb"]
    assert default["measured_on"].tolist() == ["real GPU measurement (NVIDIA H100 80GB HBM3)"]
    assert tables.reference_label(default) == (
        "h100-80gb.jsonl: real GPU measurement (NVIDIA H100 80GB HBM3), random weights, quick mode, 1 records"
    )
    cpu = tables.load_reference("ci-cpu")
    assert cpu["measured_on"].tolist() == [tables.CODE_PATH_ONLY] and "code path only" in tables.reference_label(cpu)
    markdown = tables.markdown_table(tables.comparison_table(default)).splitlines()
    assert markdown[0].startswith("| experiment | status | measured peak GiB | predicted GiB | error %")
    # no per_iteration, no token counts: no steady figures; the stored MFU stands (nothing to derive it from)
    assert markdown[2] == "| lora-7b | ok | 27.8 | 27.93 | -0.5 | 3.4 |  |  |  |  |  | 9.7% |  |  |  |"


def test_the_readme_table_is_what_compare_prints_from_the_shipped_gpu_records(capsys):
    """reference_results/README.md's table is `compare --reference h100-80gb --markdown`'s output (never typed):
    the same function on the shipped records gives the same rows. An unknown name is one line naming the shipped."""
    from lab_helpers.cli import main

    frame = tables.load_reference("h100-80gb")
    assert tables.reference_label(frame).startswith("h100-80gb.jsonl: real GPU measurement (NVIDIA H100 80GB HBM3)")
    rows = tables.markdown_table(tables.comparison_table(frame)).splitlines()[2:]
    assert len(rows) == 12 and rows[0].startswith("| baseline | oom |")
    readme = (tables.reference_dir() / "README.md").read_text()
    assert all(row in readme for row in rows)
    assert main(["compare", "--reference", "v100"]) == 2
    assert "--reference v100: no such file" in capsys.readouterr().err


def test_with_no_name_one_gpus_reference_is_shown_never_two_mixed():
    """With h100-80gb and h200-141gb shipped, load_reference() mixed both GPUs in one table (and 03's figures went
    to reference-h100-80gb+h200-141gb/): now the course's GPU, with a warning naming the other."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = tables.load_reference()
    assert set(frame["reference"]) == {tables.DEFAULT_GPU_REFERENCE}
    assert any("h200-141gb" in str(w.message) for w in caught)
    assert set(tables.load_reference("h200-141gb")["reference"]) == {"h200-141gb"}


def test_a_results_folder_with_two_gpus_runs_names_each_rows_gpu_and_says_so(tmp_path):
    """A results folder kept across leases (a home directory) on an H100 node, then an H200 node: each row is the
    latest run of its experiment, whichever GPU ran it, and the table put them side by side unmarked. Now a gpu
    column and one warning; one GPU's folder is unchanged. The shipped records of both GPUs, in one file."""
    from lab_helpers.present.table_display import terminal_table
    from lab_helpers.record.records import read_records

    both = [
        *read_records(tables.reference_dir() / "h100-80gb.jsonl"),
        *read_records(tables.reference_dir() / "h200-141gb.jsonl"),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tables.comparison_table(_write(tmp_path, both), profile="gpu")
    [warning] = [w for w in caught if "GPUs" in str(w.message)]
    assert str(warning.message).startswith("these runs come from 2 GPUs (")
    assert list(table.columns[:3]) == ["experiment", "gpu", "status"]
    gpu_of = dict(zip(table["experiment"], table["gpu"], strict=True))
    assert gpu_of["lora-3b"] == "H100 SXM" and gpu_of["lora-1b"] == "H200 SXM"  # lora-3b ran on the H100 only
    assert terminal_table(table).splitlines()[0].split()[:3] == ["experiment", "gpu", "status"]
    assert tables.markdown_table(table).startswith("| experiment | GPU | status |")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one = tables.comparison_table(tables.load_reference("h200-141gb"), profile="gpu")
    assert "gpu" not in one.columns and not [w for w in caught if "GPUs" in str(w.message)]


def test_steps_and_samples_names_a_misspelt_experiment_and_takes_one_name():
    """A typo ('small-bach') gave an empty table without a word; one name as a string was read as its letters."""
    from lab_helpers.config.config_error import LabConfigError

    reference = tables.load_reference("ci-cpu")
    with pytest.raises(LabConfigError, match=r"no experiment 'small-bach' \(did you mean 'small-batch'\?\)"):
        tables.steps_and_samples(reference, ["small-batch", "small-bach"], profile="ci")
    one = tables.steps_and_samples(reference, "small-batch", profile="ci")
    assert one["experiment"].tolist() == ["small-batch"]
