"""Notebook 01's answers from activation checkpointing on: checkpointing and the optimizer step it leaves the peak
in (the lever: how AdamW steps), 8-bit AdamW, filling the GPU, grouping samples by length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.config.iteration_times import finite_number
from lab_helpers.present.answers.key import (
    STEP_OVERRIDES,
    TECHNIQUE_FOR,
    Answer,
    Cannot,
    Facts,
    Plan,
    answer,
    gib,
    phase_words,
    ratio_words,
    step_variant,
    words,
)


@answer("01", "act-ckpt", 1)
def _act_ckpt_phases(f: Facts) -> Answer:
    def phases() -> str:
        ck, full = f.plan("act-ckpt"), f.plan("full-7b")
        top = {p: ", ".join(f"{words(k)} {gib(v)}" for k, v in sorted(x.parts.items(), key=lambda kv: -kv[1])[:4])
               for p, x in (("act-ckpt", ck), ("full-7b", full))}  # fmt: skip
        grew = max(ck.parts, key=lambda p: ck.part(p) - full.part(p))
        step = _step_of(f.record("act-ckpt"))
        why = ("AdamW's foreach update allocates parameter-sized temporaries: the lever below" if step == "foreach"
               else f"the {step} optimizer step's" if grew == "temporaries" and step else "")  # fmt: skip
        fell, rose = full.part("activations") - ck.part("activations"), ck.part(grew) - full.part(grew)
        return (f"Predicted (the prediction stored with each run): `full-7b` peaks in {phase_words(full.peak_phase)}: "
                f"{top['full-7b']}. `act-ckpt` peaks in {phase_words(ck.peak_phase)}: {top['act-ckpt']}. Activations "
                f"fell {gib(full.part('activations'))} -> {gib(ck.part('activations'))}, the peak"
                f"{' only' if full.peak - ck.peak < fell / 2 else ''} {gib(full.peak)} -> {gib(ck.peak)} "
                f"({gib(full.peak - ck.peak)}): {_moved(full, ck)}. "
                + ("Their place was taken by" if rose > fell / 2 else "No part took their place; the one that grew most:")
                + f" {words(grew)}, {gib(full.part(grew))} -> {gib(ck.part(grew))}" + (f" ({why})." if why else "."))  # fmt: skip

    return f.answer(phases)


def _in_step(phase: str | None) -> bool:
    """A planner phase (``w0-step``) or a record's ``peak_phase`` (``optimizer step``) inside the optimizer step."""
    return str(phase or "").endswith("step")


def _moved(before: Plan, after: Plan) -> str:
    if _in_step(after.peak_phase) and not _in_step(before.peak_phase):
        return ("the peak left backward, where the activations were, for the optimizer step, where they are already "
                "freed and the model states and the step's temporaries are alive at once")  # fmt: skip
    if before.peak_phase == after.peak_phase:
        return f"the peak stayed in {phase_words(after.peak_phase)}"
    return f"the peak moved to {phase_words(after.peak_phase)}"


@answer("01", "act-ckpt", 2)
def _act_ckpt_cost(f: Facts) -> Answer:
    def cost() -> str:
        saved = f.peak("full-7b") - f.peak("act-ckpt")
        verdict = f.verdict("act-ckpt", "full-7b")
        from lab_helpers.planning.planner.timing import recompute_flops

        model = f.value("act-ckpt", "flops_per_token")  # model FLOPs: the recompute is not in them
        flops = (model + recompute_flops(model, str(f.run("act-ckpt").get("method")))) / model
        inside = verdict.low <= flops <= verdict.high
        bound = f.run("act-ckpt").get("bound")  # host or both: the host sets (part of) the pace
        return (f"Saved {gib(saved)} ({f.mem} {gib(f.peak('full-7b'))} -> {gib(f.peak('act-ckpt'))}). Time: "
                f"{verdict.words()}; the FLOPs with one more forward: x{flops:.2f}, "
                f"{'inside' if inside else 'outside'} the time's interval (x{verdict.low:.2f} to x{verdict.high:.2f})"
                f"{f' (the run is `{bound}` bound: the recompute adds host work, its kernel launches, as well as FLOPs)' if bound in ('host', 'both') else ''}. "
                f"The saved memory could buy a larger micro batch (activations per sample "
                f"{gib(f.plan('act-ckpt').part('activations') / f.micro('act-ckpt'))} with checkpointing) or longer "
                "sequences.")  # fmt: skip

    return f.answer(cost)


