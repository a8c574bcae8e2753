"""Notebook 01's answers, up to activation checkpointing: what one GPU's step holds (the batch, the precision, the
model's size, the 13B's routes, LoRA and QLoRA)."""

from __future__ import annotations

from lab_helpers.config.iteration_times import finite_number
from lab_helpers.config.record_schema import GIB
from lab_helpers.present.answers.key import (
    Answer,
    Cannot,
    Facts,
    answer,
    gib,
    larger,
    ratio_words,
    real_states,
    records_frame,
    words,
)

# -- 01


@answer("01", "baseline")
def _baseline(f: Facts) -> Answer:
    def largest() -> str:
        plan = f.plan("baseline")
        part, value = plan.largest()
        return (f"The largest predicted part is {words(part)}: {gib(value)} of the {gib(plan.peak)} predicted peak "
                f"({100 * value / plan.peak:.0f} %); the weights (parameters) are {gib(plan.part('parameters'))}.")  # fmt: skip

    def free_weights() -> str:
        plan, memory = f.plan("baseline"), f.gpu_memory()
        without = plan.used - plan.part("parameters")
        status = f.record("baseline").get("status")
        return (f"With free weights the planner's GPU total ({gib(plan.used)}, allocator and CUDA context included) "
                f"would be {gib(without)}, {larger(without, memory)} than the GPU's {gib(memory)}: "
                f"{'it would still not fit' if without > memory else 'it would fit'}; the run here ended `{status}`.")  # fmt: skip

    return f.answer(largest, free_weights)


@answer("01", "small-batch")
def _small_batch(f: Facts) -> Answer:
    def activations() -> str:
        small, base = f.plan("small-batch"), f.plan("baseline")
        measured, batches = small.part("activations") / base.part("activations"), small.micro / base.micro
        verdict = ratio_words(measured, batches, 0.005)
        return (f"Predicted activations {gib(small.part('activations'))} / {gib(base.part('activations'))} = "
                f"{measured:.3f}; micro batches {small.micro} / {base.micro} = {batches:.3f}: {verdict} the batch ratio, "
                + ("so this prediction has no part that stays when the batch shrinks (per-position tensors such as "
                   "RoPE's cos/sin or a mask would be one)." if verdict == "equal to" else
                   "so a part does not scale with the batch: per-position tensors (RoPE's cos/sin, masks) or "
                   "per-step buffers."))  # fmt: skip

    def reserved() -> str:
        f.need_gpu("`peak_reserved_gib` and `gpu_used_peak_gib`")
        alloc, reserved_, used = (
            f.value("small-batch", c) for c in ("peak_alloc_gib", "peak_reserved_gib", "gpu_used_peak_gib")
        )
        return (f"On {f.device}: `peak_reserved_gib` {gib(reserved_)} - `peak_alloc_gib` {gib(alloc)} = "
                f"{gib(reserved_ - alloc)}, segments the caching allocator holds but had not handed out (freed blocks "
                f"kept for reuse, fragmentation); NVML's `gpu_used_peak_gib` {gib(used)} is {gib(used - reserved_)} "
                "more: the CUDA context and libraries' workspaces, outside PyTorch's allocator.")  # fmt: skip

    return f.answer(activations, reserved)


@answer("01", "grad-accum")
def _grad_accum(f: Facts) -> Answer:
    def compared() -> str:
        from lab_helpers.present.tables import steps_and_samples

        ga, sb = "grad-accum", "small-batch"
        per = {e: (f.peak(e), f.value(e, "train_s")) for e in (ga, sb)}
        frame = steps_and_samples(records_frame(f), [ga, sb]).set_index("experiment")
        samples = {e: int(frame.loc[e, "samples"]) for e in (ga, sb)}
        return (f"Per sample: {f.speed(ga, sb)}. Memory: {f.mem} {gib(per[ga][0])} against {gib(per[sb][0])}, "
                f"{gib(per[ga][0] - per[sb][0])} more "
                f"(the summed gradients stay alive: predicted gradients {gib(f.plan(ga).part('gradients'))} against "
                f"{gib(f.plan(sb).part('gradients'))}). `train_s` misleads because the two timed different work: "
                f"{per[ga][1]:.2f} s for {samples[ga]} samples against {per[sb][1]:.2f} s for {samples[sb]}.")  # fmt: skip

    return f.answer(compared)


