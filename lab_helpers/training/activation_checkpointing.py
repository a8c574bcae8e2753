"""Activation checkpointing per transformer block on one device: what the ``act-ckpt`` experiment switches on.

Why the lab does it itself: litgpt 0.5.13's ``finetune_full`` has no activation-checkpointing flag on a single
device (only its multi-device FSDP path passes ``activation_checkpointing_policy={Block}``), and Lightning's
``activation_checkpointing_policy`` belongs to FSDP too. On one device the same idea is one wrap per ``Block``:
``torch.utils.checkpoint`` (non-reentrant) runs the block's forward keeping only its inputs, and in backward
runs that forward again to rebuild the activations it needs -- about one more forward pass per step, for
activations that shrink from every block's intermediates to one block's plus each block's input.

The planner's tracer applies the same non-reentrant ``checkpoint`` per block (``planner/tracer.py``); its
saved-tensor hooks run under fake tensors exactly as on a real device, so the prediction follows what runs.
The training process (``child_litgpt --activation-checkpointing``) calls :func:`checkpoint_blocks` on the
model litgpt built, right before litgpt's own ``fit``.
"""

from __future__ import annotations

from typing import Any

FLAG = "--activation-checkpointing"
"""The ``child_litgpt`` command-line switch (stripped before litgpt's CLI sees the arguments)."""


def checkpoint_blocks(model: Any) -> int:
    """Wrap every transformer block's forward in ``torch.utils.checkpoint``; returns how many were wrapped.

    ``model`` is a litgpt ``GPT`` or Fabric's wrapper around one (``.module`` is the GPT). Raises ValueError
    for a model without ``transformer.h`` (not a litgpt GPT), so a wrong model fails loudly instead of
    silently training without checkpointing.
    """
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
