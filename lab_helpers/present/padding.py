"""What grouping samples by length changed, computed from two records (length-grouped and its shuffled pair), measured
beside predicted; the prediction reads the batches of quick mode's own sampler on the run's own samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PAIR = "small-batch"
"""The experiment length-grouped is compared with: the same recipe, samples in shuffled micro-batches."""


def latest_record(exp_id: str, *, profile: str | None = None, path: Path | str | None = None) -> dict[str, Any] | None:
    """Rank 0's, with None for missing values; None when it never ran."""
    from lab_helpers.record.records import latest_runs, load_results

    latest = latest_runs(load_results(path), profile=profile)
    rows = latest[latest["experiment"] == exp_id]
    if rows.empty:
        return None
    return {key: _plain(value) for key, value in rows.iloc[-1].to_dict().items()}


def predicted_padding(record: Mapping[str, Any]) -> dict[str, Any]:
    """In the run's batch order; ``peak_gib`` is the record's own: the planner plans the longest batch, which both
    orders hold."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.training.data_lengths import recipe_batch_padding

    out: dict[str, Any] = dict.fromkeys(
        ("padding_pct", "mean_padded_length", "micro_batch_s", "tokens_per_s", "tokens_per_s_padded", "host_ms",
         "device_ms", "time_bound", "launch_cost_us", "launch_cost_source")
    )  # fmt: skip
    out["peak_gib"] = _number(record.get("predicted_peak_alloc_gib"))
    out["why"] = None
    try:
        run = resolve(str(record["experiment"]), str(record["profile"]), dict(record.get("overrides") or {}),
                      check_files=False)  # fmt: skip
    except Exception as err:  # noqa: BLE001 -- a sentence, never a traceback in the notebook
        out["why"] = f"the run cannot be resolved here ({err})"
        return out
    found, why = recipe_batch_padding(run.recipe, record.get("batch_order") or "shuffle")
    if found is None:
        out["why"] = why
        return out
    out["padding_pct"], out["mean_padded_length"] = found.padding_pct, found.mean_padded_length
    plan, why = _time_plan(run, record, found.batch_lengths)
    if plan is None:
        out["why"] = why
        return out
    seconds = out["micro_batch_s"] = plan.step_s / plan.gradient_accumulation_iters
    out["host_ms"], out["device_ms"] = plan.host_ms_per_micro_batch, plan.device_ms_per_micro_batch
    out["time_bound"] = plan.time_bound
    out["launch_cost_us"] = plan.launch_cost_us
    out["launch_cost_source"] = plan.launch_cost_source
    out["tokens_per_s"] = found.tokens / found.micro_batches / seconds
    out["tokens_per_s_padded"] = found.tokens_padded / found.micro_batches / seconds
    return out


def _time_plan(run: Any, record: Mapping[str, Any], lengths: Sequence[int]) -> tuple[Any, str]:
    """Each micro-batch at its own length: a length-grouped pass's long micro-batches stay device-bound where its
    short ones are host-bound, which the mean length alone hid."""
    from lab_helpers.planning.planner.spec import spec_from_recipe
    from lab_helpers.planning.predict import planner_inputs
    from lab_helpers.present.plan_command import predict_step_time

    device_name = str(record.get("device_name") or "")
    on_cpu = not device_name or device_name.startswith("cpu")
    try:
        inputs = planner_inputs(run, None, device="cpu" if on_cpu else "cuda")
        spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
        plan = predict_step_time(spec, gpu_name=None if on_cpu else device_name, batch_lengths=lengths)
    except Exception as err:  # noqa: BLE001 -- the time model refuses a GPU it has no peak for: say so
        return None, f"time not predicted ({str(err).splitlines()[0][:160]})"
    return plan, ""


def padding_words(
    pair: Mapping[str, Any] | None, grouped: Mapping[str, Any] | None, *, predict=predicted_padding
) -> str:
    """``predict`` is ``predicted_padding``; a test may stand in another."""
    problem = _not_comparable(pair, grouped)
    if problem:
        return problem
    before, after = predict(pair), predict(grouped)
    memory, where = _peaks(pair, grouped)
    orders = " -> ".join(f"{r['experiment']} ({r.get('batch_order') or 'shuffle'})" for r in (pair, grouped))
    lines = [
        f"{orders}: micro batch {_int(_config(pair).get('micro_batch_size'))}, {pair.get('mode')} mode, on "
        f"{pair.get('device_name')}; measured over the timed micro-batches ({_int(pair.get('iterations'))} and "
        f"{_int(grouped.get('iterations'))}), predicted over one pass of the sampler's micro-batches:",
        _line("padding", _both(pair, grouped, "padding_pct"), _both(before, after, "padding_pct"), "{:.1f} %",
              " of the padded tokens"),
        _line("padded length", (_padded_length(pair), _padded_length(grouped)),
              _both(before, after, "mean_padded_length"), "{:.0f}", " tokens a sample, on average"),
        _line("time per micro-batch", (_micro_s(pair), _micro_s(grouped)), _both(before, after, "micro_batch_s"),
              "{:.3g} s"),
        _line("real tokens/s", _both(pair, grouped, "tokens_per_s"), _both(before, after, "tokens_per_s"), "{:,.0f}"),
        _line("padded tokens/s", _both(pair, grouped, "tokens_per_s_padded"),
              _both(before, after, "tokens_per_s_padded"), "{:,.0f}"),
        _line(f"peak memory ({where})", memory, _both(before, after, "peak_gib"), "{:.3g} GiB"),
    ]  # fmt: skip
    if None not in _both(before, after, "device_ms"):
        lines.append(_split(pair, grouped, before, after))
    lines.append(_verdict(pair, grouped, memory))
    cut = _cut_note(pair)
    if cut:
        lines.append(cut)
    lengths = (_padded_length(pair), _padded_length(grouped))
    if None not in lengths and round(lengths[0]) == round(lengths[1]):
        lines.append(
            f"  both runs timed micro-batches padded to {lengths[0]:.0f} tokens a sample: a difference in their time "
            "is this machine's run-to-run variation, not the order"
        )
    for name, prediction in ((pair["experiment"], before), (grouped["experiment"], after)):
        if prediction.get("why"):
            lines.append(f"  ({name}: {prediction['why']})")
    return "\n".join(lines)


def _both(first: Mapping[str, Any], second: Mapping[str, Any], key: str) -> tuple[float | None, float | None]:
    return _number(first.get(key)), _number(second.get(key))


def _line(label: str, measured: tuple, predicted: tuple, form: str, suffix: str = "") -> str:
    """``  label: measured before -> after (predicted before -> after)suffix``."""
    text = " -> ".join(_shown(form, value) for value in measured)
    if any(value is not None for value in predicted):
        text += " (predicted " + " -> ".join(_shown(form, value) for value in predicted) + ")"
    return f"  {label}: {text}{suffix}"


def _not_comparable(pair: Mapping[str, Any] | None, grouped: Mapping[str, Any] | None) -> str | None:
    for name, record in ((PAIR, pair), ("length-grouped", grouped)):
        if not record:
            return f"no comparison: {name} has no record on this profile yet"
        if record.get("status") != "ok":
            reason = record.get("reason") or record.get("error") or "no reason recorded"
            return f"no comparison: {record.get('experiment', name)} is {record.get('status')} ({reason})"
    differ = [
        what
        for what, value in (
            ("profile", lambda r: r.get("profile")),
            ("mode", lambda r: r.get("mode")),
            ("device", lambda r: r.get("device_name")),
            ("micro batch", lambda r: _config(r).get("micro_batch_size")),
            ("precision", lambda r: (r.get("config") or {}).get("precision")),
            ("max_seq_length", lambda r: _config(r).get("max_seq_length")),
        )
        if value(pair) != value(grouped)
    ]
    if differ:
        return (
            f"no comparison: {pair.get('experiment')} and {grouped.get('experiment')} ran with different "
            f"{', '.join(differ)} here, so the order is not the only difference"
        )
    return None


def _split(
    pair: Mapping[str, Any], grouped: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]
) -> str:
    """Where the model predicts host-bound, fewer padded tokens cannot shorten a micro-batch."""
    device = " -> ".join(f"{p['device_ms']:.0f}" for p in (before, after))
    host = " -> ".join(f"{p['host_ms']:.0f}" for p in (before, after))
    bound = " -> ".join(str(p.get("time_bound")) for p in (before, after))
    busy = " -> ".join(_shown("{:.0f} %", _number(r.get("gpu_busy_pct"))) for r in (pair, grouped))
    measured = " -> ".join(str(r.get("bound")) for r in (pair, grouped))
    launch = ""
    if _number(after.get("launch_cost_us")) is not None:
        source = str(after.get("launch_cost_source") or "").split(" (")[0]
        launch = f" (kernels x {after['launch_cost_us']:.0f} us a launch, {source})" if source else ""
    return (
        f"  predicted micro-batch: device {device} ms, host {host} ms{launch}, bound {bound} "
        f"(measured: GPU busy {busy}, bound {measured})"
    )


def _verdict(pair: Mapping[str, Any], grouped: Mapping[str, Any], memory: tuple[float | None, float | None]) -> str:
    pad = [_number(r.get("padding_pct")) for r in (pair, grouped)]
    speed = [_number(r.get("tokens_per_s")) for r in (pair, grouped)]
    parts = []
    if None not in pad:
        parts.append(f"grouping by length took the padding from {pad[0]:.1f} % to {pad[1]:.1f} % of the padded tokens")
    if None not in speed and speed[0]:
        change = 100 * (speed[1] / speed[0] - 1)
        parts.append(f"real tokens/s {'rose' if change > 0 else 'fell'} by {abs(change):.0f} %")
    if None not in memory and memory[0]:
        moved = memory[1] - memory[0]
        parts.append(f"the peak moved by {moved:+.3g} GiB ({100 * moved / memory[0]:+.1f} %)")
    return ("  " + "; ".join(parts) + ".") if parts else "  (the records hold too little to compare)"


def _cut_note(record: Mapping[str, Any]) -> str | None:
    """When most samples are longer than max_seq_length, every micro-batch is cut to it whatever the order."""
    from lab_helpers.training.data_lengths import recipe_sample_lengths

    config = record.get("config") or {}
    limit = _number(_config(record).get("max_seq_length"))
    if not config or limit is None:
        return None
    uncut = {**config, "train": {**_config(record), "max_seq_length": None}}
    lengths, _ = recipe_sample_lengths(uncut)
    if not lengths:
        return None
    cut = sum(1 for n in lengths if n >= limit)
    if cut * 2 <= len(lengths):
        return None
    return (
        f"  {cut} of the {len(lengths)} training samples are {limit:.0f} tokens or longer and cut to max_seq_length "
        f"({limit:.0f}): nearly every micro-batch is full whatever the order, so there is little padding to remove"
    )


def _peaks(pair: Mapping[str, Any], grouped: Mapping[str, Any]) -> tuple[tuple[float | None, float | None], str]:
    """The two measured training peaks and what they are: allocated on a GPU, live tensor bytes on a CPU."""
    if _number(pair.get("peak_alloc_gib")) is not None:
        return (_number(pair.get("peak_alloc_gib")), _number(grouped.get("peak_alloc_gib"))), "allocated"
    return (_number(pair.get("peak_tensor_gib")), _number(grouped.get("peak_tensor_gib"))), "live tensors, CPU"


def _padded_length(record: Mapping[str, Any]) -> float | None:
    padded, iterations = _number(record.get("tokens_padded")), _number(record.get("iterations"))
    micro = _number(_config(record).get("micro_batch_size"))
    return padded / (iterations * micro) if padded and iterations and micro else None


def _micro_s(record: Mapping[str, Any]) -> float | None:
    """The micro-batch the record's rates use: the median one, a length-grouped run's mean one."""
    padded, iterations = _number(record.get("tokens_padded")), _number(record.get("iterations"))
    rate = _number(record.get("tokens_per_s_padded"))
    return padded / iterations / rate if padded and iterations and rate else None


def _config(record: Mapping[str, Any]) -> Mapping[str, Any]:
    return (record.get("config") or {}).get("train") or {}


def _number(value: Any) -> float | None:
    from lab_helpers.config.iteration_times import finite_number

    return finite_number(value)


def _shown(form: str, value: float | None) -> str:
    return "n/a" if value is None else form.format(value)


def _int(value: Any) -> str:
    number = _number(value)
    return "n/a" if number is None else f"{number:.0f}"


def _plain(value: Any) -> Any:
    """A DataFrame cell as a record holds it: NaN is None."""
    return None if isinstance(value, float) and math.isnan(value) else value
