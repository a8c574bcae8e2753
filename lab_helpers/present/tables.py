"""The comparison table, measured beside predicted, from records alone: a student without a GPU sees the same table
from the shipped references. Missing values stay NaN: an OOM'd run has no training time, it did not take 0 s.
"""

from __future__ import annotations

import math
import sys
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lab_helpers.config.iteration_times import ONE_OFF_FACTOR as ONE_OFF_FACTOR  # the notebook names it
from lab_helpers.config.iteration_times import finite_number as _number
from lab_helpers.config.iteration_times import one_off_excess_s, one_off_iterations
from lab_helpers.config.paths import reference_dir
from lab_helpers.planning.cost import cost_usd, usd_text
from lab_helpers.present.table_display import TERMINAL_WIDTH, ComparisonTable, printable
from lab_helpers.record.records import empty_runs_frame, latest_runs, load_results

MEMORY_COLUMNS = ("peak_alloc_gib", "peak_tensor_gib", "peak_reserved_gib", "gpu_used_peak_gib", "host_rss_peak_gib")
RANK0_COLUMNS = (
    "train_s", "wall_s", "tokens_per_s", "tokens_per_s_padded", "mfu", "predicted_peak_alloc_gib", "iter_median_s",
    "iter_iqr_s", "iter_count", "padding_pct", "flops_per_token", "gpu_peak_flops", "gpu_busy_pct", "host_core_pct",
    "steady_iter_s", "first_seen_count", "first_seen_pct",
)  # fmt: skip
TABLE_COLUMNS = (
    "experiment",
    "status",
    "peak_alloc_gib",
    "peak_tensor_gib",
    "predicted_peak_alloc_gib",
    "prediction_error_pct",
    "peak_reserved_gib",
    "gpu_used_peak_gib",
    "host_rss_peak_gib",
    "train_s",
    "samples",
    "ms_per_sample",
    "steady_ms_per_sample",
    "first_seen_count",
    "first_seen_pct",
    "steady_basis",
    "tokens_per_s",
    "iter_median_s",
    "iter_iqr_s",
    "iter_count",
    "tokens_per_s_padded",
    "padding_pct",
    "flops_per_token",
    "gpu_peak_flops",
    "mfu",
    "gpu_busy_pct",
    "host_core_pct",
    "bound",
    "one_off_pct",
    "reason",
)
ROUNDING = {
    "peak_alloc_gib": 2,
    "peak_tensor_gib": 4,
    "predicted_peak_alloc_gib": 4,  # CPU runs predict tens of MiB: 2 digits would erase the comparison
    "prediction_error_pct": 1,
    "peak_reserved_gib": 2,
    "gpu_used_peak_gib": 2,
    "host_rss_peak_gib": 2,
    "train_s": 1,
    "samples": 0,
    "ms_per_sample": 2,
    "steady_ms_per_sample": 2,
    "first_seen_count": 0,
    "first_seen_pct": 0,
    "tokens_per_s": 1,
    "iter_median_s": 4,
    "iter_iqr_s": 4,
    "iter_count": 0,
    "tokens_per_s_padded": 1,
    "padding_pct": 1,
    "gpu_busy_pct": 0,
    "host_core_pct": 0,
    "mfu": 3,
    "one_off_pct": 0,
}
# When ranks of one run disagree, the table shows the worst outcome (an OOM on rank 3 is the run's story).
STATUS_SEVERITY = {"oom": 0, "error": 1, "timeout": 2, "interrupted": 3, "skipped": 4, "ok": 5}
STATUS_LABEL = {
    "oom": "OOM",
    "error": "error",
    "timeout": "timeout",
    "interrupted": "interrupted",
    "skipped": "skipped",
}


# ------------------------------------------------------------------------------------------------ the table


