"""The plots the notebooks show after a section, from the same records as ``tables``. ``matplotlib.figure.Figure``,
not pyplot: no GUI backend is needed and no global figure state leaks between calls. Runs that did not finish are
drawn as their status text, not as an empty bar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lab_helpers.config.iteration_times import finite_number as _number
from lab_helpers.config.paths import (
    lab_home,
    reference_dir,
    regular_file_inside,
    results_dir,
)
from lab_helpers.config.record_schema import BREAKDOWN_PARTS
from lab_helpers.present import figure_source, timeline_phases
from lab_helpers.present.figure_display import breakdown_colors, new_figure
from lab_helpers.present.figure_files import made_figures_dir, save_figure
from lab_helpers.present.tables import STATUS_LABEL, as_mapping, comparison_table, measured_memory, rank0_records
from lab_helpers.record.records import latest_runs

NO_RUNS = "no runs recorded yet"


# ------------------------------------------------------------------------------------------------ plots


def figures_dir(frame: pd.DataFrame | None = None) -> Path:
    """A folder of their own for reference results, so looking at them never overwrites your figures."""
    base = results_dir() / "figures"
    if frame is None or "reference" not in frame:
        return base
    return base / f"reference-{'+'.join(sorted(set(frame['reference'].dropna()))) or 'none'}"  # none: none loaded


def figures_folder(out_dir: Path | str | None, frame: pd.DataFrame | None = None) -> Path:
    return made_figures_dir(out_dir if out_dir is not None else figures_dir(frame))


def _empty_plot(out_dir: Path | str | None, filename: str, title: str) -> Any:
    figure, ax = new_figure(6, 2.5)
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, NO_RUNS, ha="center", va="center", fontsize=14, transform=ax.transAxes)
    return save_figure(figure, out_dir, filename)


def plot_memory(
    df: pd.DataFrame,
    *,
    out_dir: Path | str | None = None,
    order: Sequence[str] | None = None,
    profile: str | None = None,
) -> Any:
    """The measured peak beside a stacked bar of the planner's predicted breakdown."""
    table = comparison_table(df, order=order, profile=profile)
    if table.empty:
        return _empty_plot(out_dir, "memory.png", "Peak memory: measured vs predicted")
    latest = latest_runs(df, profile=profile, order=order)
    measured_column, measured_label = measured_memory(table)
    figure, ax = new_figure(max(7.5, 1.1 * len(table) + 4), 4.8)
    x = range(len(table))
    width = 0.38
    colors = breakdown_colors()
    drawn_parts: set[str] = set()
    top = 0.0
    for i, row in enumerate(table.to_dict("records")):
        measured = _number(row[measured_column])
        if measured is not None:
            ax.bar(i - width / 2, measured, width, color="#333333", label=None if i else measured_label)
            top = max(top, measured)
        status = row["status"]
        if status != "ok":
            label = STATUS_LABEL.get(status, str(status))
            y = measured if measured is not None else 0.0
            ax.text(i - width / 2, y, label, ha="center", va="bottom", color="#b00020", fontsize=9, weight="bold")
        breakdown = _breakdown_for(latest, row["experiment"])
        bottom = 0.0
        if breakdown:
            for part in BREAKDOWN_PARTS:
                value = _number(breakdown.get(part))
                if not value:
                    continue
                ax.bar(
                    i + width / 2,
                    value,
                    width,
                    bottom=bottom,
                    color=colors[part],
                    label=part.replace("_", " ") if part not in drawn_parts else None,
                )
                drawn_parts.add(part)
                bottom += value
        predicted = _number(row["predicted_peak_alloc_gib"])
        if predicted is not None and breakdown:  # the predicted peak need not be the sum of the parts
            ax.hlines(
                predicted,
                i,
                i + width,
                colors="black",
                linestyles="dashed",
                linewidth=1.2,
                label=None if "peak" in drawn_parts else "predicted peak",
            )
            drawn_parts.add("peak")
            top = max(top, predicted)
        if predicted is not None and not breakdown:
            ax.bar(
                i + width / 2, predicted, width, color="#9ecae1", label=None if "total" in drawn_parts else "predicted"
            )
            drawn_parts.add("total")
            bottom = predicted
        if bottom == 0.0 and predicted is None:
            ax.text(
                i + width / 2, 0.0, "no prediction", ha="center", va="bottom", rotation=90, fontsize=8, color="#777"
            )
        top = max(top, bottom)
    records = rank0_records(df, order=order, profile=profile)
    capacity = figure_source.gpu_capacity_gib(records.values())
    if capacity is not None:
        ax.axhline(capacity[0], color="#b00020", linestyle="-.", linewidth=1.2,
                   label=f"GPU capacity: {capacity[0]:.0f} GiB nominal ({capacity[1]})")  # fmt: skip
        top = max(top, capacity[0])
    ax.set_xticks(list(x), _labels_with_mode(table["experiment"], records), rotation=30, ha="right")
    ax.set_ylabel("GiB (2^30 bytes)")
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    title = f"Peak memory: measured (left) vs predicted breakdown (right)\n{figure_source.describe(records.values())}"
    if measured_column != "peak_alloc_gib":
        title += f"\nno GPU memory recorded: {measured_label.removeprefix('measured ')}"
    ax.set_title(title, fontsize=10)
    handles, labels = _legend_in_stack_order(ax)
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(figure, out_dir, "memory.png")


