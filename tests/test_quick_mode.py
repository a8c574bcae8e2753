"""Quick mode's arithmetic and its batch order (the real runs are in test_lab_runs.py)."""

from __future__ import annotations

import pytest

from lab_helpers.quick_mode import (
    MIN_MEASURED_ITERATIONS,
    QUICK_WARMUP_STEPS,
    LongestBatchSecondStepSampler,
    quick_max_steps,
    quick_overrides,
)


@pytest.mark.parametrize("accumulation", [1, 2, 4, 8, 32])
def test_two_warm_up_steps_then_enough_timed_micro_batches(accumulation):
    """The first step and the peak step are warm-up; at least one whole step is timed after them."""
    steps = quick_max_steps(accumulation)
    assert steps >= QUICK_WARMUP_STEPS + 1 == 3
    assert (steps - QUICK_WARMUP_STEPS) * accumulation >= MIN_MEASURED_ITERATIONS
    assert (steps - QUICK_WARMUP_STEPS - 1) * accumulation < MIN_MEASURED_ITERATIONS  # no step more than needed


def test_quick_overrides_shorten_long_runs_and_keep_the_lr_warm_up_inside_them():
    train = {"global_batch_size": 32, "micro_batch_size": 8, "max_steps": 20, "lr_warmup_steps": 10}
    assert quick_overrides(train, ranks=1) == {"train.max_steps": 4, "train.lr_warmup_steps": 3}
    assert quick_overrides({**train, "max_steps": 2}, ranks=1) == {}  # already shorter than a quick run
    assert quick_overrides({**train, "global_batch_size": 8}, ranks=1)["train.max_steps"] == 2 + MIN_MEASURED_ITERATIONS


def test_the_longest_batch_is_the_first_of_the_second_step_and_every_sample_appears_once():
    lengths = [5, 90, 7, 12, 88, 3, 40, 91, 2, 60, 11]
    sampler = LongestBatchSecondStepSampler(lengths, batch_size=2, place_at=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 6
    assert sorted(batches[3]) == [1, 7]  # lengths 90 and 91
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert list(sampler) != batches or len(lengths) < 4  # a new shuffle each epoch, the longest batch in place
    assert sorted(list(sampler)[3]) == [1, 7]


def test_a_short_data_set_still_gets_its_longest_batch():
    batches = list(LongestBatchSecondStepSampler([1, 2, 3], batch_size=2, place_at=8))
    assert batches[-1] == [2, 1]


def test_each_rank_opens_its_second_step_with_its_share_of_the_longest_samples():
    """The Lightning path (DDP, FSDP, DeepSpeed): every rank's iteration ``place_at`` holds its part of the
    ``batch_size x ranks`` longest samples, every rank gets as many batches (no rank waits in a collective for a
    batch its peers lack), and no sample is given to two ranks."""
    lengths = [5, 90, 7, 12, 88, 3, 40, 91, 2, 60, 11, 70, 9, 33]
    samplers = [
        LongestBatchSecondStepSampler(lengths, batch_size=2, place_at=1, rank=rank, world_size=2) for rank in (0, 1)
    ]
    per_rank = [list(sampler) for sampler in samplers]
    assert [len(batches) for batches in per_rank] == [len(s) for s in samplers] == [3, 3]
    assert sorted(per_rank[0][1] + per_rank[1][1]) == [1, 4, 7, 11]  # lengths 90, 88, 91, 70
    given = [i for batches in per_rank for batch in batches for i in batch]
    assert len(given) == len(set(given)) == 12  # the 4 longest + 2 of the 5 other batches each; 1 left out
    single = LongestBatchSecondStepSampler(lengths, batch_size=2, place_at=1)
    assert len(list(single)) == len(single) == 7  # one rank: every sample once


def test_bad_rank_or_too_few_samples_are_one_line_errors():
    with pytest.raises(ValueError, match="rank 2 of 2"):
        LongestBatchSecondStepSampler([1, 2, 3, 4], batch_size=1, place_at=1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="3 samples cannot fill one batch of 2 on each of 2 ranks"):
        LongestBatchSecondStepSampler([1, 2, 3], batch_size=2, place_at=1, world_size=2)


def test_a_run_shorter_than_a_quick_run_keeps_one_step_to_time():
    from lab_helpers.quick_mode import quick_warmup_steps

    assert quick_warmup_steps(None) == quick_warmup_steps(20) == QUICK_WARMUP_STEPS == 2
    assert quick_warmup_steps(2) == 1 and quick_warmup_steps(1) == 1  # a 1-step run: the clock times it whole