def comparison_table(
    df: pd.DataFrame,
    *,
    order: Sequence[str] | None = None,
    profile: str | None = None,
    usd_per_gpu_hour: float | None = None,
) -> pd.DataFrame:
    """Memory is the maximum over ranks (the rank that runs out first decides), time rank 0's.
    ``prediction_error_pct`` is (measured - predicted) / predicted on ``peak_alloc_gib`` (on a CPU ``peak_tensor_gib``,
    what the planner predicts there): positive means under-predicted. ``cost_usd`` needs the user's
    ``usd_per_gpu_hour``: the lab has no price."""
    latest = latest_runs(df, profile=profile, order=order)
    if latest.empty:
        return ComparisonTable({column: pd.Series(dtype=_dtype(column)) for column in TABLE_COLUMNS})
    for column in (*MEMORY_COLUMNS, *RANK0_COLUMNS, "reason", "predicted"):
        if column not in latest:
            latest[column] = None
    latest["predicted_peak_alloc_gib"] = [
        _number(row.get("predicted_peak_alloc_gib"))
        if _number(row.get("predicted_peak_alloc_gib")) is not None
        else _number(as_mapping(row.get("predicted")).get("peak_alloc_gib"))
        for row in latest.to_dict("records")
    ]
    rows = []
    for experiment, ranks in latest.groupby("experiment", sort=False):
        first = ranks.sort_values("rank_n").iloc[0]
        worst = ranks.assign(_sev=ranks["status"].map(STATUS_SEVERITY).fillna(-1)).sort_values("_sev").iloc[0]
        row: dict[str, Any] = {"experiment": experiment, "status": worst["status"]}
        for column in MEMORY_COLUMNS:
            row[column] = pd.to_numeric(ranks[column], errors="coerce").max()  # NaN when every rank lacks it
        for column in RANK0_COLUMNS:
            row[column] = _number(first[column])
        row["reason"] = worst["reason"] if isinstance(worst["reason"], str) and worst["reason"] else None
        row["gpu"] = gpu_label(first.get("device_name"))
        row["bound"] = first.get("bound") if isinstance(first.get("bound"), str) else None  # rank 0's, as its time
        row["samples"] = _samples(first.to_dict())
        row["ms_per_sample"] = _per_sample_ms(row["train_s"], row["samples"])
        row["one_off_pct"] = _one_off_pct(first.to_dict(), row["train_s"])
        micro = _number(as_mapping(as_mapping(first.get("config")).get("train")).get("micro_batch_size"))
        steady_s = row.pop("steady_iter_s")
        row["steady_ms_per_sample"] = 1e3 * steady_s / micro if steady_s and micro else None
        basis = first.get("steady_basis")  # why a run has no steady time: said in its row, never left blank unsaid
        row["steady_basis"] = basis if isinstance(basis, str) and row["train_s"] is not None else None
        if usd_per_gpu_hour is not None:
            gpus = _number(first.get("world_size")) or len(ranks)
            row["cost_usd"] = None if row["wall_s"] is None else cost_usd(row["wall_s"], gpus, usd_per_gpu_hour)
        rows.append(row)
    table = pd.DataFrame(rows)
    measured = pd.to_numeric(table["peak_alloc_gib"], errors="coerce").fillna(
        pd.to_numeric(table["peak_tensor_gib"], errors="coerce")
    )
    predicted = pd.to_numeric(table["predicted_peak_alloc_gib"], errors="coerce")
    # only a finished run has a true peak: an OOM'd run stopped at whatever it reached before failing
    finished = table["status"] == "ok"
    table["prediction_error_pct"] = ((measured - predicted) / predicted.where(predicted > 0) * 100).where(finished)
    cost = ["cost_usd"] if usd_per_gpu_hour is not None else []
    table = table[[*TABLE_COLUMNS[:1], *_gpu_column(table), *TABLE_COLUMNS[1:2], *cost, *TABLE_COLUMNS[2:]]]
    for column, digits in ROUNDING.items():
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float).round(digits)
    return ComparisonTable(table.reset_index(drop=True))  # shown without empty columns (table_display)


