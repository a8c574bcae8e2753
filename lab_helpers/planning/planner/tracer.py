"""Run litgpt's real model, loss and optimizer for a few micro-batches on fake CPU tensors.

The loop mirrors ``litgpt/finetune/{full,lora}.py`` (0.5.13) and Fabric's precision plugins where memory is
concerned: fp32 logits, the previous micro-batch's ``logits`` alive until the next forward returns, lazy optimizer
state, ``zero_grad`` freeing gradients, an unchunked validation loss under ``no_grad``. One micro-batch creates
gradients and optimizer state; a second window of ``min(accumulation, 2)`` shows the steady state later ones repeat.

Blocks repeat, so every term is affine in the number of blocks: ``trace`` runs one and two periods of blocks and
extrapolates to the model's depth (a 13B in seconds). Every storage is affine in the micro batch too, so two traces
answer any other size (``scaled_trace``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from . import loss_outputs
from ._compat import fake_tensor_mode
from .accounting import AllocRecord, Phase, StorageAccountant, cuda_rounded_bytes, make_dispatch_tracker, replay
from .fake_modules import (
    StableEmbedding,
    quantize_linears,
    use_cuda_dropout,
)
from .op_costs import OpCosts, combined, from_trace, op_cost
from .spec import TrainingSpec
from .trace_setup import (
    build_model,
    checkpoint_blocks,
    make_optimizer,
    precision_contexts,
    to_default_float,
    torch_optimizer_kwargs,
)

LORA_LM_HEAD_CHUNK = 128  # litgpt finetune/lora.py: model(input_ids, lm_head_chunk_size=128)


@dataclass
class TraceResult:
    phases: list[Phase]
    total_param_numel: int
    trainable_param_numel: int
    param_bytes: int  # parameters, buffers and 4-bit storage on the GPU, as traced
    trainable_param_bytes: int
    block_param_bytes: int  # one transformer block (FSDP / ZeRO-3 gather unit)
    block_param_numel: int
    root_param_bytes: int  # everything outside the blocks (embedding, lm_head, final norm)
    optimizer_state_bytes: int  # on the CUDA allocator after the last step
    paged_optimizer_bytes: int  # bnb paged state: GPU memory outside the caching allocator
    seconds: float
    kept_alive_bytes: int = 0  # tensors litgpt keeps referenced beside the model (QLoRA's replaced embedding)
    largest_weight_numel: int = 0  # the largest Linear weight (the quantization pass handles one at a time)
    largest_param_bytes: int = 0  # the largest parameter tensor (a lazy load materializes one at a time)
    notes: list[str] = field(default_factory=list)
    # the recorded allocations and phases, kept so that another micro-batch size can be answered from them
    timeline: tuple[list[AllocRecord], list[Phase]] | None = field(default=None, repr=False, compare=False)
    # FLOPs, bytes and kernels of one steady micro-batch and one optimizer step (the time model's input)
    op_costs: OpCosts | None = field(default=None, repr=False, compare=False)

    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.peak_bytes)


def _numel(params) -> int:
    return sum(p.numel() for p in params)


def _bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())


_PER_LAYER_PATTERNS = ("sliding_window_indices", "rope_indices")  # litgpt Config lists with one entry per block


def layer_period(config) -> int:
    """1 for most models, 2 for alternating sliding-window layers; 0 where blocks differ otherwise
    (``first_k_dense_replace``: dense blocks before MoE ones), and the model is traced at full depth."""
    if getattr(config, "first_k_dense_replace", None):
        return 0
    n = config.n_layer
    lists = [list(v)[:n] for name in _PER_LAYER_PATTERNS if (v := getattr(config, name, None)) is not None]
    for p in range(1, n + 1):
        if all(all(seq[i] == seq[i % p] for i in range(len(seq))) for seq in lists):
            return p
    return 0


def scaling_depths(config) -> tuple[int, int] | None:
    p = layer_period(config)
    if p == 0 or 2 * p >= config.n_layer:
        return None
    return p, 2 * p


def trace(spec: TrainingSpec) -> TraceResult:
    n_layer = spec.model_config.n_layer
    depths = scaling_depths(spec.model_config)
    if depths is None:
        return _trace_at_batch(spec, None)
    lo, hi = depths
    a = _trace_at_batch(spec, lo)
    b = _trace_at_batch(spec, hi)
    notes = [f"traced {lo} and {hi} of {n_layer} blocks and extrapolated (blocks are identical)"]
    return _extrapolated(a, b, (n_layer - lo) / (hi - lo), notes)


def _extrapolated(a: TraceResult, b: TraceResult, factor: float, notes: list[str]) -> TraceResult:
    """Continued along the line through ``a`` (factor 0) and ``b`` (factor 1)."""

    def ext(x: float, y: float) -> int:
        return int(round(x + (y - x) * factor))

    phases = []
    for pa, pb in zip(a.phases, b.phases, strict=True):
        phases.append(
            Phase(
                pb.name,
                pb.kind,
                pb.t_start,
                pb.t_end,
                peak_bytes=ext(pa.peak_bytes, pb.peak_bytes),
                t_peak=pb.t_peak,
                by_category={k: ext(pa.by_category[k], pb.by_category[k]) for k in pb.by_category},
                step_temporaries=ext(pa.step_temporaries, pb.step_temporaries),
            )
        )
    scalars = {
        name: ext(getattr(a, name), getattr(b, name))
        for name in (
            "total_param_numel",
            "trainable_param_numel",
            "param_bytes",
            "trainable_param_bytes",
            "root_param_bytes",
            "optimizer_state_bytes",
            "paged_optimizer_bytes",
        )
    }
    notes = [*notes, *(n for n in b.notes if n not in notes)]
    ops = None
    if a.op_costs is not None and b.op_costs is not None:
        ops = combined(a.op_costs, b.op_costs, factor, "the extrapolated trace")
    return TraceResult(
        op_costs=ops,
        phases=phases,
        block_param_bytes=b.block_param_bytes,
        block_param_numel=b.block_param_numel,
        seconds=a.seconds + b.seconds,
        notes=notes,
        kept_alive_bytes=b.kept_alive_bytes,
        largest_weight_numel=b.largest_weight_numel,
        largest_param_bytes=b.largest_param_bytes,
        **scalars,
    )


# --- one trace, several micro-batch sizes ------------------------------------------------------------------------
# For a fixed sequence length the step runs the same ops in the same order whatever the micro-batch size B >= 2
# (B = 1 may skip copies: a tensor with a size-1 dimension can already be contiguous), and every storage is either
# independent of B (weights, gradients, optimizer state) or proportional to it (activations, logits). So two traces
# at B1, B2 >= 2 with identical timelines give every storage's size as c + a * B exactly, and a replay of the
# timeline with those sizes is the trace at any other B >= 2. A `--fit` search asks ~10 sizes for ~3 traces.
_TIMELINES: dict[str, dict[int, TraceResult]] = {}
_TIMELINE_KEYS = 16  # specs remembered (each holds a few timelines of ~10^4 records)


UNTRACED_FIELDS = (
    "devices",
    "fsdp_wrap_blocks",
    "offload_optimizer",
    "gpu_memory_gib",
    "fsdp_reshard_after_forward",
    "fsdp_impl",
    "fsdp_unsharded_grad_accumulation",
    "ddp_gradient_as_bucket_view",
    "generate_example",
    "max_new_tokens",
)
"""Runs that differ only in these (FSDP over 2, 4 or 8 GPUs, a GPU's size) share one trace; tests/test_planner.py
checks that they leave it as it was."""


def _batch_free_key(spec: TrainingSpec, n_layer: int | None) -> str:
    """Everything but the micro-batch size. Accumulation only decides whether a second micro-batch runs before the
    step, so 2, 4 and 32 trace alike."""
    defaults = {name: TrainingSpec.__dataclass_fields__[name].default for name in UNTRACED_FIELDS}
    traced = dataclasses.replace(
        spec, micro_batch_size=0, gradient_accumulation_iters=min(spec.gradient_accumulation_iters, 2), **defaults
    )
    return repr((traced, n_layer))


def _same_structure(a: TraceResult, b: TraceResult) -> bool:
    (ra, pa), (rb, pb) = a.timeline, b.timeline  # type: ignore[misc]
    if len(ra) != len(rb) or [(p.name, p.kind, p.t_start, p.t_end) for p in pa] != [
        (p.name, p.kind, p.t_start, p.t_end) for p in pb
    ]:
        return False
    return all(
        (x.t_alloc, x.t_free, x.phase, x.category) == (y.t_alloc, y.t_free, y.phase, y.category)
        for x, y in zip(ra, rb, strict=True)
    )


def scaled_trace(a: TraceResult, b: TraceResult, batch_a: int, batch_b: int, batch: int) -> TraceResult | None:
    """From traces at ``batch_a`` and ``batch_b`` (all >= 2); None where the two timelines differ in structure or a
    storage is not affine in the batch."""
    if a.timeline is None or b.timeline is None or min(batch_a, batch_b, batch) < 2 or batch_a == batch_b:
        return None
    if not _same_structure(a, b):
        return None
    records, phases = a.timeline
    sizes = []
    for x, y in zip(records, b.timeline[0], strict=True):
        slope, rest = divmod(y.raw_nbytes - x.raw_nbytes, batch_b - batch_a)
        size = x.raw_nbytes + slope * (batch - batch_a)
        if rest or size < 0:
            return None
        sizes.append(cuda_rounded_bytes(size))
    ops = None
    if a.op_costs is not None and b.op_costs is not None:
        ops = combined(a.op_costs, b.op_costs, (batch - batch_a) / (batch_b - batch_a), f"micro-batch {batch}")
        if ops.notes != b.op_costs.notes:
            return None  # the ops did not line up: trace this size instead
    return dataclasses.replace(
        a,
        op_costs=ops,
        phases=replay(records, phases, sizes),
        seconds=0.0,
        notes=[*a.notes, f"micro-batch {batch} computed from the traces at {batch_a} and {batch_b} (exact)"],
        timeline=None,
    )


TRACE_TOKENS_CAP = 1 << 15
"""64 x 512 tokens. Tracing costs time and host memory in proportion to the tokens (micro batch 1e9 took 19.6 GB of
RSS and minutes); beyond the cap memory continues along the line through two smaller traces (activations grow with
the batch, weights and optimizer states do not). Every micro-batch of the lab's experiments (<= 32 x 512) is traced."""


def _trace_at_batch(spec: TrainingSpec, n_layer: int | None) -> TraceResult:
    """Answered from remembered timelines at other micro batches where two allow it; extrapolated in the batch beyond
    ``TRACE_TOKENS_CAP``."""
    batch = spec.micro_batch_size
    if batch > 4 and batch * spec.seq_len > TRACE_TOKENS_CAP:
        hi = max(4, TRACE_TOKENS_CAP // spec.seq_len // 2 * 2)
        lo = hi // 2
        a = _trace_at_batch(dataclasses.replace(spec, micro_batch_size=lo), n_layer)
        b = _trace_at_batch(dataclasses.replace(spec, micro_batch_size=hi), n_layer)
        exact = scaled_trace(a, b, lo, hi, batch)
        if exact is not None:
            return exact
        note = f"micro-batch {batch} continued along the line through the traces at {lo} and {hi} (approximate)"
        return dataclasses.replace(_extrapolated(a, b, (batch - lo) / (hi - lo), [note]), timeline=None)
    key = _batch_free_key(spec, n_layer)
    known = _TIMELINES.get(key)
    if known is None:
        if len(_TIMELINES) >= _TIMELINE_KEYS:
            _TIMELINES.pop(next(iter(_TIMELINES)))
        known = _TIMELINES[key] = {}
    if batch in known:
        return known[batch]
    points = sorted((b for b in known if b >= 2), key=lambda b: abs(b - batch))
    if batch >= 2 and len(points) >= 2:
        result = scaled_trace(known[points[0]], known[points[1]], points[0], points[1], batch)
        if result is not None:
            return result
    result = trace_training(spec, n_layer=n_layer)
    known[batch] = result
    return result


def trace_training(spec: TrainingSpec, n_layer: int | None = None) -> TraceResult:
    """Two optimizer windows and a validation pass, on one device."""
    from litgpt.utils import chunked_cross_entropy

    started = time.perf_counter()
    pdtype, forward_context, _ = precision_contexts(spec)
    accumulation = spec.gradient_accumulation_iters
    micro_batches = min(accumulation, 2)
    B, T = spec.micro_batch_size, spec.seq_len
    vocab = spec.model_config.padded_vocab_size
    acct = StorageAccountant()
    keep_alive: list = []  # objects litgpt keeps referenced for the whole run

    spec = _with_layers(spec, n_layer)
    with fake_tensor_mode():
        model = build_model(spec, pdtype)
        total_numel = _numel(model.parameters())  # before 4-bit layers turn weights into buffers
        largest_weight = max((m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)), default=0)
        largest_param = max((_bytes([p]) for p in model.parameters()), default=0)
        use_cuda_dropout(model)
        # litgpt builds the optimizer before QLoRA's embedding swap, so the new embedding is never zeroed.
        optimizer = make_optimizer(spec, model)
        _quantize_for_qlora(spec, model, pdtype, keep_alive)
        if spec.activation_checkpointing:
            checkpoint_blocks(model)
        model.max_seq_length = T  # fit(): outside any precision context, so the RoPE cache is fp32

        params = list(model.parameters())
        for t in [*params, *model.buffers()]:
            acct.track(t, "parameters")
        for mod in keep_alive:
            for t in mod.parameters():
                acct.track(t, "parameters")
        trainable = [p for p in params if p.requires_grad]
        hooks = [p.register_post_accumulate_grad_hook(lambda p: acct.mark(p.grad, "gradients")) for p in trainable]

        op_log: list = []

        def on_op(func, args, kwargs, out) -> None:
            cost = op_cost(func, args, kwargs, out)
            if cost is not None and acct.phases:
                op_log.append((acct.phases[-1].name, cost))

        tracker = make_dispatch_tracker(acct, shortcuts=loss_outputs.SHORTCUTS, on_op=on_op)
        lora = spec.method != "full"

        def loss_of(logits, targets):
            if lora:
                logits[-1] = logits[-1][..., :-1, :]
                return chunked_cross_entropy(logits, targets[..., 1:])
            return chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])

        def forward(input_ids):
            with forward_context():
                out = model(input_ids, lm_head_chunk_size=LORA_LM_HEAD_CHUNK) if lora else model(input_ids)
            return to_default_float(out)

        def training_step(input_ids, targets):
            """Lightning's Trainer computes the loss inside training_step, so the logits die with it."""
            with forward_context():
                out = model(input_ids, lm_head_chunk_size=LORA_LM_HEAD_CHUNK) if lora else model(input_ids)
                return loss_of(out, targets)

        def validation():
            """litgpt's validate(): no grad, the unchunked loss."""
            acct.begin("validation", "val")
            model.eval()
            with torch.no_grad():
                input_ids = torch.randint(0, vocab, (B, T))
                targets = torch.randint(0, vocab, (B, T))
                with forward_context():
                    val_logits = model(input_ids)
                val_logits = to_default_float(val_logits)
                chunked_cross_entropy(val_logits[..., :-1, :], targets[..., 1:], chunk_size=0)
                del val_logits
            model.train()
            acct.end()

        lightning = spec.loop == "lightning"
        logits = loss = None
        with tracker:
            if spec.include_validation and not spec.validation_during_training:
                validation()  # litgpt's sanity check before the first step: parameters only
            iteration = 0
            for window in range(2):
                for micro in range(1 if window == 0 else micro_batches):
                    iteration += 1
                    acct.begin(f"w{window}m{micro}-forward", "fwd")
                    input_ids = torch.randint(0, vocab, (B, T))
                    targets = torch.randint(0, vocab, (B, T))
                    if lightning:
                        loss = training_step(input_ids, targets)
                    else:
                        logits = forward(input_ids)
                        loss = loss_of(logits, targets)
                    acct.end()
                    acct.begin(f"w{window}m{micro}-backward", "bwd")
                    (loss / accumulation).backward()
                    # litgpt turns `loss` into a float at every log_interval (1 in its recipes and the lab's): the
                    # graph lives on through `logits` alone, until the next forward returns
                    loss = None
                    acct.end()
                acct.begin(f"w{window}-step", "step")
                optimizer.step()
                optimizer.zero_grad()
                _mark_optimizer_states(acct, optimizer)
                acct.end()
            if spec.include_validation and spec.validation_during_training:
                validation()
        for h in hooks:
            h.remove()

        result = _trace_result(
            spec, acct, model, params, trainable, optimizer, keep_alive, op_log, started, total_numel, largest_weight,
            largest_param
        )
    return result


