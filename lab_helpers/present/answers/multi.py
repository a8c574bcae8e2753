"""Notebook 02's answers: DDP, FSDP and DeepSpeed on several GPUs (or rank 0 of them, simulated)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.config.iteration_times import finite_number
from lab_helpers.config.record_schema import GIB
from lab_helpers.present.answers.key import Answer, Cannot, Facts, answer, gib, idle_pct, real_states, words

# -- 02


def _one_gpu(f: Facts) -> str:
    """`one-gpu`, else 01's `full-7b` (the same 7B, bf16-true and micro batch on one device)."""
    try:
        f.run("one-gpu")
        return "one-gpu"
    except Cannot:
        f.run("full-7b")
        return "full-7b"


@answer("02", "one-gpu")
def _one_gpu_parts(f: Facts) -> Answer:
    def parts() -> str:
        plan = f.plan("one-gpu")
        return (f"`one-gpu` predicted: activations {gib(plan.part('activations'))} (and temporaries "
                f"{gib(plan.part('temporaries'))}) scale with the micro batch: halving {plan.micro} to {plan.micro // 2} "
                f"halves the activations to about {gib(plan.part('activations') / 2)}. Parameters "
                f"{gib(plan.part('parameters'))}, gradients {gib(plan.part('gradients'))} and optimizer states "
                f"{gib(plan.part('optimizer_states'))} ({gib(plan.model_states())} of model states) do not change.")  # fmt: skip

    return f.answer(parts)


@answer("02", "ddp")
def _ddp(f: Facts) -> Answer:
    def memory() -> str:
        base, plan = _one_gpu(f), f.plan("ddp")
        return (f"{f.label('ddp')}: {f.mem} {gib(f.peak('ddp'))} against `{base}`'s {gib(f.peak(base))}; predicted model "
                f"states per rank {gib(plan.model_states())} against {gib(f.plan(base).model_states())}: every rank "
                "holds the whole model, its gradients and optimizer states, so adding GPUs adds copies, not room.")  # fmt: skip

    def accumulation() -> str:
        return _accumulation_words(f, _one_gpu(f))

    def efficiency() -> str:
        if f.simulated("ddp"):
            raise Cannot(
                f"scaling efficiency: {f.name}'s `ddp` is a simulated rank, whose tokens/s has no communication in it"
            )
        n, base = f.world(f.run("ddp")), _one_gpu(f)
        eff = f.value("ddp", "tokens_per_s") * n / (n * f.value(base, "tokens_per_s"))
        return (f"Scaling efficiency on {n} GPUs: {eff:.2f}; the rest is the all-reduce not hidden behind backward, "
                "and the optimizer steps `ddp` takes more often where it accumulates less.")  # fmt: skip

    return f.answer(memory, accumulation, efficiency)


def _accumulation_words(f: Facts, base: str) -> str:
    """From their records' recipes: the scaling question compares `one-gpu`, accumulating 4, with `ddp`, accumulating
    2 on 4 GPUs, and must say so."""
    from lab_helpers.config.experiments import gradient_accumulation_steps

    runs = {exp: f.run(exp) for exp in (base, "ddp")}
    train = {exp: r["config"]["train"] for exp, r in runs.items()}
    worlds = {exp: f.world(r) for exp, r in runs.items()}
    steps = {exp: gradient_accumulation_steps(r["config"], world_size=worlds[exp]) for exp, r in runs.items()}
    spelled = {exp: f"{t['global_batch_size']} / ({t['micro_batch_size']} × {worlds[exp]} GPU{'s' if worlds[exp] > 1 else ''})"
               for exp, t in train.items()}  # fmt: skip
    text = (f"`{base}` accumulates {steps[base]} micro-batches per optimizer step ({spelled[base]}), `ddp` on "
            f"{worlds['ddp']} GPUs {steps['ddp']} ({spelled['ddp']}); the course ran the 7B on one GPU at batch "
            f"{train[base]['micro_batch_size']} with no accumulation.")  # fmt: skip
    if steps[base] == steps["ddp"]:
        return text + " Like for like: the same optimizer steps per micro-batch, so the gap to 1 is the all-reduce."
    even, left = divmod(int(train["ddp"]["global_batch_size"]), int(train["ddp"]["micro_batch_size"]) * steps[base])
    alike = f" (`ddp` accumulates {steps[base]} too on {even} GPUs)" if not left and even > 1 else ""
    return (text + f" Not like for like: a `ddp` rank runs the optimizer step every {steps['ddp']} micro-batches "
            f"against every {steps[base]}, so even with free communication its tokens/s per rank falls short of "
            f"`{base}`'s by the extra steps' time; compare at equal accumulation{alike}, or count the optimizer "
            "step's share apart.")  # fmt: skip