def _note(text: str) -> str:
    """A line printed under the table, wrapped at the piped table's width."""
    return textwrap.fill(text, width=TERMINAL_WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def steady_notes(table: pd.DataFrame) -> str:
    """The terminal table cuts the steady column, and a blank cell must not read as "not measured"."""
    if "steady_basis" not in table or not len(table):
        return ""
    blank = table[table["steady_ms_per_sample"].isna() & table["steady_basis"].notna()]
    if blank.empty:
        return ""
    said = "; ".join(
        f"{', '.join(rows['experiment'])}: {basis}" for basis, rows in blank.groupby("steady_basis", sort=False)
    )
    said = printable(said)  # a record's experiment or basis holding an escape code is shown, never obeyed
    return _note(f"steady ms/sample blank (ms/sample is the whole timed loop, first-seen lengths included): {said}")


def cost_note(usd_per_gpu_hour: float) -> str:
    """What the cost column multiplies, under the table, at the table's width."""
    return _note(
        f"cost USD: each run's wall_s (launch to exit, loading included) x the GPUs it held x ${usd_per_gpu_hour:g} "
        "per GPU-hour / 3,600 s (a CPU run: its CPU stands in for the GPU)"
    )


def gpu_label(device_name: Any) -> str | None:
    """A record's GPU as the tables name it (the GPU's model, "H100 SXM"); None for a CPU run."""
    from lab_helpers.planning.planner.calibration import CPU, device_key

    key = device_key(device_name)
    return None if key == CPU else key


def _gpu_column(table: pd.DataFrame) -> list[str]:
    """A results folder kept across leases on different nodes would put an H100's row beside an A100's unmarked."""
    gpus = table["gpu"].dropna().value_counts()
    if len(gpus) < 2:
        return []
    counts = ", ".join(f"{gpu}: {n}" for gpu, n in gpus.items())
    warnings.warn(
        f"these runs come from {len(gpus)} GPUs ({counts} experiments): the gpu column says which ran each row, and "
        f"rows compare only with rows of the same GPU; a results folder per node (LAB_RESULTS) keeps them apart",
        stacklevel=3,
    )
    return ["gpu"]


MARKDOWN_COLUMNS = {
    "experiment": "experiment",
    "status": "status",
    "peak_alloc_gib": "measured peak GiB",
    "predicted_peak_alloc_gib": "predicted GiB",
    "prediction_error_pct": "error %",
    "train_s": "train s",
    "iter_median_s": "median iter ms",
    "steady_ms_per_sample": "steady ms/sample",
    "first_seen_count": "first-seen",
    "tokens_per_s_padded": "padded tokens/s",
    "padding_pct": "padding %",
    "mfu": "MFU",
    "gpu_busy_pct": "GPU busy %",
    "bound": "bound",
    "one_off_pct": "one-off %",
}


def markdown_table(table: pd.DataFrame) -> str:
    """For reference_results/README.md: printed from the records (``compare --reference NAME --markdown``), never typed."""
    measured, label = measured_memory(table) if len(table) else ("peak_alloc_gib", "")
    columns = dict(MARKDOWN_COLUMNS)
    if "gpu" in table.columns:  # rows of more than one GPU (_gpu_column)
        columns = {"experiment": "experiment", "gpu": "GPU", **columns}
    if "cost_usd" in table.columns:  # compare --usd-per-gpu-hour: after the status, as in the table
        at = list(columns).index("status") + 1
        columns = dict([*list(columns.items())[:at], ("cost_usd", "cost USD"), *list(columns.items())[at:]])
    headers = dict(columns)
    if measured != "peak_alloc_gib":
        table = table.assign(peak_alloc_gib=table[measured])
        headers["peak_alloc_gib"] = "measured peak GiB (" + label.removeprefix("measured ").replace(" (", ", ")[:-1] + ")"
    lines = ["| " + " | ".join(headers.values()) + " |", "|" + "---|" * len(headers)]
    for row in table.to_dict("records"):
        cells = []
        for column in columns:
            value = row.get(column)
            if isinstance(value, float) and math.isnan(value):
                cells.append("")
            elif column == "mfu":
                cells.append(f"{value:.1%}")
            elif column == "one_off_pct":
                cells.append(f"{value:.0f}")
            elif column in ("tokens_per_s", "tokens_per_s_padded"):
                cells.append(f"{value:,.0f}")
            elif column == "iter_median_s":
                cells.append(f"{1e3 * value:.0f}")
            elif column in ("padding_pct", "gpu_busy_pct", "first_seen_count"):
                cells.append(f"{value:.0f}")
            elif column == "steady_ms_per_sample":
                cells.append(f"{value:.1f}")
            elif column == "cost_usd" and value is not None:
                cells.append(usd_text(value))
            elif value is None:
                cells.append("")
            elif column == "predicted_peak_alloc_gib":  # CPU stand-ins predict tens of MiB: 3 digits, not 0.03
                cells.append(f"{value:.2f}" if value >= 1 else f"{value:.3g}")
            else:
                cells.append(printable(str(value)))  # a record's escape code is shown, never obeyed
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _samples(record: Mapping[str, Any]) -> float | None:
    iterations = _number(record.get("iterations"))
    micro = _number(as_mapping(as_mapping(record.get("config")).get("train")).get("micro_batch_size"))
    return iterations * micro if iterations and micro else None


def _per_sample_ms(train_s: float | None, samples: float | None) -> float | None:
    """The fair comparison between runs that see different numbers of samples (grad-accum sees 4x small-batch's)."""
    return 1000 * train_s / samples if train_s is not None and samples else None


def _dtype(column: str) -> str:
    return "float64" if column in ROUNDING else "object"


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# ------------------------------------------------------------------------------------------------ one-offs


def _one_off_pct(record: Mapping[str, Any], train_s: float | None) -> float | None:
    excess_s = one_off_excess_s(record)
    return None if excess_s is None or not train_s else 100 * excess_s / train_s


def one_offs(df: pd.DataFrame, *, order: Sequence[str] | None = None, profile: str | None = None) -> pd.DataFrame:
    """The raw samples behind the table's ``one_off_pct``, of rank 0, whose time the table shows."""
    columns = ("experiment", "iter", "iter_time_s", "median_s", "x_median", "pct_of_train_s")
    latest = latest_runs(df, profile=profile, order=order)
    rows = []
    for record in latest.groupby("experiment", sort=False).head(1).to_dict("records") if len(latest) else []:
        train_s = _number(record.get("train_s"))
        for one in one_off_iterations(record) or []:
            rows.append(
                {
                    "experiment": record["experiment"],
                    "iter": one["iter"],
                    "iter_time_s": round(one["iter_time_s"], 3),
                    "median_s": round(one["median_s"], 3),
                    "x_median": round(one["iter_time_s"] / one["median_s"], 1),
                    "pct_of_train_s": round(100 * one["excess_s"] / train_s) if train_s else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=list(columns))


# ------------------------------------------------------------------------------------------------ reference


GPU_MEASUREMENT = "real GPU measurement"
CODE_PATH_ONLY = "code path only (ci profile on a CPU: tiny stand-ins, not GPU figures)"


def shipped_references() -> list[str]:
    folder = reference_dir()
    return sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []


def reference_stem(name: str) -> str:
    return Path(name).name.removesuffix(".jsonl")


DEFAULT_GPU_REFERENCE = "h100-80gb"
"""The reference shown when several GPUs' files are shipped and none is named: the GPU LAB.md's course uses."""


def load_reference(name: str | None = None) -> pd.DataFrame:
    """With no ``name``, one GPU's file where any is shipped, else every file: GPU figures and CPU stand-ins, or two
    GPUs, never share one table."""
    folder = reference_dir()
    shipped = shipped_references()
    if name is not None:
        stem = reference_stem(name)
        files = [folder / f"{stem}.jsonl"]
        if stem not in shipped:
            warnings.warn(
                f"no reference results named {stem!r} in {folder}"
                + (f"; shipped: {', '.join(shipped)}" if shipped else "; none are shipped yet"),
                stacklevel=2,
            )
            return _no_reference()
    else:
        files = [folder / f"{stem}.jsonl" for stem in shipped]
        if not files:
            warnings.warn(
                f"no reference results are shipped yet (looked for {folder}/<gpu-name>.jsonl); "
                "run the experiments on a GPU node, or ask the instructor for the reference files",
                stacklevel=2,
            )
            return _no_reference()
    frames = []
    for path in files:
        frame = load_results(path)
        if len(frame):
            frames.append(frame.assign(reference=path.stem, measured_on=_measured_on(frame)))
    if not frames:
        which = f"{files[0]} holds" if name is not None else f"the reference files in {folder} hold"
        warnings.warn(f"{which} no records", stacklevel=2)
        return _no_reference()
    if name is None and any(_is_gpu(frame) for frame in frames):
        frames = [frame for frame in frames if _is_gpu(frame)]
        if len(frames) > 1:  # two GPUs never share a table: the course's GPU first (DEFAULT_GPU_REFERENCE)
            by_name = {frame["reference"].iloc[0]: frame for frame in frames}
            chosen = DEFAULT_GPU_REFERENCE if DEFAULT_GPU_REFERENCE in by_name else sorted(by_name)[0]
            others = ", ".join(n for n in sorted(by_name) if n != chosen)
            warnings.warn(f"reference results of several GPUs are shipped: showing {chosen} (also shipped: {others}; "
                          f"name one to see it, e.g. REFERENCE_NAME = {others.split(', ')[0]!r})", stacklevel=2)  # fmt: skip
            frames = [by_name[chosen]]
    return pd.concat(frames, ignore_index=True)


def _no_reference() -> pd.DataFrame:
    """Still the reference's (a ``reference`` column), so a REFERENCE_NAME typo never overwrites your own figures."""
    return empty_runs_frame().drop(columns="rank_n").assign(reference=pd.Series(dtype=object))


def _is_gpu(frame: pd.DataFrame) -> bool:
    return "profile" in frame and bool((frame["profile"] == "gpu").any())


def _measured_on(frame: pd.DataFrame) -> list[str]:
    if not _is_gpu(frame):
        return [CODE_PATH_ONLY] * len(frame)
    names = frame["device_name"] if "device_name" in frame else pd.Series([None] * len(frame))
    environments = frame["environment"] if "environment" in frame else pd.Series([None] * len(frame))
    gpus = [
        name if isinstance(name, str) and name else _first_gpu(environment)
        for name, environment in zip(names, environments, strict=True)
    ]
    return [f"{GPU_MEASUREMENT} ({gpu})" if isinstance(gpu, str) and gpu else GPU_MEASUREMENT for gpu in gpus]


def _first_gpu(environment: Any) -> str | None:
    """For a record without a ``device_name``: a skipped run measured nothing."""
    names = environment.get("gpu_names") if isinstance(environment, Mapping) else None
    return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None


def reference_label(frame: pd.DataFrame) -> str:
    if frame.empty or "measured_on" not in frame:
        return "no reference results"
    parts = []
    for (reference, measured), rows in frame.groupby(["reference", "measured_on"], sort=True):
        modes = sorted({m for m in rows.get("mode", pd.Series(dtype=object)).dropna()})
        weights = " random weights," if "random_weights" in rows and rows["random_weights"].eq(True).any() else ""
        mode = f" {'/'.join(modes)} mode" if modes else ""
        parts.append(f"{reference}.jsonl: {measured},{weights}{mode}, {len(rows)} records")
        table = comparison_table(rows)
        inflated = table.loc[table["one_off_pct"] >= 1, "experiment"].tolist()
        if inflated:
            parts[-1] += f" (the time of {', '.join(inflated)} includes a one-off iteration: see one_off_pct)"
    return printable("; ".join(parts))  # a record's GPU name holding an escape code is shown, never obeyed


def _gpu_measured(table: pd.DataFrame) -> bool:
    return bool(table["peak_alloc_gib"].notna().any()) if len(table) else False


def measured_memory(table: pd.DataFrame) -> tuple[str, str]:
    """Live tensor bytes on a CPU, the quantity the planner predicts there; host RSS for old records."""
    if _gpu_measured(table):
        return "peak_alloc_gib", "measured peak allocated (max over ranks)"
    if len(table) and table["peak_tensor_gib"].notna().any():
        return "peak_tensor_gib", "measured peak of live tensors (CPU run)"
    return "host_rss_peak_gib", "measured host RSS peak (CPU run)"


def rank0_records(
    df: pd.DataFrame, *, order: Sequence[str] | None, profile: str | None
) -> dict[str, dict[str, Any]]:
    latest = latest_runs(df, profile=profile, order=order)
    if latest.empty:
        return {}
    return {r["experiment"]: r for r in latest.sort_values("rank_n", kind="stable").groupby("experiment", sort=False)
            .head(1).to_dict("records")}  # fmt: skip


# ------------------------------------------------------------------------------------------------ sentences


def reference_for(node: Mapping[str, Any] | None) -> str:
    from lab_helpers.hardware.gpu_peaks import reference_name_for_gpu

    gpus = (node or {}).get("gpus") or []
    name = reference_name_for_gpu(gpus[0].get("name")) if gpus else None
    return name if name in shipped_references() else "ci-cpu"


def shipped_frames() -> list[tuple[str, pd.DataFrame]]:
    return [(name, load_results(reference_dir() / f"{name}.jsonl")) for name in shipped_references()]


def mfu_words() -> str:
    """What to expect of MFU from the data, never a typed "good" figure."""
    from lab_helpers.planning.planner.calibration import DEFAULT_MFU

    assumed = ", ".join(f"{method} {mfu:.2f}" for method, mfu in DEFAULT_MFU.items())
    measured = []
    for name, frame in shipped_frames():
        with_mfu = frame[pd.to_numeric(frame.get("mfu", pd.Series(dtype=float)), errors="coerce").notna()]
        if len(with_mfu):
            mfu = pd.to_numeric(with_mfu["mfu"])
            bound = with_mfu.get("bound", pd.Series(dtype=object)).dropna()
            labels = ("host", "both", "gpu", "communication")
            counts = ", ".join(f"{int((bound == b).sum())} {b}" for b in labels if (bound == b).any())
            host = f"bound: {counts} of {len(bound)}" if len(bound) else "bound not recorded"
            measured.append(f"{name} {mfu.min():.2f}-{mfu.max():.2f} over {len(mfu)} records ({host})")
    found = "; ".join(measured) or "no shipped GPU records yet"
    return (
        f"MFU the lab's time model assumes where no record of a GPU says otherwise: {assumed}. "
        f"MFU the shipped GPU runs measured: {found}; bound, from the GPU's busy share: host, it waited on the host "
        "side at least half the loop; both, neither alone set the pace; gpu, it had work nearly all the loop."
    )


def speed_words(exp_id: str, pair: str, df: pd.DataFrame | None = None, *, cpu: bool = False) -> str:
    """Computed from the records by the one speed rule (``speed_pairs.compare``), never typed, and never a verdict
    inside the noise. ``cpu``: the node's CPU runs too, where a lever's mechanism shows."""
    from lab_helpers.present.speed_pairs import compare, finished_runs

    frames = shipped_frames()
    if df is not None:
        frames.insert(0, ("this node", df))
    lines = []
    for name, frame in frames:
        own_cpu = cpu and name == "this node"
        records = [r for r in frame.to_dict("records") if r.get("profile") == "gpu" or own_cpu]
        verdict = compare(records, exp_id, pair)
        if isinstance(verdict, str):
            continue
        where = f"{name} (CPU: the code path, not a GPU's speed)" if verdict.device.startswith("cpu") else name
        line = f"{where}: {verdict.words()}\n    first-seen lengths: {verdict.first_seen_words()}"
        latest = [[r for r in finished_runs(records, e) if r.get("device_name") == verdict.device][-1]
                  for e in (exp_id, pair)]  # the runs the verdict compared: its device, rank 0, not a variant
        busy = [_number(r.get("gpu_busy_pct")) for r in latest]
        if all(b is not None for b in busy):
            bound = [r.get("bound") or "?" for r in latest]
            line += f"\n    GPU busy {busy[0]:.0f} % vs {busy[1]:.0f} %, bound {bound[0]} vs {bound[1]}"
        lines.append(line)
    if not lines:
        return f"no GPU records of both {exp_id} and {pair} yet"
    return f"Measured speed, {exp_id} against {pair}:\n" + "\n".join(f"  {line}" for line in lines)


def lever_plan_words(exp_id: str, pair: str, *, profile: str) -> str:
    """Before either runs. On the ci profile the gpu profile's prediction follows: what a GPU would change."""
    from lab_helpers.present.plan_command import experiment_time

    lines = []
    for where in dict.fromkeys((profile, "gpu")):
        for exp in (exp_id, pair):
            plan, why, batches = experiment_time(exp, profile=where)
            if plan is None:
                lines.append(f"{where} {exp}: {why}")
                continue
            parts = [f"{plan.micro_batch_s * 1e3:.1f} ms per micro-batch"]
            if plan.kernels_per_micro_batch is not None:
                parts.append(f"{plan.kernels_per_micro_batch:,.0f} kernel launches")
            if plan.host_ms_per_micro_batch is not None and plan.device_ms_per_micro_batch is not None:
                bound = f", {plan.time_bound}-bound" if plan.time_bound else " (one core does both)"
                parts.append(f"host {plan.host_ms_per_micro_batch:.1f} + device {plan.device_ms_per_micro_batch:.1f} "
                             f"ms{bound}")  # fmt: skip
            if batches:
                parts.append(str(batches.get("words") or ""))
            else:  # no batches: the data's lengths are not here (the gpu profile's on a CPU): say what stood in
                parts += [note for note in plan.notes if "length" in note][:1]
            lines.append(f"{where} {exp} on {plan.device_name}: " + "; ".join(p for p in parts if p))
        if plan is not None and plan.sources:
            lines.append("  sources: " + "; ".join(f"{k}: {v}" for k, v in plan.sources.items()))
    return f"Predicted, {exp_id} beside {pair}:\n" + "\n".join(f"  {line}" for line in lines)


def regime_words(df: pd.DataFrame | None = None, node: Mapping[str, Any] | None = None) -> str:
    """This node's runs first, then its GPU's shipped reference, else the one with the most runs that say a bound."""
    from lab_helpers.config.paths import reference_dir

    name = reference_for(node)
    if name == "ci-cpu":
        counts = {n: int(f["bound"].notna().sum()) for n, f in shipped_frames() if "bound" in f and n != "ci-cpu"}
        name = max(counts, key=counts.get) if counts and max(counts.values()) else DEFAULT_GPU_REFERENCE
    frames = [("this node", df)] if df is not None and len(df) else []
    frames.append((name, load_results(reference_dir() / f"{name}.jsonl")))
    regime = REGIME_WORDS
    lines = []
    for label, frame in frames:
        table = comparison_table(frame)
        rows, without = [], []
        for row in table.to_dict("records"):
            if row.get("status") != "ok":
                continue
            bound = row.get("bound") if isinstance(row.get("bound"), str) else None
            if bound is None:
                without.append(row["experiment"])
                continue
            mfu = _number(row.get("mfu"))
            rows.append(f"{row['experiment']}: {regime.get(bound, bound)} (GPU busy {row['gpu_busy_pct']:.0f} %"
                        + (f", MFU {mfu:.0%}" if mfu is not None else "") + ")")  # fmt: skip
        if without:
            rows.append(f"no device figures (a CPU run, or no NVML sample in the loop): {', '.join(without)}")
        if rows:
            lines.append(f"{label}:\n    " + "\n    ".join(rows))
    return "Where each run sits:\n  " + "\n  ".join(lines)


REGIME_WORDS = {
    "host": "overhead-bound",
    "gpu": "device-bound",
    "both": "overhead and device",
    "communication": "communication-bound",
}

MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
"""With attention, the ops whose time is arithmetic; the rest (elementwise, copies) mostly move memory."""


def traced_run(records: Sequence[Mapping[str, Any]], experiment: str | None = None) -> dict[str, Any] | None:
    profiled = sorted(
        (r for r in records if _number(r.get("rank")) in (None, 0) and r.get("status") == "ok"
         and isinstance(r.get("torch_profile_summary"), Mapping)),
        key=lambda r: r["started_at"] if isinstance(r.get("started_at"), str) else "",
    )  # fmt: skip
    return ([r for r in profiled if r.get("experiment") == experiment] or profiled or [None])[-1]


def reference_trace(experiment: str, node: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any] | None]:
    """This node's GPU's reference first, else the first shipped file that holds a profile."""
    first = reference_for(node)
    for name, frame in sorted(shipped_frames(), key=lambda nf: nf[0] != first):
        if (record := traced_run(frame.to_dict("records"), experiment)) is not None:
            return name, record
    return "no shipped reference", None


def _top_ops(summary: Mapping[str, Any]) -> tuple[bool, list[tuple[str, str, float, float]]]:
    """Torch lists a ``kernel`` on its own and inside the op that launched it, and a ``range`` holds ops listed too."""
    device = summary.get("top_ops_by") == "device time"
    rows = []
    for op in summary.get("top_ops") or []:
        name, cpu_ms = str(op.get("name")), _number(op.get("self_cpu_ms_per_step")) or 0.0
        kind = "op" if name.startswith("aten::") else "range" if "#" in name or not device or cpu_ms else "kernel"
        ms = _number(op.get("self_device_ms_per_step")) if device else cpu_ms
        rows.append((name, kind, _number(op.get("calls_per_step")) or 0.0, ms or 0.0))
    return device, rows


def _matmul_pct(rows: Sequence[tuple[str, str, float, float]]) -> float | None:
    """Of the aten ops only: kernels and ranges would count twice."""
    ops = [(name, ms) for name, kind, _, ms in rows if kind == "op"]
    total = sum(ms for _, ms in ops)
    matmul = sum(ms for name, ms in ops if name in MATMUL_OPS or "attention" in name)
    return 100 * matmul / total if total else None


def trace_table(record: Mapping[str, Any] | None) -> pd.DataFrame:
    summary = as_mapping(as_mapping(record).get("torch_profile_summary"))
    device, rows = _top_ops(summary)
    column = "self_device_ms_per_step" if device else "self_cpu_ms_per_step"
    shown = [(name if len(name) <= 60 else name[:59] + "…", kind, calls, ms) for name, kind, calls, ms in rows]
    return pd.DataFrame(shown, columns=["op", "kind", "calls_per_step", column]).round({"calls_per_step": 1, column: 2})


def trace_words(record: Mapping[str, Any] | None, where: str = "this node") -> str:
    """The figures 03's regime question reads; the verdict is ``trace_regime``'s."""
    summary = as_mapping(as_mapping(record).get("torch_profile_summary"))
    if not summary:
        why = f": {record.get('status')}, {record.get('reason') or 'no trace'}" if record else ""
        return f"{where}: no profiled run" + (f" of `{record.get('experiment')}`{why}" if record else "")
    device, rows = _top_ops(summary)
    lines = [f"{where}: `{record.get('experiment')}` on {record.get('device_name')}, {summary.get('steps')} steady "
             f"optimizer step(s) profiled; per step: wall {summary['wall_ms_per_step']:.1f} ms, host inside PyTorch "
             f"ops {summary['host_op_ms_per_step']:.1f} ms"]  # fmt: skip
    idle, busy = _number(summary.get("device_idle_pct")), _number(summary.get("device_busy_ms_per_step"))
    kernels = _number(summary.get("kernels_per_step"))
    if idle is None or busy is None:
        lines.append("a CPU run has no device: no kernels and no device-idle share; its top ops are by CPU time, the "
                     "host's ops being the computation itself")  # fmt: skip
    else:
        lines.append(f"device busy {busy:.1f} ms: idle {idle:.0f} % of the step"
                     + (f"; {kernels:,.0f} kernels launched, {1e3 * busy / kernels:.0f} us of device time each on "
                        "average" if kernels else ""))  # fmt: skip
    if (pct := _matmul_pct(rows)) is not None:
        by = "device" if device else "CPU"
        lines.append(f"matrix multiplies and attention: {pct:.0f} % of the top aten ops' {by} time; elementwise ops, "
                     f"copies and the rest {100 - pct:.0f} %")  # fmt: skip
    return "\n  ".join(lines)


def trace_regime(record: Mapping[str, Any]) -> tuple[str | None, str]:
    """By the lab's bound rule on the device-idle share and, where the device worked, on what: matrix multiplies
    and attention (compute) or the rest (bandwidth)."""
    from lab_helpers.record.time_bound import BAND_WORDS, classify

    summary = as_mapping(record.get("torch_profile_summary"))
    world = int(_number(record.get("world_size")) or 1)
    bound, _ = classify(None, world_size=world, trace=summary)
    if bound is None:
        return None, "a CPU run has no device-idle share: no regime from the device's side"
    if bound == "communication":
        return bound, f"{REGIME_WORDS[bound]}: collectives {summary['collective_pct']:.0f} % of the device's busy time"
    idle, pct = summary["device_idle_pct"], _matmul_pct(_top_ops(summary)[1])
    words = f"{REGIME_WORDS[bound]} (`bound: {bound}`): device busy {100 - idle:.0f} % of the step, {BAND_WORDS[bound]}"
    if bound == "host" and (kernels := _number(summary.get("kernels_per_step"))):
        words += (f"; {kernels:,.0f} kernels a step of {1e3 * summary['device_busy_ms_per_step'] / kernels:.0f} us "
                  "each on average: the host's launches set the pace")  # fmt: skip
    if pct is not None and bound != "host":
        side = "compute-bound" if pct >= 50 else "bandwidth-bound"
        words += f"; while busy, {side}: matrix multiplies and attention {pct:.0f} % of the top ops' device time"
    return bound, words


def pairs_words(df: pd.DataFrame | None = None, node: Mapping[str, Any] | None = None) -> str:
    """This node's own runs, then its GPU's shipped reference: the same table a GPU node would give."""
    from lab_helpers.config.paths import reference_dir
    from lab_helpers.present.speed_pairs import pairs_text

    parts = []
    if df is not None and len(df):
        parts.append("This node's runs:\n" + pairs_text(df.to_dict("records")))
    name = reference_for(node)
    reference = load_results(reference_dir() / f"{name}.jsonl")
    parts.append(f"The shipped reference {name}:\n" + pairs_text(reference.to_dict("records")))
    return "\n\n".join(parts)


def first_seen_words(exp_id: str, df: pd.DataFrame | None = None) -> str:
    """Here and in every shipped reference, beside the median of all that ``iter_median_s`` shows."""
    frames = shipped_frames()
    if df is not None:
        frames.insert(0, ("this node", df))
    lines = []
    for name, frame in frames:
        runs = [r for r in frame.to_dict("records") if r.get("experiment") == exp_id and r.get("status") == "ok"]
        if not runs:
            continue
        run = runs[-1]
        all_ms = 1e3 * (_number(run.get("iter_median_s")) or float("nan"))
        count = int(_number(run.get("iter_count")) or 0)
        if _number(run.get("steady_iter_s")) is None:
            lines.append(
                f"{name}: median of all {count} timed micro-batches {all_ms:.1f} ms; {run.get('steady_basis')}"
            )
            continue
        spread = _number(run.get("steady_spread_pct"))
        if not run.get("first_seen_count"):
            lines.append(f"{name}: {count} timed micro-batches, all of a length seen before: {all_ms:.1f} ms (steady)")
            continue
        lines.append(
            f"{name}: {count} timed micro-batches, median {all_ms:.1f} ms. "
            f"{int(run['steady_iter_count'])} of a length seen before: {1e3 * run['steady_iter_s']:.1f} ms (steady"
            + (f", ±{spread:.0f} %" if spread is not None else "")
            + "); "
            f"{int(run['first_seen_count'])} of a first-seen length: {1e3 * run['first_seen_extra_s']:+.0f} ms each, "
            f"{run['first_seen_pct']:.0f} % of the timed time"
        )
    if not lines:
        return f"no finished run of {exp_id} yet"
    return f"First-seen sequence lengths, {exp_id}:\n" + "\n".join(f"  {line}" for line in lines)


def steps_and_samples(df: pd.DataFrame, experiments: Sequence[str], *, profile: str | None = None) -> pd.DataFrame:
    """What ``train_s`` alone hides when runs differ in steps or samples; a typo is an error, not an empty table."""
    from lab_helpers.config.config_error import LabConfigError, did_you_mean
    from lab_helpers.config.experiments import load_experiments

    experiments = [experiments] if isinstance(experiments, str) else list(experiments)
    known = load_experiments()
    for exp_id in experiments:
        if exp_id not in known:
            raise LabConfigError(f"no experiment {exp_id!r}{did_you_mean(str(exp_id), known)}")
    rows = []
    for exp_id, record in rank0_records(df, order=list(experiments), profile=profile).items():
        if exp_id not in experiments:
            continue
        train = as_mapping(as_mapping(record.get("config")).get("train"))
        micro, global_ = _number(train.get("micro_batch_size")), _number(train.get("global_batch_size"))
        ranks = _number(record.get("simulated_world_size")) or _number(record.get("world_size")) or 1
        iterations = _number(record.get("iterations"))
        accumulation = max(1, int(global_ // (micro * ranks))) if micro and global_ else None
        steps = iterations / accumulation if iterations and accumulation else None
        rows.append({"experiment": exp_id, "mode": record.get("mode"), "micro_batches": iterations,
                     "accumulation": accumulation, "optimizer_steps": steps, "samples": _samples(record)})  # fmt: skip
    return pd.DataFrame(
        rows, columns=["experiment", "mode", "micro_batches", "accumulation", "optimizer_steps", "samples"]
    )


RENAMED = {"profile_words": "trace_words", "profile_table": "trace_table", "reference_profile": "reference_trace",
           "profile_regime": "trace_regime"}  # fmt: skip
"""Old name -> new: ``profile`` names the hardware profile only; a torch.profiler trace is ``trace``."""


def __getattr__(name: str) -> Any:
    if name in RENAMED:
        print(f"lab: tables.{name} is now tables.{RENAMED[name]}", file=sys.stderr, flush=True)
        return globals()[RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
