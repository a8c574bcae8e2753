"""Training micro-batches padded further than litgpt pads them (the ``pad-64`` and ``compile-static`` experiments).

litgpt pads each micro-batch to its longest sample, and every new length costs a plan build (cuDNN attention) or a
recompile; padding to a multiple bounds the lengths, at the price of padded tokens the record counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lab_helpers.config.recipe_defaults import PAD_TO_MAX, padded_length

FLAG = "--pad-multiple"


def parse_pad(text: str) -> int | str:
    if text == PAD_TO_MAX:
        return PAD_TO_MAX
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{FLAG} {text!r}: expected a whole number of tokens >= 1 or {PAD_TO_MAX!r}")
    return int(text)


class PaddedCollate:
    def __init__(self, collate: Callable, pad_multiple: int | str, limit: int) -> None:
        self.collate = collate
        self.pad_multiple = pad_multiple
        self.limit = limit
        keywords = getattr(collate, "keywords", {})  # litgpt's collate is a functools.partial of _sft_collate_fn
        self.pad_values = {"input_ids": keywords.get("pad_id", 0), "labels": keywords.get("ignore_index", -100)}

    def __call__(self, samples: list[Mapping[str, Any]]) -> dict[str, Any]:
        import torch.nn.functional as F

        batch = self.collate(samples)
        length = batch["input_ids"].shape[-1]
        extra = padded_length(length, self.pad_multiple, self.limit) - length
        if extra > 0:
            for key, value in self.pad_values.items():
                batch[key] = F.pad(batch[key], (0, extra), value=value)
        return batch


def pad_train_batches(data: Any, pad_multiple: int | str) -> None:
    """The limit is the longest training sample: litgpt sets its model's ``max_seq_length`` to it."""
    original = data.train_dataloader

    def train_dataloader():
        loader = original()
        limit = max(len(item["input_ids"]) for item in loader.dataset)
        loader.collate_fn = PaddedCollate(loader.collate_fn, pad_multiple, limit)
        how = "to one length" if pad_multiple == PAD_TO_MAX else f"to a multiple of {pad_multiple} tokens"
        print(f"lab: each training micro-batch padded {how}, up to {limit} (the longest sample)", flush=True)
        return loader

    data.train_dataloader = train_dataloader