def _legend_in_stack_order(ax: Any) -> tuple[list[Any], list[str]]:
    """The legend as the bars read, top down: BREAKDOWN_PARTS is the stacking order, bottom first."""
    handles, labels = ax.get_legend_handles_labels()
    parts = [part.replace("_", " ") for part in BREAKDOWN_PARTS]

    def rank(label: str) -> float:
        if label.startswith("GPU capacity"):
            return -3
        if label == "predicted peak":
            return -2
        if label == "predicted":
            return -1
        if label in parts:
            return len(parts) - parts.index(label)  # top of the stack first
        return 100  # the measured bar
    pairs = sorted(zip(handles, labels, strict=True), key=lambda pair: rank(pair[1]))
    return [h for h, _ in pairs], [label for _, label in pairs]


def _breakdown_for(latest: pd.DataFrame, experiment: str) -> Mapping[str, Any]:
    if "predicted" not in latest:
        return {}
    rows = latest[latest["experiment"] == experiment].sort_values("rank_n")
    for value in rows["predicted"]:
        breakdown = as_mapping(as_mapping(value).get("breakdown_gib"))
        if breakdown:
            return breakdown
    return {}


def plot_time(
    df: pd.DataFrame,
    *,
    out_dir: Path | str | None = None,
    order: Sequence[str] | None = None,
    profile: str | None = None,
) -> Any:
    """Like with like first: the steady panels, then ``train_s`` last, as it depends on how many steps ran (quick
    and full mode differ)."""
    table = comparison_table(df, order=order, profile=profile)
    if table.empty:
        return _empty_plot(out_dir, "time.png", "Training time and throughput")
    records = rank0_records(df, order=order, profile=profile)
    figure, axes = new_figure(max(8.0, 0.6 * len(table) + 3), 13.0, 4, 1, sharex=True)  # one row per measure
    share = (pd.to_numeric(table["one_off_pct"], errors="coerce").fillna(0.0) / 100).clip(0.0, 0.99)
    micro = pd.Series([_micro_batch(records.get(e, {})) for e in table["experiment"]], dtype=float)
    median_s = pd.to_numeric(table["iter_median_s"], errors="coerce")
    unsplit = pd.to_numeric(table["steady_ms_per_sample"], errors="coerce").isna()  # no steady time: all timed
    table = table.assign(
        iter_median_ms=median_s * 1e3,
        steady_ms_per_sample=per_sample_ms(table, micro),
        steady_iqr_ms_per_sample=(pd.to_numeric(table["iter_iqr_s"], errors="coerce") * 1e3 / micro).where(unsplit),
    )
    cpu = figure_source.on_cpu(records.values())
    note = f" -- CPU: {figure_source.CPU_TIME_NOTE}" if cpu else ""
    spreads = {"steady_ms_per_sample": table["steady_iqr_ms_per_sample"],
               "iter_median_ms": pd.to_numeric(table["iter_iqr_s"], errors="coerce") * 1e3}  # fmt: skip
    for ax, column, ylabel, title in (
        (axes[0], "steady_ms_per_sample", "ms / sample",
         "Time per training sample, steady: micro-batches of a length seen before (light: all timed, first-seen "
         "lengths included, where the run cannot tell them apart; bars: IQR)" + note),
        (axes[1], "iter_median_ms", "ms", "Median micro-batch after warm-up (bars: IQR; n: timed)" + note),
        (axes[2], "tokens_per_s_padded", "padded tokens / s",
         "Throughput from the median micro-batch; label: what bounds the run" + note),
        (axes[3], "train_s", "seconds",
         "Whole timed loop, train_s: grows with the steps run, compare within one mode" + note),
    ):  # fmt: skip
        values = pd.to_numeric(table[column], errors="coerce")
        light = unsplit if column == "steady_ms_per_sample" else pd.Series(False, index=table.index)
        colours = ["#a6bddb" if pale else "#4c72b0" for pale in light]
        ax.bar(range(len(table)), values.fillna(0.0), color=colours)  # missing: no bar, a label instead
        if column == "iter_median_ms":
            _iqr_bars(ax, values, spreads[column], counts=pd.to_numeric(table["iter_count"], errors="coerce"))
        if column == "steady_ms_per_sample":
            _iqr_bars(ax, values, spreads[column])
        if column == "tokens_per_s_padded":
            _bound_labels(ax, table, values)
        for i, (value, status) in enumerate(zip(values, table["status"], strict=True)):
            if pd.isna(value):
                label = STATUS_LABEL.get(status, "no data") if status != "ok" else "no data"
                ax.text(i, 0, label, ha="center", va="bottom", rotation=90, color="#b00020", fontsize=9)
        tops = _one_off_spans(ax, values, share) if column == "train_s" else 0.0
        if column in spreads:  # the whole IQR bar on the panel, however noisy the run
            tops = max(tops, (values + spreads[column] / 2).max())
        ax.set_xticks(range(len(table)), _labels_with_mode(table["experiment"], records), rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)  # rank 0's figures, as the table's
        top = max(values.max(), tops)
        ax.set_ylim(0, top * 1.2 if pd.notna(top) and top > 0 else 1.0)
    if (share > 0.005).any():
        axes[3].legend(fontsize=8, loc="upper left")
    figure.suptitle(f"Training time and throughput: {figure_source.describe(records.values())}", fontsize=11)
    return save_figure(figure, out_dir, "time.png")


