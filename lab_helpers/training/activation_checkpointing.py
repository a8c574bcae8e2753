"""Activation checkpointing per transformer block on one device (the ``act-ckpt`` experiment).

litgpt 0.5.13 has this only on its FSDP path (``activation_checkpointing_policy={Block}``), so the lab wraps each
``Block`` itself, as the planner's tracer does (``planner/tracer.py``), so that the prediction follows what runs.
"""

from __future__ import annotations

from typing import Any

FLAG = "--activation-checkpointing"


def checkpoint_blocks(model: Any) -> int:
    from torch.utils.checkpoint import checkpoint

    gpt = getattr(model, "module", model)
    blocks = getattr(getattr(gpt, "transformer", None), "h", None)
    if blocks is None:
        raise ValueError(f"activation checkpointing needs a litgpt GPT (with transformer.h); got {type(gpt).__name__}")
    for block in blocks:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            # non-reentrant: works with keyword arguments and under autocast; no RNG state to restore (litgpt's
            # blocks have no dropout in the lab's models)
            return checkpoint(_inner, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

        block.forward = forward
    return len(blocks)