@answer("01", "bf16-true")
def _bf16_true(f: Facts) -> Answer:
    def halved() -> str:
        low, full = "bf16-true", "grad-accum"  # the same batches in fp32
        states = f.states(low).gib / f.states(full).gib
        peak = f.peak(low) / f.peak(full)
        a, b = f.plan(low), f.plan(full)
        above = {p: a.part(p) - b.part(p) * states for p in a.parts}
        part = max(above, key=above.get)
        return (f"Model states {gib(f.states(low).gib)} against `{full}`'s {gib(f.states(full).gib)} (the same batches "
                f"in {f.states(full).precision}): x{states:.2f}. The measured peak went {gib(f.peak(full))} -> "
                f"{gib(f.peak(low))}: x{peak:.2f}, {'about half' if abs(peak - states) < 0.05 else 'not half'}. "
                f"The part furthest above that factor is {words(part)}: {gib(b.part(part))} -> {gib(a.part(part))} "
                f"(x{a.part(part) / b.part(part):.2f}"
                + ("; the norms' and the logits' fp32 tensors stay fp32 whatever the weights' dtype)." if part == "activations" else ")."))  # fmt: skip

    return f.answer(halved)


@answer("01", "first-seen-lengths-and-a-verdict-only-beyond-the-noise")
def _first_seen(f: Facts) -> Answer:
    def split() -> str:
        run = f.run("bf16-true")
        if finite_number(run.get("steady_iter_s")) is None:
            raise Cannot(f"{f.name}'s `bf16-true` has no steady time: {run.get('steady_basis')}")
        timed, new = int(run["iter_count"]), int(run["first_seen_count"])
        return (f"`bf16-true` timed {timed} micro-batches; {new} met a length for the first time and took "
                f"{1e3 * run['first_seen_extra_s']:+.0f} ms each over a steady one ({1e3 * run['steady_iter_s']:.1f} ms, "
                f"the median of the {int(run['steady_iter_count'])} of a length seen before): "
                f"{run['first_seen_pct']:.0f} % of the timed time. So the median of all of them "
                f"({1e3 * run['iter_median_s']:.0f} ms) follows the share of new lengths, not bf16's speed.")  # fmt: skip

    def verdict() -> str:
        found = f.verdict("bf16-true", "grad-accum")
        return (f"Against fp32 at the same recipe: {found.words()}. "
                + ("bf16 is faster here." if found.verdict == "faster" else "bf16 is slower here." if found.verdict ==
                   "slower" else "Within noise: these runs cannot say; more steady micro-batches (a longer run, or a "
                   "repeat) narrow the interval."))  # fmt: skip

    return f.answer(split, verdict)


@answer("01", "bf16-mixed")
def _bf16_mixed(f: Facts) -> Answer:
    def compared() -> str:
        mixed, true = "bf16-mixed", "bf16-true"
        mem = {e: f.peak(e) for e in (mixed, true)}
        verdict = f.verdict(mixed, true)
        bound = {e: f.run(e).get("bound") for e in (mixed, true)}
        bounds = f" (bound: {mixed} {bound[mixed]}, {true} {bound[true]})" if all(bound.values()) else ""
        pick = {
            "faster": f"`{mixed}`: here it is also the faster one, and its fp32 master weights keep small updates; "
            f"its {gib(mem[mixed] - mem[true])} more must fit",
            "slower": f"`{true}` where its speed matters and the 1-hour run tolerates bf16 updates; `{mixed}` where "
            "small updates must land (fp32 master weights)",
        }.get(verdict.verdict, f"by numerics, not speed (the two are within noise here): `{mixed}` where small updates "
              f"must land (fp32 master weights), `{true}` where its {gib(mem[mixed] - mem[true])} less memory matters")
        return (f"Memory: `{mixed}` {gib(mem[mixed])} against `{true}` {gib(mem[true])} ({gib(mem[mixed] - mem[true])} "
                f"more). Time: {verdict.words()}{bounds}. Pick {pick}.")  # fmt: skip

    return f.answer(compared)


