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


def quick_warmup_steps(max_steps: int | None) -> int:
    """Warm-up steps of a quick run of ``max_steps``: QUICK_WARMUP_STEPS, but always one step left to time (a run
    already shorter than a quick run keeps its own length, see ``quick_overrides``)."""
    if max_steps is None:
        return QUICK_WARMUP_STEPS
    return max(1, min(QUICK_WARMUP_STEPS, int(max_steps) - 1))


def warmup_steps(max_steps: int | None, *, quick: bool) -> int:
    """Optimizer steps of warm-up, timed apart from ``train_s``, in both launch paths: the first step of a full
    run; ``quick_warmup_steps`` of a quick one."""
    return quick_warmup_steps(max_steps) if quick else 1


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
    exist. A DataLoader ``batch_sampler``: yields lists of dataset indices. With ``world_size`` ranks (the
    Lightning path's DDP, FSDP, DeepSpeed) each rank gets its own share: the ``batch_size x world_size`` longest
    samples are split so that every rank's second step opens with its longest batch at the same iteration, and
    the other batches are dealt out in turn, the same number to each rank (the tail that cannot be shared evenly
    is left out, so that no rank waits in a collective for a batch its peers do not have). With one rank every
    sample appears exactly once.
    """

    def __init__(
        self, lengths: Sequence[int], *, batch_size: int, place_at: int, seed: int = 42, rank: int = 0,
        world_size: int = 1,
    ) -> None:  # fmt: skip
        if batch_size < 1 or place_at < 0:
            raise ValueError(f"batch_size must be >= 1 and place_at >= 0; got {batch_size}, {place_at}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size; got rank {rank} of {world_size}")
        if len(lengths) < batch_size * world_size:
            raise ValueError(
                f"{len(lengths)} samples cannot fill one batch of {batch_size} on each of {world_size} ranks"
            )
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.place_at = place_at
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self._epoch = 0

    def _rest_batches(self) -> int:
        """Batches of the shuffled rest that this rank gets."""
        rest = math.ceil((len(self.lengths) - self.batch_size * self.world_size) / self.batch_size)
        return rest // self.world_size

    def __len__(self) -> int:
        return self._rest_batches() + 1

    def __iter__(self) -> Iterator[list[int]]:
        size, ranks = self.batch_size, self.world_size
        order = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
        longest, rest = order[self.rank * size : (self.rank + 1) * size], order[size * ranks :]
        random.Random(self.seed + self._epoch).shuffle(rest)  # the same order on every rank: the same seed
        self._epoch += 1
        batches = [rest[i : i + size] for i in range(0, len(rest), size)]
        batches = batches[self.rank :: ranks][: self._rest_batches()]
        batches.insert(min(self.place_at, len(batches)), longest)
        yield from batches


def put_longest_batch_in_second_step(data: Any, micro_batch_size: int, accumulation: int) -> None:
    """Quick mode: the data module's training loader puts its longest samples at the start of the second step.

    Used by both launch paths (litgpt's CLI in ``child_litgpt``, the Lightning script in ``distributed.train``).
    The rank and world size are read when the loader is made, after the process group exists (one rank when
    there is none); the Lightning Trainer must then leave the sampler alone (``use_distributed_sampler=False``).
    """
    from torch.utils.data import DataLoader

    original = data.train_dataloader

    def train_dataloader():
        loader = original()
        rank, world_size = _rank_and_world_size()
        lengths = [len(item["input_ids"]) for item in loader.dataset]
        sampler = LongestBatchSecondStepSampler(
            lengths, batch_size=micro_batch_size, place_at=accumulation, rank=rank, world_size=world_size
        )
        if rank == 0:
            print(f"lab: quick mode: the {micro_batch_size} longest samples (up to {max(lengths)} tokens) form "
                  f"micro-batch {accumulation + 1}, the first of the second optimizer step (warm-up, not timed)"
                  + (f", on each of {world_size} ranks" if world_size > 1 else ""), flush=True)  # fmt: skip
        return DataLoader(
            loader.dataset, batch_sampler=sampler, num_workers=loader.num_workers, collate_fn=loader.collate_fn
        )

    data.train_dataloader = train_dataloader


def _rank_and_world_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