# -- the lever: how AdamW steps


@answer("01", "the-lever-how-adamw-steps")
def _step_lever(f: Facts) -> Answer:
    """Why switching the foreach step for the for-loop (or back, on a CPU) moves the peak by less than the
    temporary: the peak falls only to the next-highest moment, backward's. Predicted from the plans (the one
    stored with this reference's run of each step, else traced now); measured where this reference ran it."""
    from lab_helpers.planning.arithmetic import setting_words, step_lever_words

    got: dict[str, Any] = {}

    def plans() -> dict[str, Any]:
        if not got:
            got.update(_lever_plans(f))
        return got

    def predicted() -> str:
        p = plans()
        default, other = p["default"], p["other"]
        big, small = sorted((default, other), key=lambda x: x.part("temporaries"), reverse=True)
        fell, temporaries = big.peak - small.peak, big.part("temporaries") - small.part("temporaries")
        if not _in_step(big.peak_phase):
            why = (f"but the {big.optimizer_step} step's peak is in {phase_words(big.peak_phase)}, not in the step: "
                   f"its temporaries do not set it, so the peak moves {gib(fell)} ({gib(big.peak)} -> "
                   f"{gib(small.peak)})")  # fmt: skip
        elif _in_step(small.peak_phase):
            why = (f"and the peak stays in the optimizer step, whose temporaries only shrink to the "
                   f"{small.optimizer_step} step's {gib(small.part('temporaries'))}: it falls by the difference, "
                   f"{gib(big.peak)} -> {gib(small.peak)} ({gib(fell)})")  # fmt: skip
        else:
            why = (f"but once the step holds no parameter-sized temporary it is no longer the highest moment: the "
                   f"peak moves back to {phase_words(small.peak_phase)}, the next-highest, so it falls only to that "
                   f"moment's {gib(small.peak)} (from {gib(big.peak)}: {gib(fell)}), not by the whole temporary")  # fmt: skip
        return (f"Predicted ({p['source']}): {' '.join(step_lever_words(default, other).split())} Why less: the "
                f"temporaries fall {gib(big.part('temporaries'))} -> {gib(small.part('temporaries'))} ({gib(temporaries)}; "
                f"the parameters are {gib(big.part('parameters'))}), {why}.")  # fmt: skip

    def measured() -> str:
        runs = _step_runs(f)
        if not runs:
            f.run("act-ckpt")  # says why: not run, skipped or failed
            raise Cannot(f"{f.name} has no finished one-device run of `act-ckpt`")
        said = []
        for step, record in runs.items():
            phase = record.get("peak_phase")
            predicted = (record.get("predicted") or {}).get("peak_alloc_gib")
            said.append(f"the {step} step {gib(_measured(f, record))}" + (f" in {_phase_words(phase)}" if phase else "")
                        + (f" against {gib(predicted)} predicted" if predicted is not None else "")
                        + ("" if phase else " (the run did not record its peak's phase)"))  # fmt: skip
        return f"Measured ({f.name}, `{f.mem}`): " + "; ".join(said) + "."

    def lever_run() -> str:
        p, runs = plans(), _step_runs(f)
        step = p["other"].optimizer_step
        if not runs:
            return ""  # measured() says why
        if step not in runs:
            raise Cannot(f"{f.name} did not run `act-ckpt` with the {step} step ({setting_words(step)})")
        default = p["default"].optimizer_step
        if default not in runs:
            raise Cannot(f"{f.name} did not run `act-ckpt` as defined (the {default} step)")
        mine, other = (_measured(f, runs[s]) for s in (default, step))
        return (f"Measured, the {default} step's peak against the {step} step's: {gib(mine)} -> {gib(other)} "
                f"({gib(mine - other)}; predicted {gib(p['default'].peak - p['other'].peak)}).")  # fmt: skip

    return f.answer(predicted, measured, lever_run)