@answer("02", "ddp-course")
def _ddp_course(f: Facts) -> Answer:
    def extra() -> str:
        world = f.world(f.run("ddp-course"))
        more = f.peak("ddp-course", world) - f.peak("ddp", world)
        plan = f.plan("ddp-course", world)
        return (f"{f.label('ddp-course', world)} holds {gib(more)} more than {f.label('ddp', world)} ({f.mem}); per "
                f"parameter {more * GIB / plan.params:.2f} B (predicted communication buffers "
                f"{gib(plan.part('communication_buffers'))}: a second copy of the gradients). With gradients freed "
                "between steps, autograd would allocate new gradient tensors that are no longer views of the buckets, "
                "so the buckets would be a second copy again.")  # fmt: skip

    return f.answer(extra)


def _reduce_scatter_words(volume) -> str:
    """When the gradients are reduce-scattered: once per step under FSDP1's no_sync (Lightning's FSDPStrategy), every
    micro-batch under FSDP2 (no no_sync under the Trainer)."""
    if volume.strategy.endswith("fsdp1)"):  # "fsdp (full, per block, fsdp1)"
        return "reduce-scatters the gradients once per step (Lightning accumulates under FSDP1's `no_sync`)"
    return "reduce-scatters the gradients in every micro-batch (FSDP2 under the Trainer has no `no_sync`)"


