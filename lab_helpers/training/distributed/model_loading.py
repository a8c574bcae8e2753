"""Build the litgpt model and load its checkpoint without ever holding two full copies of the weights.

Why not ``GPT(config)`` then ``load_state_dict``: for a 7B or 13B model that random-initialises billions of
parameters only to overwrite them, and holds the weights twice. Here the model is built on the meta device
and the checkpoint, memory-mapped, is assigned in place. Under ZeRO-3 the parameters are already
partitioned when built (``deepspeed.zero.Init``), so each one is gathered, filled by rank 0 and released.
"""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


def param_dtype(precision: str) -> torch.dtype:
    """Weights' dtype for a Lightning precision: bf16/fp16 for the "-true" ones, fp32 otherwise (mixed, 32)."""
    return DTYPES.get(precision, torch.float32)


def load_config(checkpoint_dir: Path):
    from litgpt import Config

    return Config.from_file(Path(checkpoint_dir) / "model_config.yaml")


def mapped_state_dict(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, memory-mapped: nothing is read until a tensor is used.

    Must be called outside ``deepspeed.zero.Init``: that context patches tensor constructors, and the
    tensors ``torch.load`` rebuilds inside it come out wrong (NaN weights).
    """
    state = torch.load(Path(checkpoint_dir) / "lit_model.pth", map_location="cpu", mmap=True, weights_only=True)
    return state.get("model", state)


def load_gpt(checkpoint_dir: Path, *, precision: str, max_seq_length: int | None):
    """The litgpt GPT with the checkpoint's weights, on the CPU in the precision's dtype, rope cache rebuilt."""
    from litgpt.model import GPT

    config = load_config(checkpoint_dir)
    with torch.device("meta"):
        model = GPT(config)
    model.load_state_dict(mapped_state_dict(checkpoint_dir), strict=True, assign=True)
    # the rope cache is a non-persistent buffer: not in the checkpoint, so rebuild it on the CPU
    model.cos, model.sin = model.rope_cache(device=torch.device("cpu"))
    model.max_seq_length = min(max_seq_length or config.block_size, config.block_size)
    model.to(param_dtype(precision))
    leftover = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise RuntimeError(f"checkpoint did not fill {leftover[:5]}")
    return model


def build_gpt_zero3(checkpoint_dir: Path, state: dict[str, torch.Tensor], *, max_seq_length: int | None):
    """The GPT built inside ``deepspeed.zero.Init`` (the caller's context) and filled from ``state``.

    ``state`` comes from :func:`mapped_state_dict`, called before the context. Every rank takes part in
    each gather; only rank 0 reads from the mapped file, so host RAM holds one copy of the weights.
    """
    import deepspeed
    import torch.distributed as dist
    from litgpt.model import GPT

    config = load_config(checkpoint_dir)
    model = GPT(config)
    model.max_seq_length = min(max_seq_length or config.block_size, config.block_size)
    source = state if dist.get_rank() == 0 else None
    for module_name, module in model.named_modules():
        params = list(module.named_parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=0):
            if source is not None:
                for name, param in params:
                    key = f"{module_name}.{name}" if module_name else name
                    param.data.copy_(source[key].to(param.dtype))
    return model