def _measured(f: Facts, record: Mapping[str, Any]) -> float:
    number = finite_number(record.get(f.mem))
    if number is None:
        raise Cannot(f"{f.name}'s `act-ckpt` record has no `{f.mem}`")
    return number


def _phase_words(phase: str) -> str:
    from lab_helpers.planning.arithmetic import phase_words as record_phase_words

    return record_phase_words(phase)


def _step_of(record: Mapping[str, Any]) -> str | None:
    """The optimizer step a run took: its prediction's ``optimizer_step``, else torch's choice for its config's
    ``foreach`` / ``fused`` on its device (records from before the planner stored it); None for an optimizer that
    is not torch's."""
    from lab_helpers.planning.planner.spec import step_implementation

    predicted = record.get("predicted") if isinstance(record.get("predicted"), Mapping) else {}
    if predicted.get("optimizer_step"):
        return str(predicted["optimizer_step"])
    optimizer = (record.get("config") or {}).get("optimizer")
    if not isinstance(optimizer, Mapping) or not str(optimizer.get("class_path", "")).startswith("torch.optim."):
        return None
    args = optimizer.get("init_args") if isinstance(optimizer.get("init_args"), Mapping) else {}
    device = "cuda" if record.get("profile") == "gpu" else "cpu"
    return step_implementation(args.get("foreach"), args.get("fused"), device)


def _step_runs(f: Facts) -> dict[str, dict[str, Any]]:
    """This reference's latest finished rank-0, one-device run of `act-ckpt` for each optimizer step."""
    runs: dict[str, dict[str, Any]] = {}
    ordered = sorted(enumerate(f.records), key=lambda ir: (str(ir[1].get("started_at") or ""), ir[0]))
    for _, record in ordered:
        if (record.get("experiment") == "act-ckpt" and record.get("rank") in (None, 0) and f.world(record) == 1
                and record.get("status") == "ok" and (step := _step_of(record))):  # fmt: skip
            runs[step] = record
    return runs


def _lever_plans(f: Facts) -> dict[str, Any]:
    """Each the prediction stored with this reference's run of it, else traced by the planner now."""
    from lab_helpers.planning.arithmetic import step_lever
    from lab_helpers.planning.planner.spec import step_implementation

    runs = _step_runs(f)
    try:
        record = f.record("act-ckpt")  # the latest run as defined (a step variant only where there is none)
    except Cannot:
        record = None
    overrides = {k: v for k, v in ((record or {}).get("overrides") or {}).items() if k not in STEP_OVERRIDES}
    ran_as_defined = record is not None and record.get("status") == "ok" and not step_variant(record)
    default = _stored(record) if ran_as_defined else None
    default_stored, default = default is not None, default or _traced(f, overrides)
    lever = step_lever(default)
    if not lever:
        raise Cannot(f"`act-ckpt`'s optimizer step is not a torch optimizer's ({default.optimizer_step}): no lever")
    step = step_implementation(lever.get("optimizer.foreach"), lever.get("optimizer.fused"), "cuda" if f.gpu else "cpu")
    other = _stored(runs.get(step))
    other_stored, other = other is not None, other or _traced(f, {**overrides, **lever})
    steps = ((default.optimizer_step, default_stored), (step, other_stored))
    kept, new = ([str(s) for s, stored in steps if stored == want] for want in (True, False))
    source = "; ".join(
        ([f"{_steps(kept)} as stored with {f.name}'s run{'s' if len(kept) > 1 else ''}"] if kept else [])
        + ([f"{_steps(new)} traced by the planner now"] if new else [])
    )
    return {"default": default, "other": other, "source": source}


def _steps(names: list[str]) -> str:
    return f"the {' and the '.join(names)} step{'s' if len(names) > 1 else ''}"


def _stored(record: Mapping[str, Any] | None) -> Plan | None:
    if record is None or not isinstance(record.get("predicted"), Mapping):
        return None
    return Plan("act-ckpt", {**record["predicted"], "optimizer_step": _step_of(record)})