def per_sample_ms(table: pd.DataFrame, micro: pd.Series) -> pd.Series:
    """The steady time where the run has one, else its median micro-batch (first-seen lengths included)."""
    steady = pd.to_numeric(table["steady_ms_per_sample"], errors="coerce")
    return steady.fillna(pd.to_numeric(table["iter_median_s"], errors="coerce") * 1e3 / micro.values)


def _micro_batch(record: Mapping[str, Any]) -> float:
    micro = _number(as_mapping(as_mapping(record.get("config")).get("train")).get("micro_batch_size"))
    return micro if micro else math.nan


def _labels_with_mode(experiments: pd.Series, records: Mapping[str, Mapping[str, Any]]) -> list[str]:
    modes = {e: figure_source.mode_of(records.get(e, {})) for e in experiments}
    if len(set(modes.values())) < 2:
        return list(experiments)
    return [f"{e} [{modes[e] or '?'}]" for e in experiments]


def _iqr_bars(ax: Any, medians: pd.Series, iqrs: pd.Series, *, counts: pd.Series | None = None) -> None:
    for i, (median, iqr) in enumerate(zip(medians, iqrs, strict=True)):
        if pd.notna(median) and pd.notna(iqr):
            ax.errorbar(i, median, yerr=iqr / 2, color="#222222", capsize=3, linewidth=1)
        if counts is not None and pd.notna(median) and pd.notna(counts.iloc[i]):
            ax.text(i, 0, f"n={counts.iloc[i]:.0f}", ha="center", va="bottom", fontsize=7, color="white")


def _bound_labels(ax: Any, table: pd.DataFrame, values: pd.Series) -> None:
    for i, (value, bound, busy) in enumerate(zip(values, table["bound"], table["gpu_busy_pct"], strict=True)):
        if pd.isna(value) or not isinstance(bound, str):
            continue
        label = bound if pd.isna(busy) else f"{bound}, GPU {busy:.0f}%"
        ax.text(i, value, label, ha="center", va="bottom", rotation=90, fontsize=7)


def _one_off_spans(ax: Any, values: pd.Series, share: pd.Series) -> float:
    """Hatching means "time that was there, spent on one-offs", never a time or rate the run did not have."""
    top = 0.0
    label = "one-off iterations' time beyond a median iteration (one_off_pct)"
    for i, (value, part) in enumerate(zip(values, share, strict=True)):
        if pd.isna(value) or part <= 0.005:
            continue
        bottom, height = value * (1 - part), value * part
        ax.bar(i, height, bottom=bottom, color="none", edgecolor="#b00020", hatch="//", linewidth=0.8, label=label)
        label = None  # one legend entry
        top = max(top, bottom + height)
    return top


