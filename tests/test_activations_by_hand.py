"""The activation count by hand (lab_helpers.planning.activations_by_hand, notebook 01) against the planner's trace of the
same litgpt code: one block's saved tensors per token, and a whole forward for the ci stand-ins of small-batch
and full-7b.

Tolerance: 0.5 %. The hand count leaves out RoPE's cos/sin (per position, not per token: a few bytes per token)
and the allocator's rounding to 512 bytes, and counts every token of the sequence where the loss drops the last.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from lab_helpers.planning import activations_by_hand as by_hand
from lab_helpers.planning.planner.tracer import trace_training

TOLERANCE = 0.005


def _forward_activations(spec, n_layer: int) -> int:
    """The planner's activations at the end of the first forward, for the model cut to ``n_layer`` blocks."""
    phases = trace_training(spec, n_layer=n_layer).phases
    return max(p.by_category["activations"] for p in phases if p.kind == "fwd")


def _traced_bytes_per_token_per_layer(spec) -> float:
    """One block's share, traced: the activations of a two-block model less a one-block model's, per token."""
    tokens = spec.micro_batch_size * spec.seq_len
    return (_forward_activations(spec, 2) - _forward_activations(spec, 1)) / tokens


@pytest.fixture(scope="module")
def full_7b_spec():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)
    return by_hand.experiment_spec("full-7b", "ci")


@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_one_block_by_hand_is_what_the_planner_traces(full_7b_spec, precision):
    """ci-llama-m has grouped-query attention (4 K/V groups for 8 heads): k and v are repeated copies."""
    spec = dataclasses.replace(full_7b_spec, precision=precision)
    config = spec.model_config
    assert config.n_query_groups < config.n_head
    counted = by_hand.bytes_per_token_per_layer(config, precision)
    assert counted == pytest.approx(_traced_bytes_per_token_per_layer(spec), rel=TOLERANCE)
    # the arithmetic itself, written out once: 2 norms x (fp32 x, 1/rms, fp32 normalised x, output) + attention
    # (q, repeated k and v, output, fp32 log-sum-exp, proj input) + MLP (fc_1, fc_2, silu, product)
    b, h, f, heads = (4 if precision == "32-true" else 2), config.n_embd, config.intermediate_size, config.n_head
    assert counted == 2 * (4 * h + 4 + 4 * h + b * h) + 5 * b * h + 4 * heads + 4 * b * f


def test_multi_head_attention_keeps_the_qkv_output(full_7b_spec):
    """Where every head has its own K/V (open_llama), v reaches the kernel as a view of the qkv output, which
    stays alive whole: the count changes, and still agrees with the trace."""
    spec = dataclasses.replace(full_7b_spec, model_config=copy.deepcopy(full_7b_spec.model_config))
    spec.model_config.n_query_groups = spec.model_config.n_head
    counted = by_hand.bytes_per_token_per_layer(spec.model_config, spec.precision)
    assert counted > by_hand.bytes_per_token_per_layer(full_7b_spec.model_config, spec.precision)
    assert counted == pytest.approx(_traced_bytes_per_token_per_layer(spec), rel=TOLERANCE)


@pytest.mark.slow  # traces and predicts the ci small-batch and full-7b: ~20 s on 2 cores
def test_a_whole_forward_by_hand_against_the_planner(full_7b_spec):
    table = by_hand.compare_with_planner({"small-batch": None, "full-7b": None}, profile="ci")
    for row in table.to_dict("records"):
        assert row["by hand (GiB)"] == pytest.approx(row["planner, end of forward (GiB)"], rel=TOLERANCE), row
        # the bar is taken at the step's peak, in backward: the loss's log-softmax is gone by then
        assert row["planner bar, at the peak (GiB)"] < row["planner, end of forward (GiB)"], row
    assert set(table["experiment"]) == {"small-batch", "full-7b"}


def test_mixed_precision_is_refused_with_the_reason(full_7b_spec):
    with pytest.raises(ValueError, match="mixed precision keeps fp32"):
        by_hand.bytes_per_token_per_layer(full_7b_spec.model_config, "bf16-mixed")
    table = by_hand.terms_table(full_7b_spec.model_config, "bf16-true")
    assert table["bytes per token"].iloc[-1] == table["bytes per token"].iloc[:-1].sum()
