"""The phases of a litgpt fine-tuning process outside the traced step: loading (and quantizing) the checkpoint, and
example generation. litgpt's ``max_memory_allocated`` covers the whole process where the lab's ``peak_alloc_gib``
starts with training; a run that dies loading is an OOM too, so ``fits`` takes the larger.

As litgpt 0.5.13 does it on one device:

* load: the model is built on the GPU, then each checkpoint tensor is materialized on the CPU and copied into its
  parameter in place (dtype converted on the CPU side): the GPU peak is the parameters; on a CPU, the parameters
  plus the largest checkpoint tensor;
* QLoRA: ``load_state_dict`` re-quantizes each weight through a pre-hook, an fp16 copy of one weight on the GPU
  and its new 4-bit storage beside the old; the old embedding stays referenced after the ``StableEmbedding`` swap;
* generation: a batch-1 KV cache of ``max_seq_length`` positions per block and a (T, T) mask, beside the optimizer
  state and the last micro-batch's fp32 ``logits``; the prefill's logits are fp32; 4-bit decoding uses
  ``gemv_4bit`` (no dequantized copy);
* the final save: skipped by the lab (``child_litgpt._skip_final_save``).
"""

from __future__ import annotations

from lab_helpers.config.record_schema import GIB

from .analytic import CUBLAS_WORKSPACE_BYTES
from .fake_modules import nf4_storage_bytes
from .spec import TrainingSpec
from .tracer import TraceResult

_ITEMSIZE = {"32-true": 4, "bf16-true": 2, "16-true": 2, "bf16-mixed": 4, "16-mixed": 4}


def load_bytes(spec: TrainingSpec, trace: TraceResult) -> tuple[int, str]:
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
    """At the prefill of the longest prompt that still lets it run."""
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
    """Other strategies load and generate differently (sharded, rank 0 only): their whole-run peak is the training
    loop's."""
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
