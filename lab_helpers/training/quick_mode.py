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

How many micro-batches are timed after warm-up is a stated rule (``stop_reason``), checked by the litgpt child at
every optimizer step's end: stop once at least ``RULE_MIN_ITERATIONS`` are timed and the medians of the first and
the second half of them agree within ``STABLE_HALVES_PCT`` (10 %) of the whole median (``stable``); never time
more than ``RULE_MAX_ITERATIONS`` (``iteration_cap``) or ``RULE_MAX_TIMED_S`` seconds of them (``time_cap``), so
that a noisy run cannot burn a lease; a run whose own steps or data end first says ``run_end``. Records say
which ended it (``quick_stop``, with ``quick_stop_halves_pct``). The Lightning path (``lab_helpers.training.distributed``,
several ranks that would have to agree on when to stop) times a fixed ``MIN_MEASURED_ITERATIONS``.

Experiments that are compared time the same samples in the same order (``QuickOrderSampler``): the timed part of
every quick run is one fixed shuffle of the data set, cut into micro-batches of the run's size, so grad-accum
(32/8) and small-batch (8/8), or bf16-true and 32-true, time the same samples whatever their batch settings.
Records say which mode ran (``mode``: ``quick`` or ``full``).

An experiment may ask for another order of the same samples (``options: {batch_order: length-grouped}``, the
``length-grouped`` experiment): ``LengthGroupedSampler`` batches samples of similar length, so that litgpt, which
pads every micro-batch to its longest sample, pads less. Its micro-batches differ in length by design, so the
stopping rule's ``stable`` (a steady micro-batch time) does not apply to it: it times until the rule's caps or
the end of the run. Records say which order ran (``batch_order``).
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
"""``LAB_QUICK=1`` turns quick mode on for every run (the CLI's ``--quick`` and ``quick=True`` do the same)."""

MIN_MEASURED_ITERATIONS = 6
"""Micro-batches a quick run without the stopping rule times after warm-up (the Lightning path): a fixed count."""

STABLE_HALVES_PCT = 10.0
"""The stopping rule's agreement: the medians of the first and the second half of the timed iterations within this
share of their whole median (``iteration_times.iteration_stats``' ``iter_halves_pct``). Why 10 %: the differences
the lab teaches (bf16 against fp32, LoRA against full, a bigger micro batch) are 1.5x and more, and the H100
records' steady iterations stay within 1.6x of their median, so a median that moves less than 10 % between
halves no longer changes a conclusion."""

STABLE_PCT_ENV = "LAB_QUICK_STABLE_PCT"
"""``LAB_QUICK_STABLE_PCT=5`` asks the rule for a stricter agreement (records say which rule ended a run and the
figure it judged); the tests set a loose one to see the real loop end where the rule says."""

RULE_MIN_ITERATIONS = 8
"""The rule never stops before this many timed micro-batches: 4 per half, so one odd iteration is not a half's
median."""

RULE_MAX_ITERATIONS = 64
"""The rule's cap on timed micro-batches: a run that never settles stops here (``iteration_cap``). On the H100
records' slowest steady iteration (0.4 s) that is under half a minute."""

RULE_MAX_TIMED_S = 120.0
"""The rule's cap on timed seconds (``time_cap``): a slow model (13B, one sample per step) stops within two minutes
of timing whatever its iteration count."""

QUICK_STOPS: tuple[str, ...] = ("stable", "iteration_cap", "time_cap", "run_end")
"""What ended a quick run's timing (a record's ``quick_stop``); ``run_end``: the recipe's own steps or its data
ended before the rule did."""

QUICK_WARMUP_STEPS = 2
"""Optimizer steps of warm-up in quick mode: the first and the peak step (the longest batch), see above."""

