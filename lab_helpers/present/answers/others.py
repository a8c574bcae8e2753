"""The answers of notebooks 00 (the node), 03 (the runs compared) and 04 (what to try next)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping

from lab_helpers.config.iteration_times import finite_number, one_off_excess_s, timed_iterations
from lab_helpers.config.record_schema import GIB
from lab_helpers.present.answers.key import (
    TECHNIQUE_FOR,
    Answer,
    Cannot,
    Facts,
    Plan,
    answer,
    gib,
    idle_pct,
    larger,
    notebooks_dir,
    real_states,
)

# -- 00


@answer("00", "would-the-biggest-experiment-fit-on-this-gpu")
def _node_overview(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import model_states
    from lab_helpers.planning.decision import LAB_GPU_GIB

    def sections() -> str:
        counts: dict[str, dict[str, int]] = {}
        for record in f.latest.values():
            section = counts.setdefault(str(record.get("section")), {})
            section[record.get("status")] = section.get(record.get("status"), 0) + 1
        said = "; ".join(
            f"{s}: " + ", ".join(f"{n} {status}" for status, n in sorted(c.items())) for s, c in sorted(counts.items())
        )
        simulated = sum(1 for r in f.latest.values() if (finite_number(r.get("simulated_world_size")) or 0) > 1)
        return (f"{f.name} ran on {f.device} with the `{f.profile}` profile (latest runs per section: {said}"
                + (f"; {simulated} of them simulated ranks, whose memory is real and time has no communication" if simulated else "")
                + "). Run `01` first there: it needs one device, and every section-02 run on one device is rank 0 "
                "alone.")  # fmt: skip

    def biggest() -> str:
        states = model_states("full-13b", profile="gpu")
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"the {gib(LAB_GPU_GIB)} GPU 00 asks about without one"
        return (f"A number worth noticing: `full-13b`'s model states alone are {gib(states.gib)} "
                f"({states.trained.formula()}), {larger(states.gib, memory)} than {where}.")  # fmt: skip

    return f.answer(sections, biggest)


# -- 03


@answer("03", "peak-memory-measured-beside-the-predicted-breakdown")
def _bars(f: Facts) -> Answer:
    def largest() -> str:
        plans = {}
        for (e, w), record in f.latest.items():
            if isinstance(record.get("predicted"), Mapping) and w == 1:
                plans[e] = Plan(e, record["predicted"])
        if not plans:
            raise Cannot(f"{f.name} has no predictions")
        top = max(p.part("optimizer_states") for p in plans.values())
        optimizer = "`, `".join(e for e, p in plans.items() if p.part("optimizer_states") >= 0.995 * top)
        share = {e: p.part("activations") / p.peak for e, p in plans.items()}
        acts = max(share, key=share.get)
        return (f"Largest optimizer states: `{optimizer}`, {gib(top)}: "
                f"{TECHNIQUE_FOR['optimizer_states']}. Activations dominate `{acts}`: {gib(plans[acts].part('activations'))}, "
                f"{100 * share[acts]:.0f} % of its predicted peak: {TECHNIQUE_FOR['activations']}.")  # fmt: skip

    return f.answer(largest)


TIME_PAIRS = (("small-batch", "grad-accum"), ("bf16-true", "bf16-mixed"), ("lora-7b", "qlora-7b"))
"""The pairs 03's time section names."""


@answer("03", "training-time-and-tokens-per-second")
def _one_offs(f: Facts) -> Answer:
    def pairs() -> str:
        said, swapped = [], []
        for a, b in TIME_PAIRS:
            try:
                ra, rb = f.run(a), f.run(b)
            except Cannot:
                continue
            raw = {a: f.value(a, "train_s"), b: f.value(b, "train_s")}
            steady = {e: raw[e] - (one_off_excess_s(r) or 0.0) for e, r in ((a, ra), (b, rb))}
            said.append(f"`{a}` {raw[a]:.2f} s ({steady[a]:.2f} without one-offs) against `{b}` {raw[b]:.2f} s "
                        f"({steady[b]:.2f})")  # fmt: skip
            if (raw[a] < raw[b]) != (steady[a] < steady[b]):
                swapped.append(f"`{a}`/`{b}`")
        if not said:
            raise Cannot(f"{f.name} ran none of the pairs")
        return (f"`train_s`: {'; '.join(said)}. "
                + (f"Changed places: {', '.join(swapped)}." if swapped else "No pair changes places."))  # fmt: skip

    def median() -> str:
        spread = {}
        for (e, w), record in f.latest.items():
            times = [s for _, s in timed_iterations(record)]
            if w == 1 and len(times) >= 2:
                spread[e] = (statistics.mean(times), statistics.median(times), len(times))
        if not spread:
            raise Cannot(f"{f.name}'s records have no timed iterations")
        e = max(spread, key=lambda k: spread[k][0] / spread[k][1])
        mean, median_, n = spread[e]
        return (f"One iteration is one sample of a noisy time (kernel shapes, the allocator, the host); a median of "
                f"several ignores the few slow ones a mean takes in: `{e}`'s {n} timed iterations have a mean of "
                f"{1e3 * mean:.0f} ms and a median of {1e3 * median_:.0f} ms.")  # fmt: skip

    return f.answer(pairs, median)


