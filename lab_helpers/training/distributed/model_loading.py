"""Build the litgpt model and load its checkpoint without ever holding two full copies of the weights.

``GPT(config)`` then ``load_state_dict`` would random-initialise billions of parameters only to overwrite them.
"""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


def param_dtype(precision: str) -> torch.dtype:
    return DTYPES.get(precision, torch.float32)


def load_config(checkpoint_dir: Path):
    from litgpt import Config

    return Config.from_file(Path(checkpoint_dir) / "model_config.yaml")


def mapped_state_dict(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """Outside ``deepspeed.zero.Init``: it patches tensor constructors, and ``torch.load`` inside it gives NaN weights."""
    state = torch.load(Path(checkpoint_dir) / "lit_model.pth", map_location="cpu", mmap=True, weights_only=True)
    return state.get("model", state)


def load_gpt(checkpoint_dir: Path, *, precision: str, max_seq_length: int | None):
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
    """Only rank 0 reads from the mapped file, so host RAM holds one copy of the weights."""
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
