"""The phases of a litgpt fine-tuning process outside the traced training step: loading (and quantizing) the
checkpoint, and example generation with a KV cache. litgpt prints ``max_memory_allocated`` over the whole process;
the lab's ``peak_alloc_gib`` starts when training starts (``child_litgpt`` resets the peak in ``fit``). A run that
dies while loading is an OOM too, so ``fits`` is judged on the larger of the two.

What litgpt 0.5.13 does (``litgpt/finetune/{full,lora}.py``, one device):

* **load**: ``fabric.init_module(empty_init=False)`` builds the model on the GPU in the precision's dtype; then
  ``load_checkpoint`` -> ``lazy_load`` (the checkpoint stays on the CPU, one tensor is materialized at a time) ->
  ``model.load_state_dict``, which copies each tensor into its parameter in place (a CPU->GPU copy converts dtypes
  on the CPU side: no GPU temporary). GPU peak: the parameters. On a CPU (the ci profile) the materialized tensor
  is itself a live tensor: parameters + the largest checkpoint tensor.
* **QLoRA's quantization pass** (Lightning's ``BitsandbytesPrecision``): every ``Linear`` is created on the GPU in
  bf16 and quantized at once (``_Linear4bit.__init__`` -> ``quantize_``: ``weight.to(torch.half)`` then
  ``quantize_4bit``); ``load_state_dict`` re-quantizes each weight from the checkpoint through a pre-hook
  (``_quantize_on_load_hook``): an fp16 copy of one weight on the GPU and its new 4-bit storage beside the old one.
  litgpt then swaps in a ``StableEmbedding`` and keeps the old embedding referenced (``old_embedding``).
* **generation** (``generate_example``): the model with a KV cache for batch 1 (``set_kv_cache``: k and v of
  ``max_seq_length`` positions per block, plus a ``(T, T)`` bool mask cache), while the optimizer state and the
  last micro-batch's fp32 ``logits`` are still alive; the prompt's prefill computes its logits (fp32 after Fabric's
  ``convert_output``). The single-token decoding steps of a 4-bit model use ``gemv_4bit`` (no dequantized copy).
  With bitsandbytes < 0.43.2 the last graph's 4-bit inputs are alive too; this phase leaves them out (only runs
  with that old release hold them, and the traced validation before generation includes them).
* **final save**: litgpt saves through ``torch.save`` of GPU tensors (copied to the CPU as they are written) and
  merges LoRA weights on the CPU; the lab skips it altogether (``child_litgpt._skip_final_save``). Not a GPU peak.
"""

from __future__ import annotations

from lab_helpers.config.record_schema import GIB

from .analytic import CUBLAS_WORKSPACE_BYTES
from .fake_modules import nf4_storage_bytes
from .spec import TrainingSpec
from .tracer import TraceResult

_ITEMSIZE = {"32-true": 4, "bf16-true": 2, "16-true": 2, "bf16-mixed": 4, "16-mixed": 4}


def load_bytes(spec: TrainingSpec, trace: TraceResult) -> tuple[int, str]:
    """(bytes, phase name) at the worst moment of building the model and loading the checkpoint, one device."""
    params = trace.param_bytes + trace.kept_alive_bytes
    if spec.device != "cuda":
        return params + trace.largest_param_bytes, "load"
    if spec.method != "qlora":
        return params, "load"
    n = trace.largest_weight_numel
    packed = sum(nf4_storage_bytes(n, str(spec.quantize).endswith("-dq")).values())
    # load_state_dict: everything built, plus one weight's fp16 copy and its new 4-bit storage
    requantize = params + 2 * n + packed
    # init: a bf16 weight and its fp16 copy beside whatever was built before (at most everything but the
    # new embedding, which comes after): an upper bound
    build = params - trace.kept_alive_bytes + 4 * n
    return max(requantize, build), "load + quantize"


def generation_bytes(spec: TrainingSpec, trace: TraceResult) -> int:
    """Bytes at the prefill of ``generate_example`` (the longest prompt that still lets it run)."""
    cfg = spec.model_config
    itemsize = _ITEMSIZE.get(spec.precision, 4)
    T = spec.seq_len
    prompt = max(1, T - spec.max_new_tokens - 1)
    vocab = cfg.padded_vocab_size
    kv_cache = cfg.n_layer * 2 * cfg.n_query_groups * T * cfg.head_size * itemsize
    mask_cache = T * T  # torch.bool
    last_logits = 4 * spec.micro_batch_size * T * vocab  # fit's `logits` (fp32) outlives its iteration
    prefill_logits = prompt * vocab * (itemsize + 4)  # the model's output and its fp32 conversion
    step = max((p for p in trace.phases if p.kind == "step"), key=lambda p: p.peak_bytes, default=None)
    states = step.by_category["optimizer_states"] if step is not None else 0
    resident = trace.param_bytes + trace.kept_alive_bytes + states
    if spec.method == "qlora":
        # litgpt never zeroes the StableEmbedding's gradient (it is not in the optimizer); the prefill
        # dequantizes each weight (fp16, then the compute dtype)
        resident += trace.kept_alive_bytes
        prefill_logits += 4 * trace.largest_weight_numel
    workspaces = CUBLAS_WORKSPACE_BYTES if spec.device == "cuda" else 0  # created by the first matmul
    return resident + kv_cache + mask_cache + last_logits + prefill_logits + workspaces


def whole_run(spec: TrainingSpec, trace: TraceResult, training_bytes: int, training_phase: str) -> dict:
    """Per-phase peaks of the whole process (bytes) and the phase of the largest. Strategies other than one device
    load and generate differently (sharded loads, rank 0 only): their whole-run peak is the training loop's."""
    phases = {"training": (training_bytes, training_phase)}
    if spec.strategy == "single" and spec.loop == "litgpt":
        load, name = load_bytes(spec, trace)
        phases["load"] = (load, name)
        if spec.generate_example:
            phases["generation"] = (generation_bytes(spec, trace), "generation")
    worst = max(phases.values(), key=lambda v: v[0])
    return {
        "bytes": worst[0],
        "phase": worst[1],
        "by_phase_gib": {k: round(v[0] / GIB, 4) for k, v in phases.items()},
    }