@answer("03", "where-the-time-goes")
def _host_bound(f: Facts) -> Answer:
    def evidence() -> str:
        for exp, run in (("lora-1b", "fill-gpu"),):
            busy = {e: f.value(e, "gpu_busy_pct") for e in (exp, run)}
            verdict = f.verdict(run, exp)
            step = {exp: verdict.against_ms * f.micro(exp), run: verdict.exp_ms * f.micro(run)}
            return (f"In {f.name}: `{exp}` (`{f.run(exp).get('bound')}`, GPU {busy[exp]:.0f} % busy) took "
                    f"{step[exp]:.0f} ms per micro-batch of {f.micro(exp)}; `{run}` at micro batch {f.micro(run)} "
                    f"{step[run]:.0f} ms. Per sample: {verdict.words()}.")  # fmt: skip
        return ""

    return f.answer(
        "Faster per sample, about the same per step: a host-bound step's time is the host's work per "
        "micro-batch (Python, kernel launches), which does not grow with the batch while the GPU has idle "
        "time to absorb the larger kernels.",
        evidence,
    )


MEMORY_TIME_PAIRS = (
    ("bf16", "grad-accum", "bf16-true"),
    ("LoRA", "full-7b", "lora-7b"),
    ("QLoRA's 4-bit weights", "lora-7b", "qlora-7b"),
    ("activation checkpointing", "full-7b", "act-ckpt"),
    ("8-bit AdamW", "full-7b", "adamw-8bit"),
    ("SGD", "full-13b", "full-13b-sgd"),
)
"""(technique, the run without it, the run with it): the moves in 03's memory-against-time plane."""


@answer("03", "memory-against-time")
def _memory_time(f: Facts) -> Answer:
    def moves() -> str:
        moved = {}
        for technique, base, run in MEMORY_TIME_PAIRS:
            try:
                verdict = f.verdict(run, base)
                moved[technique] = (f.peak(run) - f.peak(base), verdict.exp_ms - verdict.against_ms, base, run,
                                    verdict.verdict)  # fmt: skip
            except Cannot:
                continue
        if not moved:
            raise Cannot(f"{f.name} ran none of the technique pairs")
        listed = "; ".join(
            f"{t} (`{b}` -> `{r}`): {gib(dm)}, {dt:+.1f} ms/sample ({'within noise' if said == 'within noise' else said})"
            for t, (dm, dt, b, r, said) in moved.items()
        )
        down = {t: v for t, v in moved.items() if v[0] < 0 and v[4] != "slower"}
        paid = {t: v for t, v in moved.items() if v[0] < 0 and v[4] == "slower"}
        best = min(down, key=lambda t: down[t][0]) if down else None
        slow = max(paid, key=lambda t: paid[t][1]) if paid else None
        return (f"Moves (memory, time per sample by the lab's speed rule): {listed}. "
                + (f"Furthest down without moving right: {best}. " if best else "None moved down without moving right here. ")
                + (f"Paid most time for its saving: {slow}." if slow else "None paid time for a saving here."))  # fmt: skip

    return f.answer(moves)