def _traced(f: Facts, overrides: Mapping[str, Any]) -> Plan:
    from lab_helpers.planning.predict import predict_experiment

    gpu = f.gpu
    plan = predict_experiment("act-ckpt", profile=f.profile, overrides=overrides or None,
                              gpu_memory_gib=f.gpu_memory() if gpu else None, device="cuda" if gpu else "cpu")  # fmt: skip
    return Plan("act-ckpt", plan.to_dict())


@answer("01", "adamw-8bit")
def _adamw_8bit(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import trainable_bytes

    def states() -> str:
        full = f.plan("full-7b")
        precision = f.states("full-7b").precision
        adam, eight = trainable_bytes(precision, "AdamW"), trainable_bytes(precision, "AdamW8bit")
        optimizer = full.part("optimizer_states") * eight.optimizer_states / adam.optimizer_states
        try:
            optimizer = f.plan("adamw-8bit").part("optimizer_states")
            source = "predicted"
        except Cannot:
            source = "by the arithmetic, `adamw-8bit` not predicted here"
        rest = {p: v for p, v in full.parts.items() if p != "optimizer_states"}
        part = max(rest, key=rest.get)
        return (f"Optimizer states: `full-7b` {gib(full.part('optimizer_states'))} ({adam.optimizer_states:g} B/param) "
                f"-> {gib(optimizer)} with 8-bit AdamW ({eight.optimizer_states:.3g} B/param; {source}). The largest "
                f"part is now {words(part)} ({gib(rest[part])}): combine with {TECHNIQUE_FOR.get(part, 'LoRA')}.")  # fmt: skip

    return f.answer(states, lambda: _ran_or_not(f, "adamw-8bit"))


def _ran_or_not(f: Facts, exp: str) -> str:
    record = f.run(exp)
    return f"Measured `{exp}`: {gib(f.peak(exp))} ({f.mem}), {record.get('tokens_per_s') or 0:,.0f} tokens/s."


@answer("01", "fill-gpu", 1)
def _fill_gpu_rate(f: Facts) -> Answer:
    def rate() -> str:
        grew = f.micro("fill-gpu") / f.micro("lora-1b")
        verdict = f.verdict("fill-gpu", "lora-1b")
        rate = 1 / verdict.ratio  # samples per second, and tokens with them: the inverse of time per sample
        record = f.run("fill-gpu")
        bound = (
            f"`{record.get('bound')}` ({record.get('bound_reason')})" if record.get("bound") else "not recorded here"
        )
        return (f"Micro batch {f.micro('lora-1b')} -> {f.micro('fill-gpu')} (x{grew:.2f}). {verdict.words()}: "
                f"samples (and tokens) per second x{rate:.2f} (x{1 / verdict.high:.2f} to x{1 / verdict.low:.2f}), "
                f"{ratio_words(rate, grew, 0.02)} the factor. The bound now: {bound}.")  # fmt: skip

    return f.answer(rate)


@answer("01", "fill-gpu", 2)
def _fill_gpu_sample(f: Facts) -> Answer:
    def per_sample() -> str:
        verdict = f.verdict("fill-gpu", "lora-1b")  # the same figures as the answer above: one rule
        ms = {"lora-1b": verdict.against_ms, "fill-gpu": verdict.exp_ms}
        grew = f.micro("fill-gpu") / f.micro("lora-1b")
        fell = ms["lora-1b"] / ms["fill-gpu"]
        busy = {e: f.run(e).get("gpu_busy_pct") for e in ("lora-1b", "fill-gpu")}
        bound = {e: f.run(e).get("bound") for e in ("lora-1b", "fill-gpu")}
        if not all(bound.values()):
            raise Cannot(f"{f.name}'s records of `lora-1b` and `fill-gpu` carry no `bound`")
        return (f"ms/sample {ms['lora-1b']:.1f} -> {ms['fill-gpu']:.1f} (/{fell:.2f}) for a micro batch x{grew:.2f}: "
                f"{'in proportion' if abs(fell / grew - 1) < 0.1 else 'less than in proportion' if fell < grew else 'more than in proportion'}; "
                f"{f.mem} {gib(f.peak('lora-1b'))} -> {gib(f.peak('fill-gpu'))}. `lora-1b` was `{bound['lora-1b']}` bound "
                f"(GPU busy {busy['lora-1b']:.0f} %), `fill-gpu` `{bound['fill-gpu']}` ({busy['fill-gpu']:.0f} %): the "
                "host's cost is paid per micro-batch, so fewer, larger micro-batches pay it less often per sample.")  # fmt: skip

    return f.answer(per_sample)


@answer("01", "length-grouped")
def _length_grouped(f: Facts) -> Answer:
    pair = "small-batch"  # the same samples and batch in the default order (configs/experiments/single.yaml)

    def padding() -> str:
        pad, real, padded = (f.value(pair, c) for c in ("padding_pct", "tokens_per_s", "tokens_per_s_padded"))
        return f"`{pair}` padded {pad:.0f} % of its tokens: {real:,.0f} real against {padded:,.0f} padded tokens/s."

    def grouped() -> str:
        exp = "length-grouped"
        pads = {e: f.value(e, "padding_pct") for e in (exp, pair)}
        real = {e: f.value(e, "tokens_per_s") for e in (exp, pair)}
        gain = 100 * (real[exp] / real[pair] - 1)
        return (
            f"`{exp}` padded {pads[exp]:.0f} % against {pads[pair]:.0f} %, and trained {real[exp]:,.0f} real tokens/s "
            f"against {real[pair]:,.0f} ({gain:+.0f} %): less padding "
            + ("bought real tokens/s, the device's time shrinking with the padded length" if gain > 0 else
               "bought no speed here: the step's time did not shrink with the padded length")
            + f". Memory: {gib(f.peak(exp))} against {gib(f.peak(pair))} (predicted {gib(f.plan(exp).peak)}; the longest "
            "batch is the same one)."
        )  # fmt: skip

    return f.answer(padding, grouped)


# ------------------------------------------------------------------------------------------------ the levers


def _lever_run(f: Facts, exp: str, pair: str) -> str:
    """The lever's measured verdict against its pair (the one speed rule), and what its record says ran."""
    record = f.run(exp)
    ran = []
    if record.get("compiled"):
        ran.append(f"compiled {record['compiled']}")
    if finite_number(record.get("compile_s")) is not None:
        ran.append(f"{record['compile_s']:.1f} s compiling (in warm-up)")
    if finite_number(record.get("recompiles")) is not None:
        ran.append(f"{int(record['recompiles'])} recompiles")
    lengths = [record, f.run(pair)]
    distinct = [len(set(r["seq_lens"])) if isinstance(r.get("seq_lens"), list) else None for r in lengths]
    if all(d is not None for d in distinct):
        ran.append(f"{distinct[0]} distinct lengths against {distinct[1]}")
    return f"Measured: {f.speed(exp, pair)}" + (f"; {', '.join(ran)}." if ran else ".")


def _lever_entry(exp: str, pair: str, why: str):
    def entry(f: Facts) -> Answer:
        return f.answer(lambda: _lever_run(f, exp, pair), why)

    return entry


for _exp, _pair, _why in (
    ("compile", "lora-1b", "A compiled block launches fewer, fused kernels and skips Python's dispatch of each op: the "
     "host's time per micro-batch falls where the host set the pace; each new sequence length recompiles, a cost "
     "paid once per length."),
    ("pad-64", "small-batch", "Fewer distinct lengths mean fewer plan builds and recompiles, paid for with padded "
     "tokens: it pays where a new length is expensive (bf16 attention plans on a Hopper GPU, a compiled model), "
     "not on a CPU, where a new length costs nothing extra."),
    ("compile-static", "compile", "One fixed length: no recompiles, and on CUDA each block replays as a CUDA graph "
     "(launches nearly gone); the price is the padding up to the longest sample. What is left is the GPU's work."),
    ("fused-adamw", "small-batch", "The fused step saves launches once per optimizer step, so at most the step's "
     "share of the time; with accumulation that share shrinks."),
    ("attention-flash", "bf16-true", "Flash attention builds no plan per new length: the first-seen cost should "
     "fall toward the steady time; the steady time itself changes only as much as the kernels differ."),
):
    answer("01", _exp)(_lever_entry(_exp, _pair, _why))
