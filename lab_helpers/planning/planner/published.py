"""litgpt's published LoRA timings: the rows of one public table, kept once.

The time model cites them (``timing.QLORA_SPEED_RATIO``: QLoRA's time against LoRA's on the same model) and
``benchmarks/planner_time_published.py`` predicts every row from its settings.

Source: Lightning-AI/litgpt ``tutorials/resource-tables.md``, section "Finetuning with LoRA on 1 GPU", added in
commit 0cc02afa (2023-10-27; the file says "Last updated: 10/20/2023", "Lit-GPT version: commit 8641822",
NVIDIA A100-SXM4-40GB, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1); the rows are unchanged at litgpt's commit
26857050 (2026-06-29). What the table's text and Lit-GPT 8641822's ``finetune/lora.py`` say about the settings:
``--precision bf16-true``; Alpaca (``scripts/prepare_alpaca.py``: alpaca_data_cleaned_archive.json, 2,000 test
samples, each sample the prompt, response and EOS, no truncation); a "minibatch" (global batch) of 128; LoRA r 8,
alpha 16, dropout 0.05 on the query and value projections only (the table's trainable parameters are exactly
that); AdamW, or bitsandbytes' PagedAdamW with ``--quantize``. An iteration is one micro-batch (the first one
forced to the longest sample); the time of 1,000 reads as what the script prints as "Training time", which also
holds its sanity-check validation (100 forward passes and a 100-token sample) before the first step. Rows the
table gives as OOM are not kept, nor the ``bnb.nf4-dq`` rows (2-6 % slower than their nf4 rows).
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
    """One row: the model as the table names it, litgpt's name for it (``Config.from_name``), ``--quantize``,
    the micro batch and the published minutes per 1,000 iterations (micro-batches)."""

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