@answer("03", "the-gpu-timeline-of-one-run")
def _before_training(f: Facts) -> Answer:
    def idle() -> str:
        from lab_helpers.present.figures import _idle_spans, _timeline_path, read_timeline

        exp = _timeline_experiment()
        record = f.run(exp)
        f.need_gpu("GPU idle time")
        path, _ = _timeline_path(record)
        if path is None:
            raise Cannot(f"{f.name} shipped no timeline of `{exp}`")
        frame = read_timeline(path)
        spans = _idle_spans(frame[frame["gpu"].notna()])
        wall = f.value(exp, "wall_s")
        window = record.get("loop_window_s")
        if isinstance(window, list | tuple):
            before = sum(max(0.0, min(b, window[0]) - a) for a, b in spans if a < window[0])
            where = f"before its timed loop began at {window[0]:.1f} s"
        elif spans and spans[0][0] <= float(frame["t_s"].min()):
            before, where = (
                spans[0][1] - spans[0][0],
                "from launch until its first busy sample (the record has no loop window)",
            )
        else:
            raise Cannot(f"`{exp}`'s timeline does not start idle")
        return (f"`{exp}` (03's `TIMELINE_EXPERIMENT`): every GPU under {idle_pct():g} % busy for {before:.1f} s {where}: "
                f"{100 * before / wall:.0f} % of its `wall_s` {wall:.1f} s (loading the model, building the step).")  # fmt: skip

    return f.answer(idle)


def _timeline_experiment() -> str:
    """The run 03 draws (its parameters cell's ``TIMELINE_EXPERIMENT``)."""
    return _compare_parameter("TIMELINE_EXPERIMENT")


def _compare_parameter(name: str) -> str:
    """An experiment 03's parameters cell names (``NAME = "exp"``)."""
    path = notebooks_dir() / "03_compare.ipynb"
    found = re.search(rf'{name} = \\?"([\w.-]+)', path.read_text(encoding="utf-8")) if path.is_file() else None
    if not found:
        raise Cannot(f"03 names no {name}")
    return found.group(1)


@answer("03", "one-profiler-trace-which-regime")
def _trace_regime(f: Facts) -> Answer:
    from lab_helpers.present.tables import trace_regime, traced_run

    def regime() -> str:
        record = traced_run(f.records, _compare_parameter("PROFILED_EXPERIMENT"))
        if record is None:
            cpu = "" if f.gpu else "; a CPU run would have no device-idle share"
            raise Cannot(f"{f.name} has no profiled run (`trace_steps`){cpu}")
        bound, words = trace_regime(record)
        if bound is None:
            raise Cannot(f"{f.name}'s `{record['experiment']}`: {words}")
        return f"`{record['experiment']}`'s profile in {f.name}: {words}."

    return f.answer(regime)


# -- 04


@answer("04", "things-to-try")
def _cheapest(f: Facts) -> Answer:
    def routes() -> str:
        from lab_helpers.planning.arithmetic import trainable_bytes
        from lab_helpers.planning.decision import LAB_GPU_GIB, SIMULATED_WORLD

        states = real_states(f, "full-13b")
        n, b = states.counts.total, states.trained
        try:
            memory, where = f.gpu_memory(), f"this GPU ({gib(f.gpu_memory())})"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"an 80 GB GPU ({gib(LAB_GPU_GIB)}; {f.name} has none)"
        options = {
            "nothing (AdamW as is)": b.total,
            "8-bit AdamW": trainable_bytes(states.precision, "AdamW8bit").total,
            "SGD": trainable_bytes(states.precision, "SGD").total,
            # FSDP1 under Lightning keeps the gradients whole while a step accumulates (no_sync): 8/N only between steps
            f"FSDP over {SIMULATED_WORLD} GPUs ({b.fsdp_accumulating_formula(SIMULATED_WORLD)} "
            "B/param while a step accumulates)": b.fsdp_accumulating(SIMULATED_WORLD),
            "ZeRO-3 with the optimizer offloaded, one GPU": b.weights + b.gradients,
        }
        fits = [name for name, per in options.items() if n * per / GIB < memory]
        cheapest = fits[0] if fits else None
        listed = "; ".join(f"{name} {gib(n * per / GIB)}" for name, per in options.items())
        return (f"The largest model is {states.model} ({n / 1e9:.3g}e9 parameters, {states.precision}). Its model "
                f"states by route: {listed}, against {where}. "
                + ("No single route fits the model states here." if not cheapest else
                   "The model states fit as they are: no change needed for them" if cheapest == next(iter(options)) else
                   f"The first in that order (least changed, least slowed) whose states fit: {cheapest}")
                + ("; activations and the optimizer step's temporaries come on top, so `plan --fit` must confirm it."
                   if cheapest else "."))  # fmt: skip

    return f.answer(routes)
