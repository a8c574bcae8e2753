"""Quick mode: run an experiment only as long as it takes to see its true peak memory and a steady step time
(a student's lease is 2-3 hours).

From the second optimizer step every tensor a step holds exists, and activations peak at the longest samples, so
the longest samples open the second step: the epoch's worst case, seen at once. That micro-batch also pays once for
growing the allocator and new kernel shapes (on an H100, 1.8-2.1 s against 0.1-0.4 s: reference_results/
h100-80gb.jsonl), so both first steps are warm-up. The Lightning path, whose ranks would have to agree on when to
stop, times a fixed count instead of the stopping rule.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.recipe_defaults import BATCH_ORDERS

QUICK_ENV = "LAB_QUICK"

MIN_MEASURED_ITERATIONS = 6  # the Lightning path's fixed count

STABLE_HALVES_PCT = 10.0
"""The medians of the timed iterations' two halves agree within this share. The differences the lab teaches are 1.5x
and more, and the H100 records' steady iterations stay within 1.6x of their median, so a median that moves less than
10 % no longer changes a conclusion."""

STABLE_PCT_ENV = "LAB_QUICK_STABLE_PCT"

RULE_MIN_ITERATIONS = 8  # 4 per half, so that one odd iteration is not a half's median

RULE_MAX_ITERATIONS = 64  # a run that never settles: under half a minute at the H100's slowest steady 0.4 s

RULE_MAX_TIMED_S = 120.0  # a slow model (13B, one sample per step) whatever its iteration count

QUICK_STOPS: tuple[str, ...] = ("stable", "iteration_cap", "time_cap", "run_end")

QUICK_WARMUP_STEPS = 2

QUICK_SEED = 42


def quick_warmup_steps(max_steps: int | None) -> int:
    """Always one step left to time."""
    if max_steps is None:
        return QUICK_WARMUP_STEPS
    return max(1, min(QUICK_WARMUP_STEPS, int(max_steps) - 1))


def warmup_steps(max_steps: int | None, *, quick: bool) -> int:
    return quick_warmup_steps(max_steps) if quick else 1


def quick_from_env() -> bool:
    """A typo (``LAB_QUICK=2``) must not run the course's full step counts without a word: a paid GPU lease."""
    value = os.environ.get(QUICK_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise LabConfigError(f"{QUICK_ENV}={os.environ[QUICK_ENV]!r}: give 1 for quick mode, or 0 (or leave it unset) "
                         "for the course's full runs")  # fmt: skip


def quick_max_steps(accumulation: int, *, stopping_rule: bool = False) -> int:
    if accumulation < 1:
        raise ValueError(f"gradient accumulation must be >= 1; got {accumulation}")
    timed = RULE_MAX_ITERATIONS if stopping_rule else MIN_MEASURED_ITERATIONS
    return QUICK_WARMUP_STEPS + math.ceil(timed / accumulation)


def stable_halves_pct() -> float:
    text = os.environ.get(STABLE_PCT_ENV, "").strip()
    try:
        value = float(text) if text else STABLE_HALVES_PCT
    except ValueError:
        value = STABLE_HALVES_PCT
    return value if math.isfinite(value) and value > 0 else STABLE_HALVES_PCT


def stop_reason(timed_s: Sequence[float], *, stable_pct: float | None = STABLE_HALVES_PCT) -> str | None:
    """Asked at optimizer-step ends only, so that a run times whole steps. ``stable_pct`` None for micro-batches that
    differ in length by design (length-grouped): only the caps stop them."""
    from lab_helpers.config.iteration_times import iteration_stats

    count = len(timed_s)
    halves_pct = iteration_stats(timed_s)["iter_halves_pct"]
    stable = stable_pct is not None and halves_pct is not None and halves_pct <= stable_pct
    if count >= RULE_MIN_ITERATIONS and stable:
        return "stable"
    if count >= RULE_MAX_ITERATIONS:
        return "iteration_cap"
    if sum(timed_s) >= RULE_MAX_TIMED_S:
        return "time_cap"
    return None


def quick_overrides(train: Mapping[str, Any], ranks: int, *, stopping_rule: bool = False) -> dict[str, Any]:
    """The LR warm-up is shortened because litgpt requires it shorter than ``max_steps``; it changes no tensor or
    kernel, so neither time nor memory."""
    from lab_helpers.config.experiments import (
        gradient_accumulation_steps,  # the one definition; here only when launching
    )

    accumulation = gradient_accumulation_steps({"train": train}, world_size=ranks)
    steps = quick_max_steps(accumulation, stopping_rule=stopping_rule)
    if train.get("max_steps") is not None and train["max_steps"] <= steps:
        return {}  # already as short as a quick run
    warmup = train.get("lr_warmup_steps") or 1
    return {"train.max_steps": steps, "train.lr_warmup_steps": min(warmup, steps - 1)}


class QuickOrderSampler:
    """The shuffle ignores the batch settings, so that compared runs (grad-accum 32/8 against small-batch 8/8) time the
    same samples. With several ranks a round that cannot be shared evenly is left out, so that no rank waits in a
    collective for a batch its peers lack."""

    batch_order = "shuffle"

    def __init__(
        self, lengths: Sequence[int], *, batch_size: int, accumulation: int, seed: int = QUICK_SEED, rank: int = 0,
        world_size: int = 1, warmup: bool = True,
    ) -> None:  # fmt: skip
        if batch_size < 1 or accumulation < 1:
            raise ValueError(f"batch_size and accumulation must be >= 1; got {batch_size}, {accumulation}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size; got rank {rank} of {world_size}")
        if len(lengths) < batch_size * world_size:
            raise ValueError(
                f"{len(lengths)} samples cannot fill one batch of {batch_size} on each of {world_size} ranks"
            )
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.accumulation = accumulation
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.warmup = warmup  # False: no warm-up batches (a full run of another order, ``order_training_batches``)
        self._epoch = 0

    def shuffle(self, epoch: int = 0) -> list[int]:
        order = list(range(len(self.lengths)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    def _share(self, order: Sequence[int], round_: int) -> list[int]:
        size, start = self.batch_size, round_ * self.batch_size * self.world_size + self.rank * self.batch_size
        return [order[(start + j) % len(order)] for j in range(size)]

    def _rounds(self) -> int:
        if self.world_size == 1:
            return math.ceil(len(self.lengths) / self.batch_size)
        return len(self.lengths) // (self.batch_size * self.world_size)

    def warmup_batches(self) -> int:
        return QUICK_WARMUP_STEPS * self.accumulation if self.warmup else 0

    def __len__(self) -> int:
        return self.warmup_batches() + self._rounds()

    def timed_batches(self, epoch: int = 0) -> list[list[int]]:
        """Also what the prediction of its padding reads (``data_lengths.batch_padding``), so that the two cannot
        differ."""
        return self._timed(self.shuffle(epoch))

    def _timed(self, order: Sequence[int]) -> list[list[int]]:
        if self.world_size == 1:  # the last batch of one rank may be short: no sample twice
            return [list(order[k * self.batch_size : (k + 1) * self.batch_size]) for k in range(self._rounds())]
        return [self._share(order, round_) for round_ in range(self._rounds())]

    def _warmup_fill(self, order: Sequence[int], timed: Sequence[list[int]]) -> list[list[int]]:
        return [self._share(order, k) for k in range(self.warmup_batches() - 1)]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, self._epoch = self._epoch, self._epoch + 1
        order = self.shuffle(epoch)
        timed = self._timed(order)
        if epoch == 0 and self.warmup:
            by_length = sorted(range(len(self.lengths)), key=lambda i: (-self.lengths[i], i))
            longest = by_length[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            others = iter(self._warmup_fill(order, timed))
            for index in range(self.warmup_batches()):
                yield longest if index == self.accumulation else next(others)
        yield from timed


MEGA_BATCH_BATCHES = 50
"""As Hugging Face's: sorted only within a mega-batch, a pass still mixes lengths at random at that scale."""


class LengthGroupedSampler(QuickOrderSampler):
    """Micro-batches of samples of similar length, so that litgpt pads less; the micro-batches are then shuffled, so
    that a run does not go from long batches to short ones. Not Hugging Face's: it must keep quick mode's warm-up
    and seeded shuffle, and the planner reads its batches to predict the padding. One rank only: grouping across
    ranks would need every rank's batch of a round to be of one length."""

    batch_order = "length-grouped"

    def __init__(self, lengths: Sequence[int], **kwargs: Any) -> None:
        super().__init__(lengths, **kwargs)
        if self.world_size != 1:
            raise ValueError(f"length-grouped batches are made for one rank; got a world of {self.world_size}")

    def _timed(self, order: Sequence[int]) -> list[list[int]]:
        size = MEGA_BATCH_BATCHES * self.batch_size
        batches: list[list[int]] = []
        for start in range(0, len(order), size):
            mega = sorted(order[start : start + size], key=lambda i: -self.lengths[i])  # stable: ties keep order
            batches += [mega[k : k + self.batch_size] for k in range(0, len(mega), self.batch_size)]
        # the batches' own shuffle: another seeded stream than the samples' (a text seed is hashed by SHA-512,
        # the same on every machine and Python run)
        random.Random(f"{self.seed}:{order[:8]}:batches").shuffle(batches)
        return batches

    def _warmup_fill(self, order: Sequence[int], timed: Sequence[list[int]]) -> list[list[int]]:
        return [timed[k % len(timed)] for k in range(self.warmup_batches() - 1)]


def batch_sampler(lengths: Sequence[int], *, batch_order: str = "shuffle", **kwargs: Any) -> QuickOrderSampler:
    if batch_order not in BATCH_ORDERS:
        raise ValueError(f"batch_order {batch_order!r} is not one of {', '.join(BATCH_ORDERS)}")
    return (LengthGroupedSampler if batch_order == "length-grouped" else QuickOrderSampler)(lengths, **kwargs)


BATCH_ORDER_FLAG = "--batch-order"


def put_longest_batch_in_second_step(
    data: Any, micro_batch_size: int, accumulation: int, *, batch_order: str = "shuffle", warmup: bool = True
) -> None:
    """The rank is read when the loader is made, after the process group exists; the Lightning Trainer must then
    leave the sampler alone (``use_distributed_sampler=False``)."""
    from torch.utils.data import DataLoader

    original = data.train_dataloader

    def train_dataloader():
        loader = original()
        rank, world_size = _rank_and_world_size()
        lengths = [len(item["input_ids"]) for item in loader.dataset]
        sampler = batch_sampler(
            lengths, batch_order=batch_order, batch_size=micro_batch_size, accumulation=accumulation, rank=rank,
            world_size=world_size, warmup=warmup,
        )  # fmt: skip
        if rank == 0 and warmup:
            print(f"lab: quick mode: the {micro_batch_size} longest samples (up to {max(lengths)} tokens) form "
                  f"micro-batch {accumulation + 1}, the first of the second optimizer step (warm-up, not timed)"
                  + (f", on each of {world_size} ranks" if world_size > 1 else ""), flush=True)  # fmt: skip
        if batch_order != "shuffle":
            print(f"lab: {batch_order} batches: {_padding_line(sampler)}", flush=True)
        return DataLoader(
            loader.dataset, batch_sampler=sampler, num_workers=loader.num_workers, collate_fn=loader.collate_fn
        )

    data.train_dataloader = train_dataloader


def _padding_line(sampler: QuickOrderSampler) -> str:
    shuffled = QuickOrderSampler(sampler.lengths, batch_size=sampler.batch_size, accumulation=1, seed=sampler.seed)

    def share(batches: list[list[int]]) -> float:
        padded = sum(len(batch) * max(sampler.lengths[i] for i in batch) for batch in batches)
        return 100 * (padded - sum(sampler.lengths)) / padded

    return (
        f"the shuffle cut into mega-batches of {MEGA_BATCH_BATCHES} x {sampler.batch_size} samples, each sorted by "
        f"length into micro-batches, the micro-batches shuffled; one pass is "
        f"{share(sampler.timed_batches()):.1f}% padding (shuffled: {share(shuffled.timed_batches()):.1f}%)"
    )


def _rank_and_world_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