@answer("01", "full-3b")
def _full_3b(f: Facts) -> Answer:
    def grew() -> str:
        big, small = f.plan("full-3b"), f.plan("bf16-true")
        model = big.params / small.params
        parts = sorted(((big.part(p) / small.part(p), p) for p in big.parts if small.part(p) > 0), reverse=True)
        faster = [f"{words(p)} x{r:.2f}" for r, p in parts if r > model * 1.02]
        slower = [f"{words(p)} x{r:.2f}" for r, p in parts if r < model * 0.98]
        same = [words(p) for r, p in parts if model * 0.98 <= r <= model * 1.02]
        precisions = {big.data.get("precision"), small.data.get("precision")}
        return (f"Parameters {big.params / 1e9:.3g}e9 against {small.params / 1e9:.3g}e9: x{model:.2f}; the predicted "
                f"peak {gib(big.peak)} against {gib(small.peak)}: x{big.peak / small.peak:.2f}, "
                f"{'more' if big.peak / small.peak > model else 'less'} than the model. Faster than the model: "
                f"{', '.join(faster) or 'none'}; with it: {', '.join(same) or 'none'}; slower: {', '.join(slower) or 'none'}"
                + (f" (the two ran in different precisions here: {', '.join(sorted(precisions))})." if len(precisions) > 1
                   else " (activations follow width and depth, not the parameter count)."))  # fmt: skip

    return f.answer(grew)


@answer("01", "full-7b")
def _full_7b(f: Facts) -> Answer:
    def left() -> str:
        plan, memory = f.plan("full-7b"), f.gpu_memory()
        return (f"At the predicted peak the planner's GPU total is {gib(plan.used)} of {gib(memory)}: "
                f"{gib(memory - plan.used)} left (activations {gib(plan.part('activations'))} at micro batch {plan.micro}).")  # fmt: skip

    def micro_8() -> str:
        from lab_helpers.planning.predict import predict_experiment

        memory, record = f.gpu_memory(), f.record("full-7b")
        overrides = {**(record.get("overrides") or {}), "train.micro_batch_size": 2 * f.plan("full-7b").micro}
        plan = predict_experiment("full-7b", profile="gpu", overrides=overrides, gpu_memory_gib=memory, device="cuda")
        margin = memory * (1 - _fit_margin())
        verdict = (
            "does not fit"
            if plan.gpu_used_gib > memory
            else "fits only within the planner's error"
            if plan.gpu_used_gib > margin
            else "fits"
        )
        return (f"Micro batch {overrides['train.micro_batch_size']}: the planner predicts {gib(plan.gpu_used_gib)} "
                f"against {gib(memory)}: it {verdict}.")  # fmt: skip

    return f.answer(left, micro_8)


def _fit_margin() -> float:
    from lab_helpers.planning.planner.fit import DEFAULT_MARGIN

    return DEFAULT_MARGIN


@answer("01", "activations-by-hand")
def _by_hand(f: Facts) -> Answer:
    def terms() -> str:
        from lab_helpers.planning.activations_by_hand import block_terms, estimate, experiment_spec

        record = f.record("full-7b")
        spec = experiment_spec("full-7b", f.profile, record.get("overrides") or None)
        config, b = spec.model_config, None
        rows = block_terms(config, spec.precision)
        wide = [t.tensor for t in rows if t.elements_per_token == config.n_embd]
        mlp = [t.tensor for t in rows if t.elements_per_token == config.intermediate_size]
        now = estimate(config, spec.precision, spec.micro_batch_size, spec.seq_len)
        doubled = estimate(config, spec.precision, spec.micro_batch_size, 2 * spec.seq_len)
        b = rows[-1].bytes_per_element
        scores = config.n_head * (2 * spec.seq_len) ** 2 * b * config.n_layer * spec.micro_batch_size
        return (f"For `full-7b`'s {config.name} ({spec.precision}): with `n_embd` ({config.n_embd}) grow "
                f"{len(wide)} terms ({'; '.join(wide)}); with `intermediate_size` ({config.intermediate_size}) "
                f"{len(mlp)} ({'; '.join(mlp)}). Doubling the sequence ({spec.seq_len} -> {2 * spec.seq_len} tokens, "
                f"micro batch {spec.micro_batch_size}) doubles the count: {gib(now.total_bytes / GIB)} -> "
                f"{gib(doubled.total_bytes / GIB)}. An attention that keeps its T x T scores adds n_head x T^2 values "
                f"per layer and sample: {config.n_head} x {2 * spec.seq_len}^2 x {b} B x {config.n_layer} layers x "
                f"{spec.micro_batch_size} = {gib(scores / GIB)} more (its softmax output as much again), growing with "
                "the square of T.")  # fmt: skip

    return f.answer(terms)


