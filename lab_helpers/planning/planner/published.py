"""litgpt's published LoRA timings, kept once: ``calibration.QLORA_SPEED_RATIO`` cites them and
``benchmarks/planner_time_published.py`` predicts every row.

Source: Lightning-AI/litgpt ``tutorials/resource-tables.md``, "Finetuning with LoRA on 1 GPU" (commit 0cc02afa;
Lit-GPT commit 8641822, A100-SXM4-40GB, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1; rows unchanged at 26857050).
Settings, from the table and 8641822's ``finetune/lora.py``: bf16-true; Alpaca (2,000 test samples, untruncated);
global batch 128; LoRA r 8, alpha 16, dropout 0.05 on query and value; AdamW, or PagedAdamW with ``--quantize``. An
iteration is one micro-batch; the time per 1,000 is the printed "Training time", which holds the sanity-check
validation before the first step. OOM rows and the ``bnb.nf4-dq`` rows (2-6 % slower than nf4) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

LITGPT_LORA_A100_SOURCE = (
    "Lightning-AI/litgpt tutorials/resource-tables.md, 'Finetuning with LoRA on 1 GPU' (commit 0cc02afa, "
    "2023-10-27; measured with Lit-GPT 8641822 on 1x A100-SXM4-40GB)"
)
LITGPT_LORA_A100_GPU = "NVIDIA A100-SXM4-40GB"
LITGPT_LORA_A100_PRECISION = "bf16-true"
LITGPT_LORA_A100_GLOBAL_BATCH = 128
LITGPT_LORA_A100_LORA = {
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "lora_query": True,
    "lora_key": False,
    "lora_value": True,
    "lora_projection": False,
    "lora_mlp": False,
    "lora_head": False,
}
"""Lit-GPT 8641822's ``finetune/lora.py`` hyperparameters, which the table's runs used as they were."""


@dataclass(frozen=True)
class PublishedLoraRow:
    """``litgpt_name`` for ``Config.from_name``; iterations are micro-batches."""

    model: str
    litgpt_name: str
    quantize: str | None
    micro_batch_size: int
    minutes_per_1k_iterations: float
    trainable_parameters: int  # as published: a check that the LoRA settings are read right

    @property
    def seconds_per_iteration(self) -> float:
        return self.minutes_per_1k_iterations * 60 / 1000


def _rows(model: str, name: str, trainable: int, *rows: tuple[str | None, int, float]) -> list[PublishedLoraRow]:
    return [PublishedLoraRow(model, name, q, mb, minutes, trainable) for q, mb, minutes in rows]


LITGPT_LORA_A100_ROWS: tuple[PublishedLoraRow, ...] = (
    *_rows("phi-1.5", "phi-1_5", 1_572_864, (None, 1, 1.62), ("bnb.nf4", 1, 1.77), (None, 2, 1.65), (None, 4, 1.70)),
    *_rows(
        "StableLM Alpha 3B",
        "stablelm-base-alpha-3b",
        2_097_152,
        (None, 1, 1.24),
        ("bnb.nf4", 1, 1.82),
        (None, 2, 1.33),
        (None, 4, 1.50),
    ),
    *_rows("Llama 2 7B", "Llama-2-7b-hf", 4_194_304, (None, 1, 2.36), ("bnb.nf4", 1, 3.68), (None, 2, 2.52)),
    *_rows("Llama 2 13B", "Llama-2-13b-hf", 6_553_600, (None, 1, 3.19), ("bnb.nf4", 1, 6.38)),
)
"""The table's LoRA rows with a time, on one A100-SXM4-40GB (micro batch 4 of Llama 2 7B and micro batches 2 and 4
of 13B ran out of memory there)."""


def lora_vs_nf4_minutes() -> dict[str, tuple[float, float]]:
    """Per model: (LoRA, QLoRA nf4) minutes per 1,000 iterations at micro batch 1, same model and data."""
    by_model: dict[str, dict[str | None, float]] = {}
    for row in LITGPT_LORA_A100_ROWS:
        if row.micro_batch_size == 1:
            by_model.setdefault(row.model, {})[row.quantize] = row.minutes_per_1k_iterations
    return {model: (times[None], times["bnb.nf4"]) for model, times in by_model.items()}