@answer("02", "fsdp")
def _fsdp_communication(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import communication

    def times() -> str:
        ddp, fsdp = f.communication("ddp"), f.communication("fsdp")

        def multiple(m: int) -> float:
            return communication("fsdp", profile=f.profile, ranks=fsdp.ranks, micro_batches=m).psi_multiple

        root = f", Ψ_root {100 * fsdp.root_share:.1f} % of it" if fsdp.root_bytes else ""
        return (f"Per optimizer step on {fsdp.ranks} GPUs: `fsdp` ({fsdp.strategy_words}) {fsdp.total_words()} "
                f"against DDP's {ddp.psi_multiple:g}Ψ: x{fsdp.psi_multiple / ddp.psi_multiple:.3g} (Ψ = "
                f"{gib(fsdp.psi_gib)}{root}). With 4 micro-batches {multiple(4):.3g}Ψ "
                f"(x{multiple(4) / ddp.psi_multiple:.3g}), with one {multiple(1):.3g}Ψ "
                f"(x{multiple(1) / ddp.psi_multiple:.3g}): FSDP gathers the weights in every micro-batch (each block "
                f"twice, the root unit once) and {_reduce_scatter_words(fsdp.volume)}; DDP all-reduces once per step. "
                "In a real N-GPU run the price shows as a longer `train_s` and lower `tokens_per_s` than a "
                "simulated rank's; prefetching the next block's all-gather during the current block's compute hides "
                "it as far as compute per block lasts longer than its gather.")  # fmt: skip

    def simulated() -> str:
        if not f.simulated("fsdp"):
            return f"{f.label('fsdp')} measured {f.value('fsdp', 'tokens_per_s'):,.0f} tokens/s per rank."
        raise Cannot(f"the price itself: {f.name}'s `fsdp` is a simulated rank, which has no communication time")

    return f.answer(times, simulated)


@answer("02", "fsdp-course")
def _fsdp_course(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import communication

    def grew() -> str:
        world = f.world(f.run("fsdp-course"))
        course, block = f.plan("fsdp-course", world), f.plan("fsdp", world)
        part = max(course.parts, key=lambda p: course.part(p) - block.part(p))
        one = f.communication("fsdp-course")
        per_block = communication("fsdp", profile=f.profile, ranks=one.ranks, micro_batches=one.micro_batches)
        psi = one.volume.psi_bytes
        a = one.micro_batches
        return (f"{f.label('fsdp-course', world)} against {f.label('fsdp', world)}: {words(part)} grew "
                f"{gib(course.part(part))} against {gib(block.part(part))} (+{gib(course.part(part) - block.part(part))}); "
                f"measured {gib(f.peak('fsdp-course', world))} against {gib(f.peak('fsdp', world))}. The one unit is "
                f"gathered whole (Ψ = {gib(psi / GIB)}) and its whole gradient (another Ψ) lives until its backward "
                f"ends, when the reduce-scatter runs: {gib(2 * psi / GIB)} whatever N, so more GPUs do not shrink it. "
                f"Per-block wrapping buys holding one block at a time; it costs traffic: at the course's {a} "
                f"micro-batch{'es' if a > 1 else ''} per step {per_block.total_words()} (each block gathered again "
                f"for backward) against the one unit's {one.total_words()} (gathered once and kept through the "
                "backward).")  # fmt: skip

    return f.answer(grew)


@answer("02", "fsdp-bs8")
def _fsdp_bs8(f: Facts) -> Answer:
    def grew() -> str:
        world = f.world(f.run("fsdp-bs8"))
        more = f.peak("fsdp-bs8", world) - f.peak("fsdp", world)
        samples = f.micro("fsdp-bs8", world) - f.micro("fsdp", world)
        plan, base = f.plan("fsdp-bs8", world), f.plan("fsdp", world)
        return (f"{f.label('fsdp-bs8', world)}: {gib(f.peak('fsdp-bs8', world))} against {gib(f.peak('fsdp', world))}, "
                f"+{gib(more)} for {samples} more samples per micro-batch: {gib(more / samples)} per sample measured "
                f"(predicted activations {gib(base.part('activations'))} -> {gib(plan.part('activations'))}, "
                f"{gib((plan.part('activations') - base.part('activations')) / samples)} per sample): activations grow "
                "linearly with the micro batch, the sharded model states do not move.")  # fmt: skip

    return f.answer(grew)


@answer("02", "fsdp-grad-op")
def _fsdp_grad_op(f: Facts) -> Answer:
    def memory() -> str:
        world = f.world(f.run("fsdp-grad-op"))
        plan, base = f.plan("fsdp-grad-op", world), f.plan("fsdp", world)
        fsdp1 = f.communication("fsdp-grad-op").volume.strategy.endswith("fsdp1)")
        held = (
            "from the step's first forward to its last backward (FSDP1 under `no_sync` does not free a "
            "SHARD_GRAD_OP unit after backward)"
            if fsdp1
            else "from each forward to its backward"
        )
        return (f"{f.label('fsdp-grad-op', world)} needs {gib(f.peak('fsdp-grad-op', world) - f.peak('fsdp', world))} "
                f"more than `fsdp` ({gib(f.peak('fsdp-grad-op', world))} against {gib(f.peak('fsdp', world))}; predicted "
                f"communication buffers, the gathered weights, {gib(plan.part('communication_buffers'))} against "
                f"{gib(base.part('communication_buffers'))}): every GPU holds the whole weights {held}.")  # fmt: skip

    def saved() -> str:
        full, grad_op = f.communication("fsdp"), f.communication("fsdp-grad-op")
        return (f"Communication per step and GPU: {gib(full.per_gpu_gib)} ({full.total_words()}) against "
                f"{gib(grad_op.per_gpu_gib)} ({grad_op.total_words()}) on {full.ranks} GPUs: "
                f"{gib(full.per_gpu_gib - grad_op.per_gpu_gib)} saved. Worth it where those GiB take long: PCIe or "
                "between nodes, far more than over NVLink, and only while the memory is there.")  # fmt: skip

    return f.answer(memory, saved)


@answer("02", "deepspeed-offload")
def _offload(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import OFFLOAD_HOST_BYTES_PER_PARAM, offload_host_gib

    def arithmetic() -> str:
        return (f"The offload keeps {OFFLOAD_HOST_BYTES_PER_PARAM} B/param in host RAM (fp32 master weights, both "
                f"moments, fp32 gradient partitions): {gib(offload_host_gib('deepspeed-offload', profile=f.profile))} "
                f"for `deepspeed-offload`'s model, stepped by the CPU; host RAM (and the CPU step's time) limits the "
                "model size.")  # fmt: skip

    def measured() -> str:
        mine = f.value("deepspeed-offload", "host_rss_peak_gib")
        others = [
            rss
            for (e, _), r in f.latest.items()
            if e != "deepspeed-offload" and (rss := finite_number(r.get("host_rss_peak_gib"))) is not None
        ]
        return f"Measured `host_rss_peak_gib` {gib(mine)} against {gib(min(others))}-{gib(max(others))} for the other runs."

    return f.answer(arithmetic, measured)


@answer("02", "deepspeed-zero2-offload")
def _zero2(f: Facts) -> Answer:
    from lab_helpers.planning.arithmetic import trainable_bytes

    def arithmetic() -> str:
        two, three = f.communication("deepspeed-zero2-offload"), f.communication("deepspeed-offload")
        big = real_states(f, "deepspeed-offload")
        per_param = trainable_bytes(big.precision).weights
        weights = big.counts.total * per_param / GIB
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            from lab_helpers.planning.decision import LAB_GPU_GIB

            memory, where = LAB_GPU_GIB, f"an 80 GB GPU's {gib(LAB_GPU_GIB)}"
        return (
            f"ZeRO-2 keeps the whole weights on every GPU and sends {two.psi_multiple:g}Ψ per step "
            f"({gib(two.per_gpu_gib)}) against ZeRO-3's {three.psi_multiple:g}Ψ ({gib(three.per_gpu_gib)}; {three.ranks} "
            f"GPUs, each recipe's model and accumulation): pick it where the weights fit, to send less. It cannot fit "
            f"where the weights alone fill the GPU: {where} holds the {big.precision} weights of about "
            f"{memory * GIB / per_param / 1e9:.3g}e9 parameters ({per_param:g} B each), before activations and gradient "
            f"buckets; the real {big.model}'s are {gib(weights)}, "
            f"{'so ZeRO-2 could hold them here' if weights < memory else 'so only ZeRO-3 fits it here'}."
        )

    def measured() -> str:
        return (f"Measured: per GPU {gib(f.peak('deepspeed-zero2-offload'))} against {gib(f.peak('deepspeed-offload'))}; "
                f"host RSS {gib(f.value('deepspeed-zero2-offload', 'host_rss_peak_gib'))} against "
                f"{gib(f.value('deepspeed-offload', 'host_rss_peak_gib'))}.")  # fmt: skip

    return f.answer(arithmetic, measured)


@answer("02", "timeline-where-the-gpus-wait")
def _offload_idle(f: Facts) -> Answer:
    def idle() -> str:
        record = f.run("deepspeed-offload")
        f.need_gpu("idle GPUs")
        share = _idle_share(record)
        return (
            f"In `deepspeed-offload`'s timed loop every GPU was under {idle_pct():g} % busy {share:.0f} % of the time."
        )

    return f.answer(
        idle,
        "A larger accumulation makes it smaller: the CPU's optimizer step comes once per step, "
        "the GPU's work once per micro-batch.",
    )


def _idle_share(record: Mapping[str, Any]) -> float:
    from lab_helpers.present.figures import _idle_spans, _timeline_path, read_timeline

    path, _ = _timeline_path(record)
    window = record.get("loop_window_s")
    if path is None or not isinstance(window, list | tuple):
        raise Cannot(f"`{record.get('experiment')}` has no timeline with its loop's window")
    frame = read_timeline(path)
    start, end = window
    spans = _idle_spans(frame[frame["gpu"].notna()])
    idle = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return 100 * idle / (end - start)


@answer("02", "multi-node")
def _multi_node(f: Facts) -> Answer:
    def most() -> str:
        from lab_helpers.config.experiments import load_experiments

        names = [e for e, x in load_experiments("multi").items() if x.strategy != "single" and e != "multi-node"]
        sent = {e: f.communication(e) for e in names}
        worst = max(sent, key=lambda e: sent[e].per_gpu_gib)
        listed = ", ".join(f"`{e}` {gib(c.per_gpu_gib)} ({c.psi_multiple:.3g}Ψ)" for e, c in sent.items())
        return (f"Bytes each GPU sends per optimizer step on {sent[worst].ranks} GPUs, with each recipe's "
                f"accumulation: {listed}. `{worst}` sends the most, so it suffers most when the all-gathers cross the "
                "network; DDP, one all-reduce per step, least.")  # fmt: skip

    return f.answer(most)


@answer("02", "named-not-run-the-parallelisms-beyond-this-lab")
def _named_not_run(f: Facts) -> Answer:
    """Always the gpu profile's 7B, as 02's table (``parallelisms.show``) is, whatever the reference ran on."""
    from lab_helpers.planning import arithmetic, parallelisms
    from lab_helpers.planning.decision import SIMULATED_WORLD

    def split() -> str:
        rows = {r.name.split(" (")[0]: r for r in parallelisms.rows(parallelisms.reference_setting())}
        fsdp, tp = rows["FSDP full shard"], rows["Tensor parallel"]
        return ("Activations: tensor parallel splits those inside attention and the MLP, sequence parallel (with it) "
                "the rest, context parallel all of them along the sequence; pipeline parallel holds only its stage's "
                "layers, but several micro-batches in flight. FSDP, HSDP, ZeRO++, expert parallel and parameter "
                "offload split or move only model states, and context parallel splits no model states. Between steps "
                f"on {SIMULATED_WORLD} GPUs the 7B's model states are {gib(fsdp.per_gpu_gib)} per GPU under FSDP and "
                f"{gib(tp.per_gpu_gib)} under tensor parallel (its norms whole).")  # fmt: skip

    def sent() -> str:
        fsdp = arithmetic.communication("fsdp", profile="gpu", ranks=SIMULATED_WORLD)
        tp = parallelisms.tensor_parallel_traffic(SIMULATED_WORLD)
        per_step = tp.link_bytes_per_gpu * fsdp.micro_batches / GIB
        return (f"Per optimizer step of {fsdp.micro_batches} micro-batches on {fsdp.ranks} GPUs, FSDP sends weights: "
                f"{fsdp.total_words()} ({gib(fsdp.per_gpu_gib)} per GPU), in all-gathers it prefetches while the "
                f"previous block computes. Tensor parallel sends activations: {tp.all_reduces} all-reduces per "
                f"micro-batch (2 per block forward, 2 backward) of micro batch {tp.micro_batch} × {tp.tokens} tokens × "
                f"hidden, {gib(tp.tensor_bytes / GIB)} each, {gib(per_step)} per GPU per step. Fewer bytes here, but "
                f"each of the {tp.all_reduces} sits between one layer and the next with nothing to overlap it, so only "
                "a link as fast as NVLink inside a node keeps it from stalling the GPUs.")  # fmt: skip

    return f.answer(split, sent)