@answer("01", "full-13b")
def _full_13b(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import OFFLOAD_HOST_BYTES_PER_PARAM, trainable_bytes
    from lab_helpers.planning.decision import LAB_GPU_GIB, SIMULATED_WORLD

    def routes() -> str:
        states = real_states(f, "full-13b")
        n, precision = states.counts.total, states.precision
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"an 80 GB GPU ({gib(LAB_GPU_GIB)})"
        trained, fsdp = states.trained, f"FSDP full shard over {SIMULATED_WORLD} GPUs"
        options = {
            "plain SGD (no optimizer state)": trainable_bytes(precision, "SGD").total,
            "8-bit AdamW": trainable_bytes(precision, "AdamW8bit").total,
            # while Lightning accumulates under FSDP1's no_sync the gradients are whole on every GPU
            fsdp: trained.fsdp_accumulating(SIMULATED_WORLD),
            "DeepSpeed optimizer offload (weights and gradients stay)": trained.weights + trained.gradients,
        }
        notes = {fsdp: f" while a step accumulates ({trained.fsdp_accumulating_formula(SIMULATED_WORLD)}: "
                       f"FSDP1 under Lightning keeps the gradients whole until the step's "
                       f"reduce-scatter; {trained.total / SIMULATED_WORLD:.3g} B/param between steps)"}  # fmt: skip
        listed = "; ".join(f"{name}: {per:.3g} B/param = {gib(n * per / GIB)}{notes.get(name, '')}"
                           for name, per in options.items())  # fmt: skip
        fit = [name for name, per in options.items() if n * per / GIB < memory]
        return (f"`full-13b`'s model states are {gib(states.gib)} ({states.trained.formula()}) against {where}. "
                f"Without touching the batch: {listed}. Model states under {where}: {', '.join(fit) or 'none'} "
                f"(the offload moves {OFFLOAD_HOST_BYTES_PER_PARAM} B/param to host RAM; activations and the step's "
                "temporaries still come on top).")  # fmt: skip

    return f.answer(routes)


@answer("01", "full-13b-sgd")
def _sgd(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import trainable_bytes

    def saved() -> str:
        adam, sgd = f.states("full-13b"), f.states("full-13b-sgd")
        momentum = trainable_bytes(sgd.precision, "SGD", {"momentum": 0.9})
        return (f"Arithmetic: {gib(adam.gib)} ({adam.trained.formula()}) -> {gib(sgd.gib)} ({sgd.trained.formula()}): "
                f"SGD saves {gib(adam.gib - sgd.gib)}, AdamW's two moments. SGD with momentum keeps one: "
                f"{momentum.formula()}.")  # fmt: skip

    def measured() -> str:
        adam, sgd = f.peak("full-13b"), f.peak("full-13b-sgd")
        return f"Measured ({f.mem}): {gib(adam)} -> {gib(sgd)}, {gib(adam - sgd)} less."

    return f.answer(saved, measured)


@answer("01", "lora-1b")
def _lora_1b(f: Facts) -> Answer:
    def parts() -> str:
        lora, full = f.plan("lora-1b"), f.plan("bf16-true")
        gone = [f"{words(p)} {gib(full.part(p))} -> {gib(lora.part(p))}" for p in full.parts
                if full.part(p) > 0 and lora.part(p) < 0.05 * full.part(p)]  # fmt: skip
        part, value = lora.largest()
        precisions = {lora.data.get("precision"), full.data.get("precision")}
        return (f"Against `bf16-true` (micro batch {full.micro}; `lora-1b` {lora.micro}): nearly gone: "
                f"{', '.join(gone) or 'none'}. Now the largest part is {words(part)}: {gib(value)} of {gib(lora.peak)}."
                + (f" (Here the two ran in different precisions: {', '.join(sorted(precisions))}.)" if len(precisions) > 1 else ""))  # fmt: skip

    return f.answer(parts)


@answer("01", "lora-3b")
def _lora_3b(f: Facts) -> Answer:
    def fraction() -> str:
        lora, full = f.plan("lora-3b"), f.plan("full-3b")
        measured = f.peak("lora-3b") / f.peak("full-3b")
        return (f"`lora-3b` needs {100 * measured:.0f} % of `full-3b`'s measured peak ({gib(f.peak('lora-3b'))} of "
                f"{gib(f.peak('full-3b'))}; predicted {100 * lora.peak / full.peak:.0f} %). Of the difference, activations "
                f"went {gib(full.part('activations'))} -> {gib(lora.part('activations'))} (micro batch {full.micro} -> "
                f"{lora.micro}) and the model states {gib(full.model_states())} -> {gib(lora.model_states())}.")  # fmt: skip

    return f.answer(fraction)


@answer("01", "lora-7b")
def _lora_7b(f: Facts) -> Answer:
    def room() -> str:
        memory, plan = f.gpu_memory(), f.plan("lora-7b")
        used = f.value("lora-7b", "gpu_used_peak_gib")
        left, per_sample = memory - used, plan.part("activations") / plan.micro
        extra = f.states("lora-13b").gib - f.states("lora-7b").gib  # the bigger model's extra model states
        if f.run("lora-7b").get("bound") in ("host", "both"):  # the host sets (part of) the pace
            why = "a larger micro batch is the one that also pays the host's per-micro-batch cost less often."
        elif extra < left:
            why = f"the room holds even the 13B's {gib(extra)} of extra model states: the one choice that buys a better model."
        else:
            why = (
                f"the 13B's {gib(extra)} of extra model states exceed the room: spend it on the batch or the sequence."
            )
        return (f"Room: {gib(memory)} - NVML's {gib(used)} = {gib(left)}. A sample costs {gib(per_sample)} of "
                f"activations ({gib(plan.part('activations'))} / micro batch {plan.micro}): about {int(left // per_sample)} "
                f"more samples per micro-batch, or sequences up to about x{1 + left / plan.part('activations'):.1f} as long "
                f"(activations grow linearly with the tokens under a fused attention). A bigger model: `lora-13b`'s model "
                f"states are {gib(extra)} more than `lora-7b`'s; {why}")  # fmt: skip

    return f.answer(room)


@answer("01", "lora-13b")
def _lora_13b(f: Facts) -> Answer:
    def compared() -> str:
        lora, sgd = "lora-13b", "full-13b-sgd"
        mem = {e: f.peak(e) for e in (lora, sgd)}
        verdict = f.verdict(lora, sgd)
        trained = f.plan(lora).data.get("trainable_params") / f.plan(lora).params
        smaller = min(mem, key=mem.get)
        faster = {"faster": lora, "slower": sgd}.get(verdict.verdict)
        said = f"`{faster}` faster" if faster else "neither faster beyond the noise"
        return (f"Memory ({f.mem}): `{lora}` {gib(mem[lora])}, `{sgd}` {gib(mem[sgd])}; time: {verdict.words()}. "
                f"`{smaller}` is smaller and {said} here. `{lora}` trains "
                f"{100 * trained:.2f} % of the weights (adapters) with AdamW; `{sgd}` trains them all but without "
                f"AdamW's per-parameter step sizes, so it learns slowly: "
                f"{f'choose `{lora}`: it wins on both here' if smaller == faster == lora else f'choose `{faster}` for time, `{smaller}` for memory' if faster else f'choose `{smaller}` for memory'}.")  # fmt: skip

    def states() -> str:
        return (
            f"Model states (arithmetic): `lora-13b` {gib(f.states('lora-13b').gib)}, "
            f"`full-13b-sgd` {gib(f.states('full-13b-sgd').gib)}."
        )

    return f.answer(states, compared)


@answer("01", "qlora-7b")
def _qlora(f: Facts) -> Answer:
    def compared() -> str:
        q, lora = f.plan("qlora-7b"), f.plan("lora-7b")
        mem = {e: f.peak(e) for e in ("qlora-7b", "lora-7b")}
        verdict = f.verdict("qlora-7b", "lora-7b")
        why = {"slower": " (each layer's weights are dequantised for its matmul).",
               "faster": " here, despite dequantising each layer's weights for its matmul."}.get(verdict.verdict, ".")
        return (f"Measured: `qlora-7b` {gib(mem['qlora-7b'])} against `lora-7b` {gib(mem['lora-7b'])} "
                f"({gib(mem['lora-7b'] - mem['qlora-7b'])} saved; predicted frozen weights {gib(lora.part('parameters'))} "
                f"-> {gib(q.part('parameters'))}). Time: {verdict.words()}{why}")  # fmt: skip

    return f.answer(compared)
