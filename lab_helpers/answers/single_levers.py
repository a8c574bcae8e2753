"""Notebook 01's answers from activation checkpointing on: checkpointing and the optimizer step it leaves the peak
in (the lever: how AdamW steps), 8-bit AdamW, filling the GPU, grouping samples by length."""

from __future__ import annotations

from lab_helpers.answers.key import TECHNIQUE_FOR, Answer, Cannot, Facts, answer, gib, phase_words, ratio_words, words


@answer("01", "act-ckpt", 1)
def _act_ckpt_phases(f: Facts) -> Answer:
    def phases() -> str:
        ck, full = f.plan("act-ckpt"), f.plan("full-7b")
        top = {p: ", ".join(f"{words(k)} {gib(v)}" for k, v in sorted(x.parts.items(), key=lambda kv: -kv[1])[:4])
               for p, x in (("act-ckpt", ck), ("full-7b", full))}  # fmt: skip
        grew = max(ck.parts, key=lambda p: ck.part(p) - full.part(p))
        return (f"`full-7b` peaks in {phase_words(full.data.get('peak_phase'))}: {top['full-7b']}. `act-ckpt` peaks in "
                f"{phase_words(ck.data.get('peak_phase'))}: {top['act-ckpt']}. Activations fell "
                f"{gib(full.part('activations'))} -> {gib(ck.part('activations'))}; their place was taken by "
                f"{words(grew)}, {gib(full.part(grew))} -> {gib(ck.part(grew))} (AdamW's foreach update allocates "
                "parameter-sized temporaries).")  # fmt: skip

    return f.answer(phases)


@answer("01", "act-ckpt", 2)
def _act_ckpt_cost(f: Facts) -> Answer:
    def cost() -> str:
        saved = f.peak("full-7b") - f.peak("act-ckpt")
        ms = {e: f.ms_per_sample(e) for e in ("act-ckpt", "full-7b")}
        steady = {e: f.steady_ms_per_sample(e) for e in ("act-ckpt", "full-7b")}
        from lab_helpers.planner.timing import recompute_flops

        model = f.value("act-ckpt", "flops_per_token")  # model FLOPs: the recompute is not in them
        flops = (model + recompute_flops(model, str(f.run("act-ckpt").get("method")))) / model
        time = steady["act-ckpt"] / steady["full-7b"]
        return (f"Saved {gib(saved)} ({f.mem} {gib(f.peak('full-7b'))} -> {gib(f.peak('act-ckpt'))}). Time per sample "
                f"{ms['full-7b']:.1f} -> {ms['act-ckpt']:.1f} ms (steady median {steady['full-7b']:.1f} -> "
                f"{steady['act-ckpt']:.1f}: x{time:.2f}), against x{flops:.2f} FLOPs with one more forward: the time is "
                f"{'close to' if abs(time - flops) < 0.1 else 'more than' if time > flops else 'less than'} the FLOPs' "
                f"share{' (the run is host-bound: the recompute adds host work, its kernel launches, as well as FLOPs)' if f.run('act-ckpt').get('bound') == 'host' else ''}. "
                f"The saved memory could buy a larger micro batch (activations per sample "
                f"{gib(f.plan('act-ckpt').part('activations') / f.micro('act-ckpt'))} with checkpointing) or longer "
                "sequences.")  # fmt: skip

    return f.answer(cost)


@answer("01", "adamw-8bit")
def _adamw_8bit(f: Facts) -> Answer:
    from lab_helpers.arithmetic import trainable_bytes

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
        tps = f.value("fill-gpu", "tokens_per_s") / f.value("lora-1b", "tokens_per_s")
        record = f.run("fill-gpu")
        bound = (
            f"`{record.get('bound')}` ({record.get('bound_reason')})" if record.get("bound") else "not recorded here"
        )
        return (f"Micro batch {f.micro('lora-1b')} -> {f.micro('fill-gpu')} (x{grew:.2f}); tokens/s "
                f"{f.value('lora-1b', 'tokens_per_s'):,.0f} -> {f.value('fill-gpu', 'tokens_per_s'):,.0f} (x{tps:.2f}): "
                f"{ratio_words(tps, grew, 0.02)} the factor. The bound now: {bound}.")  # fmt: skip

    return f.answer(rate)


@answer("01", "fill-gpu", 2)
def _fill_gpu_sample(f: Facts) -> Answer:
    def per_sample() -> str:
        ms = {e: f.ms_per_sample(e) for e in ("lora-1b", "fill-gpu")}
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