def plot_memory_vs_time(
    df: pd.DataFrame,
    *,
    out_dir: Path | str | None = None,
    order: Sequence[str] | None = None,
    profile: str | None = None,
) -> Any:
    """Against time per sample, which quick and full mode share, unlike ``train_s``."""
    table = comparison_table(df, order=order, profile=profile)
    if table.empty:
        return _empty_plot(out_dir, "memory_vs_time.png", "Peak memory vs time per sample")
    records = rank0_records(df, order=order, profile=profile)
    column, label = measured_memory(table)
    micro = pd.Series([_micro_batch(records.get(e, {})) for e in table["experiment"]], dtype=float)
    unsplit = pd.to_numeric(table["steady_ms_per_sample"], errors="coerce").isna()
    table = table.assign(steady_ms_per_sample=per_sample_ms(table, micro))
    points = table[table[column].notna() & table["steady_ms_per_sample"].notna()]
    figure, ax = new_figure(6.5, 4.8)
    ax.scatter(points["steady_ms_per_sample"], points[column], color="#4c72b0")
    for index, row in points.iterrows():  # the modes are in the title: a label per point would crowd them
        name = row["experiment"] + ("*" if unsplit[index] else "")
        ax.annotate(name, (row["steady_ms_per_sample"], row[column]), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)  # fmt: skip
    missing = table.loc[~table.index.isin(points.index), "experiment"].tolist()
    cpu = figure_source.on_cpu(records.values())
    ax.set_xlabel("ms per training sample, steady (lengths seen before; *: all timed)"
                  + (" -- code path only" if cpu else ""))  # fmt: skip
    ax.set_ylabel(label.removeprefix("measured ") + ", GiB")
    title = f"Peak memory vs time per sample\n{figure_source.describe(records.values())}"
    if missing:
        title += f"\nnot shown (no measurement): {', '.join(missing)}"
    ax.set_title(title, fontsize=9)
    if points.empty:
        ax.text(0.5, 0.5, "no run has both memory and time", ha="center", va="center", transform=ax.transAxes)
    return save_figure(figure, out_dir, "memory_vs_time.png")


def plot_time_prediction(
    df: pd.DataFrame,
    *,
    out_dir: Path | str | None = None,
    order: Sequence[str] | None = None,
    profile: str | None = None,
) -> Any:
    """Each prediction takes its MFU from the *other* records (leave-one-out): a run is never predicted from itself."""
    from lab_helpers.hardware.cpu_speed import measure_cpu_rates
    from lab_helpers.planning.planner.calibration import CPU, device_key
    from lab_helpers.planning.planner.timing import predicted_vs_measured

    latest = latest_runs(df, profile=profile, order=order)
    records = latest.to_dict("records")
    on_cpu = any(device_key(record.get("device_name")) == CPU for record in records)
    rows = predicted_vs_measured(records, cpu_rates=measure_cpu_rates() if on_cpu else None) if records else []
    if not rows:
        return _empty_plot(out_dir, "time_predicted.png", "Step time: measured vs predicted")
    figure, ax = new_figure(max(7.5, 0.8 * len(rows) + 3), 4.2)
    width = 0.38
    for i, row in enumerate(rows):
        ax.bar(i - width / 2, row["measured_step_s"], width, color="#333333", label=None if i else "measured")
        ax.bar(i + width / 2, row["predicted_step_s"], width, color="#9ecae1", label=None if i else "predicted")
        ax.text(i + width / 2, row["predicted_step_s"], f"{row['error_pct']:+.0f}%", ha="center", va="bottom", fontsize=7)
    errors = sorted(abs(row["error_pct"]) for row in rows)
    ax.set_xticks(range(len(rows)), [row["experiment"] for row in rows], rotation=30, ha="right")
    ax.set_ylabel("seconds per optimizer step")
    ax.set_title(
        f"Step time: measured (left) vs predicted (right), {', '.join(sorted({r['device'] for r in rows}))}; "
        f"|error| median {errors[len(errors) // 2]:.0f}%, worst {errors[-1]:.0f}%",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    return save_figure(figure, out_dir, "time_predicted.png")


# ------------------------------------------------------------------------------------------------ timeline


def read_timeline(path: Path | str) -> pd.DataFrame:
    frame = pd.read_csv(path)
    for column in ("t_s", "gpu", "util_pct", "mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib"):
        if column not in frame:
            frame[column] = float("nan")
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True)