QUICK_SEED = 42
"""The seed of quick mode's fixed shuffle (``QuickOrderSampler``), and of the length-grouped order's."""


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
    """``$LAB_QUICK``: 1/true/yes/on, or 0/false/no/off (unset: off). Anything else is a LabConfigError: a typo
    (``LAB_QUICK=2``, ``y``) ran the course's full step counts without a word, minutes of a paid GPU lease."""
    value = os.environ.get(QUICK_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise LabConfigError(f"{QUICK_ENV}={os.environ[QUICK_ENV]!r}: give 1 for quick mode, or 0 (or leave it unset) "
                         "for the course's full runs")  # fmt: skip


def quick_max_steps(accumulation: int, *, stopping_rule: bool = False) -> int:
    """Optimizer steps of a quick run: QUICK_WARMUP_STEPS of warm-up, then whole steps of at least
    MIN_MEASURED_ITERATIONS micro-batches in all; with the stopping rule, whole steps up to its cap
    (RULE_MAX_ITERATIONS: the rule usually ends the run long before)."""
    if accumulation < 1:
        raise ValueError(f"gradient accumulation must be >= 1; got {accumulation}")
    timed = RULE_MAX_ITERATIONS if stopping_rule else MIN_MEASURED_ITERATIONS
    return QUICK_WARMUP_STEPS + math.ceil(timed / accumulation)


def stable_halves_pct() -> float:
    """The rule's agreement: ``$LAB_QUICK_STABLE_PCT`` where set (a number > 0), else STABLE_HALVES_PCT."""
    text = os.environ.get(STABLE_PCT_ENV, "").strip()
    try:
        value = float(text) if text else STABLE_HALVES_PCT
    except ValueError:
        value = STABLE_HALVES_PCT
    return value if math.isfinite(value) and value > 0 else STABLE_HALVES_PCT


def stop_reason(timed_s: Sequence[float], *, stable_pct: float | None = STABLE_HALVES_PCT) -> str | None:
    """The stopping rule on the iteration times timed so far (seconds, in order; warm-up and profiled ones left
    out): ``stable``, ``iteration_cap``, ``time_cap``, or None to keep timing. Asked at optimizer-step ends only,
    so that a run times whole steps (every step's last micro-batch carries the optimizer step). ``stable_pct``
    None: never ``stable`` (a length-grouped run, whose micro-batches differ in length by design: only the caps
    or the run's end stop it)."""
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
    """The recipe overrides that make a run quick: fewer steps, a learning-rate warm-up that still fits in them.
    ``stopping_rule``: the training process stops by ``stop_reason`` (the litgpt child), so ``max_steps`` is the
    rule's cap.

    The warm-up of the learning rate changes no tensor's size and no kernel, so shortening it changes neither
    time nor memory; litgpt requires it to be shorter than ``max_steps``.
    """
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
    """A quick run's batches: two optimizer steps of warm-up, the second opened by the longest samples, then one
    fixed shuffle of the data set that does not depend on the batch settings.

    A DataLoader ``batch_sampler`` (yields lists of dataset indices). The first pass is

    * warm-up, ``QUICK_WARMUP_STEPS x accumulation`` batches: batch ``accumulation`` (the first micro-batch of the
      second step) holds the ``batch_size`` longest samples, the epoch's peak activation memory reached while the
      optimizer states exist; the others are taken from the start of the shuffle (they are not timed);
    * the timed part: the shuffle (``seed``) from its start, cut into batches of ``batch_size``, every sample once.

    Why the shuffle ignores the batch: quick runs are compared with each other (grad-accum 32/8 against
    small-batch 8/8, bf16-true against 32-true). When the longest batch was cut out of the shuffle and the rest
    dealt after it, which samples a run timed depended on its micro batch and accumulation, and so did the time
    of a micro-batch (it is padded to its longest sample). Now every quick run times the same sequence of samples;
    runs with the same micro batch time the same batches. Later passes (a run of several epochs) are the shuffle
    of ``seed + epoch``, without warm-up batches; ``__len__`` is the first pass's.

    With ``world_size`` ranks (the Lightning path's DDP, FSDP, DeepSpeed) the shuffle is dealt in rounds of
    ``batch_size x world_size`` samples, rank ``r`` taking the ``r``-th share of each round, and rank ``r``'s
    longest batch is the ``r``-th share of the ``batch_size x world_size`` longest samples: every rank opens its
    second step with its longest batch at the same iteration and gets as many batches as its peers (a round that
    cannot be shared evenly is left out, so no rank waits in a collective for a batch its peers lack).
    """

    batch_order = "shuffle"
    """What a record's ``batch_order`` says for a run ordered by this sampler."""

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
        """Every sample index once, in the order the timed part of pass ``epoch`` takes them: the batch settings
        play no part in it."""
        order = list(range(len(self.lengths)))
        random.Random(self.seed + epoch).shuffle(order)
        return order

    def _share(self, order: Sequence[int], round_: int) -> list[int]:
        """This rank's batch of round ``round_`` of ``order`` (rounds wrap around: warm-up may reuse samples)."""
        size, start = self.batch_size, round_ * self.batch_size * self.world_size + self.rank * self.batch_size
        return [order[(start + j) % len(order)] for j in range(size)]

    def _rounds(self) -> int:
        """Timed batches per pass on each rank: every sample once on one rank (the last batch may be short)."""
        if self.world_size == 1:
            return math.ceil(len(self.lengths) / self.batch_size)
        return len(self.lengths) // (self.batch_size * self.world_size)

    def warmup_batches(self) -> int:
        return QUICK_WARMUP_STEPS * self.accumulation if self.warmup else 0

    def __len__(self) -> int:
        return self.warmup_batches() + self._rounds()

    def timed_batches(self, epoch: int = 0) -> list[list[int]]:
        """This rank's batches of pass ``epoch`` after its warm-up batches, in order: what a run times, and what a
        prediction of its padding reads (``data_lengths.batch_padding``), so that the two cannot differ."""
        return self._timed(self.shuffle(epoch))

    def _timed(self, order: Sequence[int]) -> list[list[int]]:
        if self.world_size == 1:  # the last batch of one rank may be short: no sample twice
            return [list(order[k * self.batch_size : (k + 1) * self.batch_size]) for k in range(self._rounds())]
        return [self._share(order, round_) for round_ in range(self._rounds())]

    def _warmup_fill(self, order: Sequence[int], timed: Sequence[list[int]]) -> list[list[int]]:
        """The warm-up batches other than the longest one: from the start of the shuffle (not timed)."""
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
"""Micro-batches per mega-batch of ``LengthGroupedSampler`` (Hugging Face's ``LengthGroupedSampler`` uses 50 too):
samples are sorted by length only within a mega-batch, so that a pass still mixes lengths at random at that scale
and the grouping needs no sort of the whole data set."""


class LengthGroupedSampler(QuickOrderSampler):
    """Micro-batches of samples of similar length: the same shuffle as ``QuickOrderSampler`` (every sample once per
    pass), cut into mega-batches of ``MEGA_BATCH_BATCHES x batch_size`` samples, each sorted by length (longest
    first; ties keep the shuffle's order) and cut into micro-batches, and then the micro-batches of the pass shuffled
    (seeded), so that a run does not go from long batches to short ones. Deterministic: the seed and the lengths
    give the batches. Quick mode's warm-up rule is kept: the ``batch_size`` longest samples open the second
    optimizer step (the other warm-up batches are the pass's first grouped ones, not timed).

    Why litgpt pads less: it pads each micro-batch to its longest sample, and samples of similar length leave
    little room. The peak memory is the longest batch's, which both orders hold (quick mode puts it in warm-up).

    Why home-made and not a library's (Hugging Face ``transformers``' ``LengthGroupedSampler``, ``group_by_length``):
    it must keep quick mode's warm-up rule and the lab's seeded shuffle, and the planner reads its batches
    (``timed_batches``) to predict the padding, which a sampler inside another package's Trainer cannot give.

    One rank only: the Lightning path deals one shuffle to its ranks in rounds (``QuickOrderSampler``), and grouping
    there would need every rank's batch of a round to be of one length; the lab refuses it there
    (``experiments.check_batch_order``).
    """

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
    """The sampler of ``batch_order`` (``recipe_defaults.BATCH_ORDERS``): ``QuickOrderSampler`` for ``shuffle``,
    ``LengthGroupedSampler`` for ``length-grouped``; ``kwargs`` are the samplers' own."""
    if batch_order not in BATCH_ORDERS:
        raise ValueError(f"batch_order {batch_order!r} is not one of {', '.join(BATCH_ORDERS)}")
    return (LengthGroupedSampler if batch_order == "length-grouped" else QuickOrderSampler)(lengths, **kwargs)


BATCH_ORDER_FLAG = "--batch-order"
"""The litgpt child's switch for an order other than ``shuffle`` (the lab's, not litgpt's: removed from the arguments
before litgpt's CLI reads them)."""


def put_longest_batch_in_second_step(
    data: Any, micro_batch_size: int, accumulation: int, *, batch_order: str = "shuffle", warmup: bool = True
) -> None:
    """Quick mode: the data module's training loader puts its longest samples at the start of the second step,
    and times one shuffle that ignores the batch settings (``QuickOrderSampler``); with ``batch_order``
    ``length-grouped``, the same shuffle in micro-batches of similar length (``LengthGroupedSampler``).
    ``warmup=False`` (a full run of the grouped order): no warm-up batches, only the grouped passes.

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
    """One pass's padding in ``sampler``'s order beside the shuffled order's, for the run's log."""
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
