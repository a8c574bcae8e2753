"""Activation memory by hand: what a llama block keeps for backward, per token and layer, from the model's config.

The planner's bar gives the activations' size but not where it comes from: here it is a short sum over the tensors
autograd saves in one litgpt block, each a vector per token whose length comes from the config, times layers and
tokens, plus the head. Assumed besides what ``misses`` prints: litgpt repeats grouped K/V heads to every query head,
no dropout, RoPE's per-position cos and sin left out. tests/test_activations_by_hand.py checks the sum against the
planner's trace of the same block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from lab_helpers.config.record_schema import GIB
from lab_helpers.planning.planner.spec import precision_bytes

FP32_BYTES = 4


class Term(NamedTuple):
    """``count``: how many a layer has (a block's two RMSNorms are one term)."""

    tensor: str
    elements_per_token: int
    bytes_per_element: int
    count: int = 1


def per_token_bytes(term: Term) -> int:
    return term.count * term.bytes_per_element * term.elements_per_token


def element_bytes(precision: str) -> int:
    if precision.endswith("-mixed"):
        raise ValueError(
            f"{precision}: the hand count assumes one dtype throughout (32-true, bf16-true, 16-true); "
            "mixed precision keeps fp32 tensors beside bf16 copies of them"
        )
    return precision_bytes(precision)


def _norm_terms(width: int, b: int, where: str) -> list[Term]:
    """litgpt's RMSNorm: x.float(), mean(x*x), x * rsqrt(...), (x_normed * weight).to(dtype)."""
    return [
        Term(f"{where}: input as fp32 (x.float())", width, FP32_BYTES),
        Term(f"{where}: 1/rms, one per token (fp32)", 1, FP32_BYTES),
        Term(f"{where}: normalised x (fp32, kept for x * weight)", width, FP32_BYTES),
        Term(f"{where}: output, in the training dtype", width, b),
    ]


def block_terms(config: Any, precision: str) -> list[Term]:
    """An RMSNorm's output is the input of the linear layers after it, which keep it: one tensor, counted once."""
    if config.mlp_class_name != "LLaMAMLP" or config.parallel_residual:
        raise ValueError(f"{config.name}: the hand count is for llama blocks (LLaMAMLP, sequential residual)")
    b = element_bytes(precision)
    attention_width = config.n_head * config.head_size  # q, and k and v once repeated to every query head
    norms = [
        Term(term.tensor.replace("norm", "norm_1 and norm_2", 1), term.elements_per_token, term.bytes_per_element, 2)
        for term in _norm_terms(config.n_embd, b, "norm")
    ]
    if config.n_query_groups == config.n_head:  # multi-head: v goes to the kernel as a view of the qkv output
        kv = [
            Term("attention: k after RoPE", config.n_query_groups * config.head_size, b),
            Term(
                "attention: qkv output, kept whole (v is a view of it)",
                (config.n_head + 2 * config.n_query_groups) * config.head_size,
                b,
            ),
        ]
    else:  # grouped-query: litgpt repeats k and v to every query head, new tensors the kernel keeps
        kv = [Term("attention: k and v repeated to every query head", attention_width, b, 2)]
    return [
        *norms,
        Term("attention: q after RoPE", attention_width, b),
        *kv,
        Term("attention: output", attention_width, b),
        Term("attention: log-sum-exp, one per head and token (fp32)", config.n_head, FP32_BYTES),
        Term("attention: output reshaped, the input of proj", attention_width, b),
        Term("MLP: fc_1 and fc_2 outputs", config.intermediate_size, b, 2),
        Term("MLP: silu(fc_1)", config.intermediate_size, b),
        Term("MLP: silu(fc_1) * fc_2, the input of proj", config.intermediate_size, b),
    ]


def head_terms(config: Any, precision: str) -> list[Term]:
    """The final norm, the fp32 logits (Fabric converts the output; litgpt keeps ``logits`` until the next forward) and
    the log-softmax the chunked cross-entropy keeps for backward."""
    vocab = config.padded_vocab_size
    return [
        *_norm_terms(config.n_embd, element_bytes(precision), "final norm"),
        Term("logits, as fp32 (the loop keeps them)", vocab, FP32_BYTES),
        Term("cross-entropy's log-softmax (fp32)", vocab, FP32_BYTES),
    ]


def bytes_per_token_per_layer(config: Any, precision: str) -> int:
    return sum(per_token_bytes(term) for term in block_terms(config, precision))


@dataclass(frozen=True)
class Estimate:
    """``tokens`` = micro batch x sequence length."""

    model: str
    precision: str
    n_layer: int
    tokens: int
    per_token_per_layer_bytes: int
    head_per_token_bytes: int

    @property
    def blocks_bytes(self) -> int:
        return self.per_token_per_layer_bytes * self.n_layer * self.tokens

    @property
    def head_bytes(self) -> int:
        return self.head_per_token_bytes * self.tokens

    @property
    def total_bytes(self) -> int:
        return self.blocks_bytes + self.head_bytes


def estimate(config: Any, precision: str, micro_batch_size: int, seq_len: int) -> Estimate:
    return Estimate(
        model=str(config.name),
        precision=precision,
        n_layer=int(config.n_layer),
        tokens=int(micro_batch_size) * int(seq_len),
        per_token_per_layer_bytes=bytes_per_token_per_layer(config, precision),
        head_per_token_bytes=sum(per_token_bytes(term) for term in head_terms(config, precision)),
    )


def terms_table(config: Any, precision: str):
    import pandas as pd

    rows = [
        {
            "tensor kept for backward": term.tensor,
            "elements per token": term.elements_per_token,
            "bytes each": term.bytes_per_element,
            "count": term.count,
            "bytes per token": per_token_bytes(term),
        }
        for term in block_terms(config, precision)
    ]
    rows.append(
        {
            "tensor kept for backward": f"one {config.name} block, {precision}",
            "elements per token": None,
            "bytes each": None,
            "count": None,
            "bytes per token": bytes_per_token_per_layer(config, precision),
        }
    )
    counts = ("elements per token", "bytes each", "count", "bytes per token")
    return pd.DataFrame(rows).astype(dict.fromkeys(counts, "Int64"))  # whole numbers, the total row blank


def experiment_spec(
    exp_id: str,
    profile: str,
    overrides: Mapping[str, Any] | None = None,
    gpu_memory_gib: float | None = None,
    *,
    device: str | None = None,
):
    """As the run would give it (``predict.planner_inputs``)."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.planner.spec import spec_from_recipe
    from lab_helpers.planning.predict import planner_inputs

    device = device or ("cpu" if profile == "ci" else "cuda")
    inputs = planner_inputs(resolve(exp_id, profile, overrides, check_files=False), gpu_memory_gib, device=device)
    return spec_from_recipe(inputs.pop("recipe"), **inputs)


def compare_with_planner(
    runs: Mapping[str, Mapping[str, Any] | None], *, profile: str, gpu_memory_gib: float | None = None
):
    """Two planner figures: its trace at the forward's end (the moment the hand count describes) and its activation bar
    at the step's peak, often in backward, after the log-softmax is freed."""
    import pandas as pd

    from lab_helpers.planning.planner import predict
    from lab_helpers.planning.planner.tracer import trace

    rows = []
    for exp_id, overrides in runs.items():
        spec = experiment_spec(exp_id, profile, overrides, gpu_memory_gib)
        by_hand = estimate(spec.model_config, spec.precision, spec.micro_batch_size, spec.seq_len)
        forward = max(p.by_category.get("activations", 0) for p in trace(spec).phases if p.kind == "fwd")
        bar = predict(spec).breakdown_gib["activations"]
        rows.append(
            {
                "experiment": exp_id,
                "model": by_hand.model,
                "precision": spec.precision,
                "tokens (micro batch x seq)": by_hand.tokens,
                "layers": by_hand.n_layer,
                "per token per layer (bytes)": by_hand.per_token_per_layer_bytes,
                "blocks by hand (GiB)": by_hand.blocks_bytes / GIB,
                "head by hand (GiB)": by_hand.head_bytes / GIB,
                "by hand (GiB)": by_hand.total_bytes / GIB,
                "planner, end of forward (GiB)": forward / GIB,
                "planner bar, at the peak (GiB)": bar,
            }
        )
    return pd.DataFrame(rows)


def experiment_terms(
    exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None
):
    spec = experiment_spec(exp_id, profile, overrides)
    return terms_table(spec.model_config, spec.precision)


def summary(table) -> str:
    lines = []
    for row in table.to_dict("records"):
        hand, forward, bar = row["by hand (GiB)"], row["planner, end of forward (GiB)"], row["planner bar, at the peak (GiB)"]
        lines.append(
            f"{row['experiment']} ({row['model']}, {row['precision']}): {row['per token per layer (bytes)']:,} B "
            f"x {row['layers']} layers x {row['tokens (micro batch x seq)']:,} tokens = "
            f"{row['blocks by hand (GiB)']:.3g} GiB in the blocks, + {row['head by hand (GiB)']:.3g} GiB of head "
            f"(final norm, fp32 logits, log-softmax) = {hand:.3g} GiB by hand; the planner's forward keeps "
            f"{forward:.3g} GiB ({(hand - forward) / forward:+.1%}), and its bar at the step's peak shows {bar:.3g} GiB."
        )
    return "\n".join(lines)


def misses() -> str:
    return (
        "Where a simple formula misses:\n"
        "* the head: 'bytes per token per layer x layers' leaves out the vocabulary-wide tensors, the logits in "
        "fp32 whatever the training dtype (Fabric converts the output) and the loss's fp32 log-softmax; litgpt's "
        "chunked cross-entropy splits the rows into chunks but keeps every chunk's log-softmax for backward, and the "
        "previous micro-batch's logits stay alive into the next forward (in the peak, not in this count);\n"
        "* attention: a fused kernel (flash / memory-efficient) keeps q, k, v, its output and a log-sum-exp; an "
        "unfused one (softcapping, a math fallback) keeps the T x T scores of every head, which grows with the "
        "square of the sequence length;\n"
        "* the moment: the count is the end of the forward; the bar is the step's peak, usually in backward, when "
        "the log-softmax is freed and the logits' gradient and temporaries have taken its place;\n"
        "* one dtype throughout: bf16-mixed keeps fp32 residuals beside bf16 copies of the matmul inputs."
    )