def _timeline_path(record_or_path: Any) -> tuple[Path | None, str]:
    """The CSV of a record (dict / DataFrame row) or a path; relative paths are tried under results and refs."""
    if isinstance(record_or_path, (str, Path)):
        raw, name = record_or_path, Path(record_or_path).stem
    else:
        record = record_or_path.to_dict() if hasattr(record_or_path, "to_dict") else dict(record_or_path)
        raw = record.get("timeline_path")
        name = str(record.get("run_id") or record.get("experiment") or "run")
        if record.get("rank") not in (None, 0) and _number(record.get("rank")) is not None:
            name += f"-rank{int(_number(record.get('rank')))}"
    if not isinstance(raw, (str, Path)) or not str(raw):
        return None, name
    path = Path(raw)
    if isinstance(record_or_path, (str, Path)):  # the caller's own path: read where it says
        tried = [path] if path.is_absolute() else [results_dir() / path, reference_dir() / path, lab_home() / path, path]
        return next((c for c in tried if c.exists()), None), name
    # a record's path is data anyone can edit: only a regular file inside the results or reference folder is read
    inside = (regular_file_inside(folder, str(raw)) for folder in (results_dir(), reference_dir()))
    return next((p for p in inside if p is not None), None), name


def plot_timeline(record_or_path: Any, *, out_dir: Path | str | None = None) -> Any:
    """Idle stretches are shaded and gaps in the recording left unjoined, so both stand out. Percent axes are fixed
    at 0-100 %: an axis that auto-scales draws 96.6-100 % as a full swing."""
    path, name = _timeline_path(record_or_path)
    record = {} if isinstance(record_or_path, (str, Path)) else dict(record_or_path)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]  # a name the file system takes
    filename = f"timeline_{safe}.png"
    if path is None:
        figure, ax = new_figure(6, 2.5)
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"no timeline recorded for {name}", ha="center", va="center", transform=ax.transAxes)
        return save_figure(figure, out_dir, filename)
    frame = read_timeline(path)
    gpu_rows = frame[frame["gpu"].notna()]
    host_rows = frame[frame["gpu"].isna()]
    panels = [("util_pct", "GPU util %"), ("mem_used_gib", "GPU memory used, GiB"), ("power_w", "GPU power, W")]
    panels = [p for p in panels if gpu_rows[p[0]].notna().any()]
    host_panels = [
        p
        for p in (("host_cpu_pct", "host CPU %"), ("host_ram_gib", "host RAM (run), GiB"))
        if host_rows[p[0]].notna().any()
    ]
    all_panels = [("gpu", *p) for p in panels] + [("host", *p) for p in host_panels]
    if not all_panels:
        figure, ax = new_figure(6, 2.5)
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"timeline of {name} has no samples", ha="center", va="center", transform=ax.transAxes)
        return save_figure(figure, out_dir, filename)
    height = 1.9 * len(all_panels) + 1.05  # room above the panels for a two-line title and the phases' names
    # fixed margins, in inches: the panels are always alike, and a constrained layout would take more than half
    # of each figure's drawing time (save_all draws one per run)
    figure, axes = new_figure(9, height, len(all_panels), 1, layout=None, sharex=True, squeeze=False)
    figure.subplots_adjust(left=0.75 / 9, right=1 - 0.15 / 9, top=1 - 0.8 / height, bottom=0.5 / height, hspace=0.12)
    axes = [row[0] for row in axes]
    idle_spans = _idle_spans(gpu_rows)
    run_phases = timeline_phases.phases(record, frame)
    oom_s = timeline_phases.oom_moment_s(record, frame)
    for ax, (kind, column, label) in zip(axes, all_panels, strict=True):
        if kind == "gpu":
            for gpu, rows in gpu_rows.groupby("gpu"):
                t, y = _broken_line(rows["t_s"], rows[column])
                ax.plot(t, y, label=f"GPU {int(gpu)}", linewidth=1)
            if gpu_rows["gpu"].nunique() > 1:
                ax.legend(fontsize=7, loc="upper right")
        else:
            t, y = _broken_line(host_rows["t_s"], host_rows[column])
            ax.plot(t, y, color="#555555", linewidth=1)
        for start, end in idle_spans:
            ax.axvspan(start, end, color="#f2c14e", alpha=0.25, linewidth=0)
        if column.endswith("_pct"):
            ax.set_ylim(0, 105)  # 0-100 %, a little headroom for the line at 100
        _mark_phases(ax, run_phases, oom_s, labelled=ax is axes[0])
        ax.set_ylabel(label, fontsize=8)
    axes[-1].set_xlabel("seconds since launch")
    figure.suptitle(_timeline_title(record, name, idle_spans, run_phases), y=1 - 0.08 / height, va="top", fontsize=10)
    return save_figure(figure, out_dir, filename)