def _quantize_for_qlora(spec: TrainingSpec, model: torch.nn.Module, pdtype: torch.dtype, keep_alive: list) -> None:
    """As litgpt's lora.py does it; a replaced embedding stays referenced in ``keep_alive``, as it does there."""
    if spec.method == "qlora":
        software = spec.software
        double_quant = str(spec.quantize).endswith("-dq")
        quantize_linears(model, double_quant, software.bnb_keeps_matmul_input)
        if software.qlora_stable_embedding:
            old = model.transformer.wte
            model.transformer.wte = StableEmbedding(
                old.num_embeddings, old.embedding_dim, pdtype, old.weight.device
            )
            keep_alive.append(old)  # lora.py keeps `old_embedding` referenced in main()


def _with_layers(spec: TrainingSpec, n_layer: int | None) -> TrainingSpec:
    if n_layer is not None:
        spec = copy.copy(spec)
        spec.model_config = copy.deepcopy(spec.model_config)
        spec.model_config.n_layer = n_layer
    return spec


def _mark_optimizer_states(acct: StorageAccountant, optimizer: torch.optim.Optimizer) -> None:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                acct.mark(value, "optimizer_states")


def _trace_result(
    spec: TrainingSpec,
    acct: StorageAccountant,
    model: torch.nn.Module,
    params: list,
    trainable: list,
    optimizer: torch.optim.Optimizer,
    keep_alive: list,
    op_log: list,
    started: float,
    total_numel: int,
    largest_weight: int,
    largest_param: int,
) -> TraceResult:
    acct.summarize()
    blocks = model.transformer.h
    block_params = list(blocks[0].parameters()) + list(blocks[0].buffers())
    block_bytes = _bytes(block_params)
    all_bytes = _bytes([*params, *model.buffers()])
    state_bytes = _bytes(
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.numel() > 1
    )
    uses_torch_optimizer = spec.optimizer_step is not None
    return TraceResult(
        notes=torch_optimizer_kwargs(spec)[1] if uses_torch_optimizer else [],
        phases=acct.phases,
        total_param_numel=total_numel,
        trainable_param_numel=_numel(trainable),
        param_bytes=all_bytes,
        trainable_param_bytes=_bytes(trainable),
        block_param_bytes=block_bytes,
        block_param_numel=_numel(blocks[0].parameters()),
        root_param_bytes=max(0, all_bytes - block_bytes * len(blocks)),
        optimizer_state_bytes=state_bytes,
        paged_optimizer_bytes=getattr(optimizer, "paged_bytes", 0),
        seconds=time.perf_counter() - started,
        kept_alive_bytes=_bytes(t for mod in keep_alive for t in mod.parameters()),
        largest_weight_numel=largest_weight,
        largest_param_bytes=largest_param,
        # a snapshot: storages freed after the trace must not change it
        timeline=([copy.copy(r) for r in acct.records], acct.phases),
        # window 1 is the steady one: gradients and optimizer state exist, as in every later micro-batch
        op_costs=from_trace(op_log, {"w1m0-forward", "w1m0-backward"}, {"w1-step"}),
    )
