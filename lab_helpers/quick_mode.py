"""Quick mode: run an experiment only as long as it takes to see its true peak memory and a steady step time.

Why: a student's lease is 2-3 hours, and an instructor's dry run or a measuring session wants every experiment
of a section in minutes. Memory and step time stop changing long before a course-length run ends:

* the optimizer states exist from the first optimizer step on, so from the second step every tensor a step
  holds is there;
* activations grow with the batch's padded length, so the peak of a whole epoch is reached at the batch of its
  longest samples -- quick mode puts the longest training samples into the first micro-batch of the second
  optimizer step, where the optimizer states already exist (the worst case of the whole epoch, seen at once);
* the first optimizer step (kernel selection, allocator growth, optimizer state creation) is warm-up, and so is
  the second, the peak step: its first micro-batch is the first of the longest shape, which pays once for
  growing the allocator to the epoch's peak and for new kernel shapes. Measured on an H100 (reference_results/
  h100-80gb.jsonl, the records of 2026-11-22): that micro-batch took 1.8 s in bf16-true and 2.1 s in full-7b
  against 0.1-0.4 s for the others, a third to a half of the timed span. In a full epoch it is paid once in
  hundreds of iterations, so it is warm-up here too; neither step is counted in ``train_s``.

So a quick run takes ``quick_max_steps`` optimizer steps: ``QUICK_WARMUP_STEPS`` of warm-up and enough to time at
least ``MIN_MEASURED_ITERATIONS`` micro-batches. Records say which mode ran (``mode``: ``quick`` or ``full``).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

QUICK_ENV = "LAB_QUICK"
"""``LAB_QUICK=1`` turns quick mode on for every run (the CLI's ``--quick`` and ``quick=True`` do the same)."""

MIN_MEASURED_ITERATIONS = 6
"""Micro-batches timed after warm-up: enough for a median step time that one slow iteration does not move."""

QUICK_WARMUP_STEPS = 2
"""Optimizer steps of warm-up in quick mode: the first and the peak step (the longest batch), see above."""


def quick_from_env() -> bool:
    return os.environ.get(QUICK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def quick_max_steps(accumulation: int) -> int:
    """Optimizer steps of a quick run: QUICK_WARMUP_STEPS of warm-up, then whole steps of at least
    MIN_MEASURED_ITERATIONS micro-batches in all."""
    if accumulation < 1:
        raise ValueError(f"gradient accumulation must be >= 1; got {accumulation}")
    return QUICK_WARMUP_STEPS + math.ceil(MIN_MEASURED_ITERATIONS / accumulation)


def quick_overrides(train: Mapping[str, Any], ranks: int) -> dict[str, Any]:
    """The recipe overrides that make a run quick: fewer steps, a learning-rate warm-up that still fits in them.

    The warm-up of the learning rate changes no tensor's size and no kernel, so shortening it changes neither
    time nor memory; litgpt requires it to be shorter than ``max_steps``.
    """
    accumulation = train["global_batch_size"] // (train["micro_batch_size"] * ranks)
    steps = quick_max_steps(accumulation)
    if train.get("max_steps") is not None and train["max_steps"] <= steps:
        return {}  # already as short as a quick run
    warmup = train.get("lr_warmup_steps") or 1
    return {"train.max_steps": steps, "train.lr_warmup_steps": min(warmup, steps - 1)}


class LongestBatchSecondStepSampler:
    """Batches of a shuffled epoch, except that batch ``place_at`` holds the ``batch_size`` longest samples.

    ``place_at`` is the number of micro-batches in one optimizer step, so the longest batch is the first
    micro-batch of the second step: the epoch's peak activation memory, reached while the optimizer states
    exist. A DataLoader ``batch_sampler``: yields lists of dataset indices; every sample appears exactly once.
    """

    def __init__(self, lengths: Sequence[int], *, batch_size: int, place_at: int, seed: int = 42) -> None:
        if batch_size < 1 or place_at < 0:
            raise ValueError(f"batch_size must be >= 1 and place_at >= 0; got {batch_size}, {place_at}")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.place_at = place_at
        self.seed = seed
        self._epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        order = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
        longest, rest = order[: self.batch_size], order[self.batch_size :]
        random.Random(self.seed + self._epoch).shuffle(rest)
        self._epoch += 1
        batches = [rest[i : i + self.batch_size] for i in range(0, len(rest), self.batch_size)]
        batches.insert(min(self.place_at, len(batches)), longest)
        yield from batches