def _timeline_title(record: Mapping[str, Any], name: str, idle_spans: list, run_phases: list) -> str:
    experiment = record.get("experiment")
    head = f"Timeline: {experiment or name}"
    notes = [f"run {name}"] if experiment else []
    if record:
        head += f" -- {figure_source.describe([record])}"
        if not run_phases and record.get("status") != "oom":
            notes.append("load / loop / teardown not in this record")
    if idle_spans:
        notes.append("shaded: all GPUs < 5 % busy")
    return head + (f"\n{'; '.join(notes)}" if notes else "")


def _mark_phases(ax: Any, run_phases: list[tuple[str, float, float]], oom_s: float | None, *, labelled: bool) -> None:
    for i, (phase, start, end) in enumerate(run_phases):
        if i:
            ax.axvline(start, color="#333333", linestyle=":", linewidth=1)
        if labelled:
            ax.text((start + end) / 2, 1.02, phase, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=8, color="#333333")  # fmt: skip
    if oom_s is not None:
        ax.axvline(oom_s, color="#b00020", linewidth=1.2)
        if labelled:
            ax.text(oom_s, 1.02, "OOM (first sample at the memory peak) ", transform=ax.get_xaxis_transform(),
                    ha="right", va="bottom", fontsize=8, color="#b00020")  # fmt: skip


def _broken_line(t: pd.Series, y: pd.Series) -> tuple[list[float], list[float]]:
    """Insert NaN where samples are far apart (> 3x the median interval) so the line shows the gap."""
    t = pd.to_numeric(t, errors="coerce").reset_index(drop=True)
    y = pd.to_numeric(y, errors="coerce").reset_index(drop=True)
    steps = t.diff()
    median = steps.median()
    out_t: list[float] = []
    out_y: list[float] = []
    for i in range(len(t)):
        if i and pd.notna(median) and median > 0 and steps[i] > 3 * median:
            out_t.append(float("nan"))
            out_y.append(float("nan"))
        out_t.append(float(t[i]))
        out_y.append(float(y[i]))
    return out_t, out_y


def _idle_spans(gpu_rows: pd.DataFrame, threshold_pct: float = 5.0) -> list[tuple[float, float]]:
    if gpu_rows.empty or gpu_rows["util_pct"].isna().all():
        return []
    busiest = gpu_rows.groupby("t_s")["util_pct"].max().sort_index()
    spans: list[tuple[float, float]] = []
    start = None
    previous_t = None
    for t_s, util in busiest.items():
        idle = pd.notna(util) and util < threshold_pct
        if idle and start is None:
            start = previous_t if previous_t is not None else t_s
        if not idle and start is not None:
            spans.append((start, t_s))
            start = None
        previous_t = t_s
    if start is not None and previous_t is not None and previous_t > start:
        spans.append((start, previous_t))
    return spans


# ------------------------------------------------------------------------------------------------ all


def save_all(
    df: pd.DataFrame,
    out_dir: Path | str | None = None,
    *,
    order: Sequence[str] | None = None,
    profile: str | None = None,
) -> list[Path]:
    """``out_dir`` defaults to ``figures_dir(df)``: reference results get a folder of their own."""
    out_dir = out_dir if out_dir is not None else figures_dir(df)
    paths: list[Path] = []
    for plot in (plot_memory, plot_time, plot_memory_vs_time):
        paths.append(plot(df, out_dir=out_dir, order=order, profile=profile).lab_path)
    latest = latest_runs(df, profile=profile, order=order)
    if "timeline_path" in latest:
        for record in latest.to_dict("records"):
            if _timeline_path(record)[0] is not None:
                paths.append(plot_timeline(record, out_dir=out_dir).lab_path)
    return paths
