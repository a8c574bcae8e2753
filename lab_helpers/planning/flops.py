"""FLOPs of one training step, counted on the real litgpt model, and the MFU they give.

Why count rather than use 6 x params x tokens: the lab compares full fine-tuning with LoRA, and the rule of
thumb is wrong for LoRA. Its frozen weights get no weight gradients, so the backward pass is about one forward
instead of two and a LoRA step costs about 2/3 of a full step. Counting the model litgpt actually trains (the
same ``GPT`` or ``litgpt.lora.GPT`` with the same trainable parameters) gets this right, and also counts the
attention matmuls and the LM head that the rule of thumb ignores.

The model is built on the ``meta`` device: shapes without storage, so a 13B model costs no memory and a
step is counted in about a second. Results are memoised by their arguments.
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from lab_helpers.config.experiments import METHODS
from lab_helpers.config.recipe_defaults import LORA_LAYER_KEYS, lora_defaults
from lab_helpers.hardware.gpu_peaks import dense_peak_flops

if TYPE_CHECKING:
    import litgpt

LORA_LAYERS = tuple(key.removeprefix("lora_") for key in LORA_LAYER_KEYS)  # query, key, value, ... head


def train_flops_per_step(
    config: litgpt.Config | str,
    *,
    method: str,
    lora: dict[str, Any] | None = None,
    micro_batch_size: int,
    seq_len: int,
) -> float:
    """QLoRA counts as LoRA: its 4-bit weights are dequantised, then multiplied like LoRA's frozen ones, and
    dequantising is not model arithmetic. A ``lora`` setting left out is litgpt's default, as in a run whose recipe
    leaves it out. Counted are the matmuls (as ``torch.utils.flop_counter`` counts them), no element-wise work and no
    recomputation: model FLOPs, the numerator of MFU."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if micro_batch_size < 1 or seq_len < 1:
        raise ValueError(f"micro_batch_size and seq_len must be >= 1; got {micro_batch_size}, {seq_len}")
    config_json = _config_json(config)
    lora_key = _lora_key(lora) if method != "full" else ()
    # counted for one sample and multiplied: every matmul of a step (forward, both gradients, attention, the head)
    # is linear in the micro batch, so this is exact (tests/test_flops.py), and a micro batch search counts once
    return int(micro_batch_size) * _count(config_json, method != "full", lora_key, 1, int(seq_len))


def mfu(
    *,
    flops_per_step: float,
    steps: int,
    train_s: float,
    gpu_name: str | None,
    precision: str,
) -> float | None:
    """Model FLOPs utilisation of one GPU: (flops_per_step x steps / train_s) / the GPU's dense peak.

    ``steps`` counts the micro-batches this rank ran (every forward + backward, including gradient
    accumulation steps); ``train_s`` is the time inside the training loop. None on a CPU (no ``gpu_name``) or
    for a GPU/precision the lab's peak table does not know: an MFU against a guessed peak would mislead.
    """
    if not isinstance(flops_per_step, (int, float)) or not math.isfinite(flops_per_step) or flops_per_step <= 0:
        raise ValueError(f"flops_per_step must be a positive number; got {flops_per_step!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ValueError(f"steps must be a positive int; got {steps!r}")
    if not isinstance(train_s, (int, float)) or not math.isfinite(train_s) or train_s <= 0:
        raise ValueError(f"train_s must be a positive number of seconds; got {train_s!r}")
    if not gpu_name:
        return None
    peak = dense_peak_flops(gpu_name, precision)
    if peak is None:
        return None
    return flops_per_step * steps / train_s / peak


# ------------------------------------------------------------------------------------------------ counting


def _config_json(config: Any) -> str:
    """A hashable, order-independent key for a litgpt Config (or a model name)."""
    if isinstance(config, str):
        import litgpt

        config = litgpt.Config.from_name(config)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if not f.name.startswith("lora_")}
    fields.pop("hf_config", None)  # provenance only; does not change the model
    return json.dumps(fields, sort_keys=True, default=str)


def _lora_key(lora: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    given = {str(k).removeprefix("lora_"): v for k, v in (lora or {}).items()}
    unknown = set(given) - {"r", "alpha", "dropout", *LORA_LAYERS}
    if unknown:
        raise ValueError(f"unknown LoRA settings {sorted(unknown)}; use r, alpha and {', '.join(LORA_LAYERS)}")
    defaults = {key.removeprefix("lora_"): value for key, value in lora_defaults().items() if key != "lora_dropout"}
    merged = {**defaults, **{k: v for k, v in given.items() if k != "dropout"}}
    if int(merged["r"]) < 1:
        raise ValueError(f"LoRA r must be >= 1; got {merged['r']!r}")
    if not any(merged[layer] for layer in LORA_LAYERS):
        raise ValueError("LoRA needs at least one layer with adapters (query/key/value/projection/mlp/head)")
    return tuple(sorted((k, int(v) if k in ("r", "alpha") else bool(v)) for k, v in merged.items()))


@lru_cache(maxsize=256)
def _count(config_json: str, use_lora: bool, lora_key: tuple, micro_batch_size: int, seq_len: int) -> float:
    import torch
    from litgpt.utils import chunked_cross_entropy
    from torch.utils.flop_counter import FlopCounterMode

    fields = json.loads(config_json)
    if use_lora:
        from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

        lora = dict(lora_key)
        fields.update({"lora_r": lora["r"], "lora_alpha": lora["alpha"]})
        fields.update({f"lora_{layer}": lora[layer] for layer in LORA_LAYERS})
    else:
        from litgpt import GPT, Config

    config = Config(**_known_fields(Config, fields))
    if seq_len > config.block_size:
        raise ValueError(f"seq_len {seq_len} is longer than the model's block_size {config.block_size}")
    with torch.device("meta"):
        model = GPT(config)
        model.max_seq_length = seq_len
        if use_lora:
            mark_only_lora_as_trainable(model)
        input_ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids)
        # as litgpt's finetune scripts: predict token t+1 from tokens <= t
        loss = chunked_cross_entropy(logits[..., :-1, :], input_ids[..., 1:])
        loss.backward()
    return float(counter.get_total_flops())


def _known_fields(cls: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """Keep the fields ``cls`` takes in ``__init__`` (derived fields such as ``rope_n_elem`` are recomputed)."""
    init_names = {f.name for f in dataclasses.fields(cls) if f.init}
    return {k: v for k, v in fields.items() if k in init_names}
