"""Quick mode's arithmetic and its batch order (the real runs are in test_lab_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_helpers.training.quick_mode import (
    MIN_MEASURED_ITERATIONS,
    QUICK_WARMUP_STEPS,
    RULE_MAX_ITERATIONS,
    RULE_MAX_TIMED_S,
    RULE_MIN_ITERATIONS,
    STABLE_HALVES_PCT,
    QuickOrderSampler,
    quick_max_steps,
    quick_overrides,
    stop_reason,
)


@pytest.mark.parametrize("accumulation", [1, 2, 4, 8, 32])
def test_two_warm_up_steps_then_enough_timed_micro_batches(accumulation):
    """The first step and the peak step are warm-up; at least one whole step is timed after them."""
    steps = quick_max_steps(accumulation)
    assert steps >= QUICK_WARMUP_STEPS + 1 == 3
    assert (steps - QUICK_WARMUP_STEPS) * accumulation >= MIN_MEASURED_ITERATIONS
    assert (steps - QUICK_WARMUP_STEPS - 1) * accumulation < MIN_MEASURED_ITERATIONS  # no step more than needed
    capped = quick_max_steps(accumulation, stopping_rule=True)  # the rule's cap, in whole steps
    assert (capped - QUICK_WARMUP_STEPS) * accumulation >= RULE_MAX_ITERATIONS
    assert (capped - QUICK_WARMUP_STEPS - 1) * accumulation < RULE_MAX_ITERATIONS


def test_quick_overrides_shorten_long_runs_and_keep_the_lr_warm_up_inside_them():
    train = {"global_batch_size": 32, "micro_batch_size": 8, "max_steps": 20, "lr_warmup_steps": 10}
    assert quick_overrides(train, ranks=1) == {"train.max_steps": 4, "train.lr_warmup_steps": 3}
    assert quick_overrides({**train, "max_steps": 2}, ranks=1) == {}  # already shorter than a quick run
    assert quick_overrides({**train, "global_batch_size": 8}, ranks=1)["train.max_steps"] == 2 + MIN_MEASURED_ITERATIONS
    ruled = quick_overrides({**train, "max_steps": 100}, ranks=1, stopping_rule=True)
    assert ruled == {"train.max_steps": 2 + RULE_MAX_ITERATIONS // 4, "train.lr_warmup_steps": 10}


# ------------------------------------------------------------------------------------- the stopping rule


def test_steady_iterations_stop_as_soon_as_the_minimum_is_timed():
    steady = [0.10, 0.11, 0.10, 0.12, 0.10, 0.11, 0.10, 0.11]
    assert len(steady) == RULE_MIN_ITERATIONS
    assert stop_reason(steady[:-1]) is None  # one short of the minimum, however steady
    assert stop_reason(steady) == "stable"


def test_a_drifting_run_keeps_timing_until_its_halves_agree():
    """The first half runs at 0.30 s, the second at 0.20 s (the host was busy, then not): 40 % apart, not
    stable; once enough fast iterations follow, the halves' medians agree."""
    drifting = [0.30] * 4 + [0.20] * 4
    assert stop_reason(drifting) is None
    times = list(drifting)
    while stop_reason(times) is None:
        times.append(0.20)
    # stable once the slow iterations are a minority of the first half too: 4 slow of its 9
    assert stop_reason(times) == "stable" and len(times) == 18
    from lab_helpers.config.iteration_times import iteration_stats

    assert iteration_stats(times)["iter_halves_pct"] <= STABLE_HALVES_PCT < iteration_stats(times[:-1])["iter_halves_pct"]


def test_one_slow_iteration_does_not_keep_a_steady_run_going():
    """A median ignores one one-off (a new kernel shape, a hiccup): 5x slower once, still stable."""
    times = [0.10] * 3 + [0.50] + [0.10] * 4
    assert stop_reason(times) == "stable"


def test_a_run_that_never_settles_stops_at_the_caps():
    slowing = [0.1 * (1 + 0.05 * i) for i in range(RULE_MAX_ITERATIONS)]  # 5 % slower each iteration (throttling)
    assert all(stop_reason(slowing[:n]) is None for n in range(1, RULE_MAX_ITERATIONS))
    assert stop_reason(slowing) == "iteration_cap"
    periodic = [0.1] * 4 + [0.3] * 4  # a pattern that repeats is as settled as it gets: both halves alike
    assert stop_reason(periodic * 2) == "stable"
    slow = [RULE_MAX_TIMED_S / 12] * 4 + [RULE_MAX_TIMED_S / 3] * 2  # few, slow, unsettled: the seconds cap
    assert stop_reason(slow[:-1]) is None and stop_reason(slow) == "time_cap"


# ------------------------------------------------------------------------------------- the batch order


def _timed(sampler: QuickOrderSampler) -> list[list[int]]:
    return list(sampler)[sampler.warmup_batches() :]


def test_the_longest_batch_opens_the_second_step_and_the_timed_part_holds_every_sample_once():
    lengths = [5, 90, 7, 12, 88, 3, 40, 91, 2, 60, 11]
    sampler = QuickOrderSampler(lengths, batch_size=2, accumulation=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 2 * 3 + 6
    assert sorted(batches[3]) == [1, 7]  # lengths 90 and 91: the first micro-batch of the second step
    timed = [i for batch in batches[6:] for i in batch]
    assert timed == sampler.shuffle() and sorted(timed) == list(range(len(lengths)))
    later = list(sampler)  # a second epoch: another shuffle, no warm-up batches
    assert len(later) == 6 and [i for b in later for i in b] == sampler.shuffle(1) != sampler.shuffle()


@pytest.mark.parametrize(("batch_size", "accumulation"), [(8, 4), (8, 1), (4, 4), (2, 8), (3, 1)])
def test_the_timed_samples_and_their_order_do_not_depend_on_the_batch_settings(batch_size, accumulation):
    """grad-accum (32/8), small-batch (8/8) and any other quick run time the same sequence of samples."""
    lengths = [(i * 37) % 101 + 1 for i in range(50)]
    reference = [i for batch in _timed(QuickOrderSampler(lengths, batch_size=8, accumulation=4)) for i in batch]
    timed = _timed(QuickOrderSampler(lengths, batch_size=batch_size, accumulation=accumulation))
    assert [i for batch in timed for i in batch] == reference
    assert all(len(batch) == batch_size for batch in timed[:-1])


def test_a_short_data_set_still_gets_its_longest_batch():
    batches = list(QuickOrderSampler([1, 2, 3], batch_size=2, accumulation=8))
    assert batches[8] == [2, 1] and len(batches) == 2 * 8 + 2  # warm-up batches reuse the shuffle's samples


def test_each_rank_opens_its_second_step_with_its_share_of_the_longest_samples():
    """The Lightning path (DDP, FSDP, DeepSpeed): every rank's iteration ``accumulation`` holds its part of the
    ``batch_size x ranks`` longest samples, every rank gets as many batches (no rank waits in a collective for a
    batch its peers lack), no timed sample goes to two ranks, and the ranks together time the shuffle in order."""
    lengths = [5, 90, 7, 12, 88, 3, 40, 91, 2, 60, 11, 70, 9, 33]
    samplers = [QuickOrderSampler(lengths, batch_size=2, accumulation=1, rank=rank, world_size=2) for rank in (0, 1)]
    per_rank = [list(sampler) for sampler in samplers]
    assert [len(batches) for batches in per_rank] == [len(s) for s in samplers] == [2 + 3, 2 + 3]
    assert sorted(per_rank[0][1] + per_rank[1][1]) == [1, 4, 7, 11]  # lengths 90, 88, 91, 70
    rounds = [per_rank[0][k] + per_rank[1][k] for k in range(2, 5)]
    assert [i for r in rounds for i in r] == samplers[0].shuffle()[:12]  # 3 rounds of 4; 2 samples left out
    single = QuickOrderSampler(lengths, batch_size=2, accumulation=1)
    assert len(_timed(single)) == 7  # one rank: every sample once


def test_bad_rank_or_too_few_samples_are_one_line_errors():
    with pytest.raises(ValueError, match="rank 2 of 2"):
        QuickOrderSampler([1, 2, 3, 4], batch_size=1, accumulation=1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="3 samples cannot fill one batch of 2 on each of 2 ranks"):
        QuickOrderSampler([1, 2, 3], batch_size=2, accumulation=1, world_size=2)


def test_a_run_shorter_than_a_quick_run_keeps_one_step_to_time():
    from lab_helpers.training.quick_mode import quick_warmup_steps

    assert quick_warmup_steps(None) == quick_warmup_steps(20) == QUICK_WARMUP_STEPS == 2
    assert quick_warmup_steps(2) == 1 and quick_warmup_steps(1) == 1  # a 1-step run: the clock times it whole


# ------------------------------------------------------------------------------- with litgpt's own loaders


def _timed_samples(exp_id: str) -> tuple[int, list[tuple[int, ...]]]:
    """(micro batch, the samples quick mode times -- token ids without padding -- in order) of ``exp_id`` on the ci
    profile: litgpt's own ``get_dataloaders`` with the data module, tokenizer and train settings of the experiment's
    recipe, wrapped as the litgpt child wraps it in quick mode."""
    import importlib

    import lightning as L
    from litgpt.args import TrainArgs
    from litgpt.tokenizer import Tokenizer

    from lab_helpers.config.experiments import resolve, runnable_recipe
    from lab_helpers.training.child_litgpt import _Training, _wrap_get_dataloaders

    recipe = runnable_recipe(resolve(exp_id, "ci", check_files=False).recipe)
    module_name, _, class_name = recipe["data"]["class_path"].rpartition(".")
    init_args = {**recipe["data"]["init_args"], "json_path": Path(recipe["data"]["init_args"]["json_path"])}
    data = getattr(importlib.import_module(module_name), class_name)(**init_args)
    train = TrainArgs(**{k: v for k, v in recipe["train"].items() if k in TrainArgs.__dataclass_fields__})
    litgpt_loaders = importlib.import_module("litgpt.finetune.full").get_dataloaders
    get_dataloaders = _wrap_get_dataloaders(litgpt_loaders, _Training(), quick=True)
    loader, _ = get_dataloaders(L.Fabric(accelerator="cpu", devices=1), data, Tokenizer(recipe["checkpoint_dir"]), train)
    # the loader under the clock's watch: iterated this fast, the stopping rule would end the pass early
    batches = list(loader._dataloader)[QUICK_WARMUP_STEPS * train.gradient_accumulation_iters(1, 1) :]
    samples = [
        tuple(ids[: int(length)].tolist())  # litgpt pads on the right
        for batch in batches
        for ids, length in zip(batch["input_ids"], batch["token_counts"]["raw_plus_prompt_template"], strict=True)
    ]
    return train.micro_batch_size, samples


@pytest.mark.slow
def test_compared_quick_runs_time_the_same_samples_in_the_same_order(ci_assets):
    """grad-accum (32/8), small-batch (8/8), bf16-true (32/8) and lora-1b (16/4) on the ci profile: after the
    warm-up steps, litgpt's loaders give every quick run the same samples in the same order, each sample once."""
    seen = {exp_id: _timed_samples(exp_id) for exp_id in ("grad-accum", "small-batch", "bf16-true", "lora-1b")}
    assert {micro for micro, _ in seen.values()} == {8, 4}  # different batch settings...
    reference = seen["grad-accum"][1]
    assert len(reference) == len(set(reference)) > 100  # every training sample once (the generated ones differ)
    for exp_id, (_, samples) in seen.items():
        assert samples == reference, exp_id  # ...the same timed samples, in the same order


def test_a_run_settles_its_overrides_before_it_is_resolved_once():
    """lab.settled_overrides: fill-gpu's micro batch, then quick mode's steps read from the filled train section,
    then the profiled steps on top, all decided on the run as asked; resolving them gives the train section each
    step assumed (ResolvedRun.train_with follows resolve's batch rule)."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.lab import settled_overrides
    from lab_helpers.planning.predict import fill_gpu_for

    asked = resolve("fill-gpu", "ci", {"train.max_steps": 1000}, check_files=False)
    fill, _ = fill_gpu_for(asked)
    settled, why = settled_overrides(asked, quick=True, trace_steps=2)
    assert why and settled["train.micro_batch_size"] == fill["train.micro_batch_size"]
    filled = resolve("fill-gpu", "ci", {"train.max_steps": 1000, **fill}, check_files=False)
    short = quick_overrides(filled.recipe["train"], 1, stopping_rule=True)
    assert short and filled.gradient_accumulation != asked.gradient_accumulation  # the fill changed what quick reads
    assert settled == {**filled.overrides, **short, "train.max_steps": short["train.max_steps"] + 3}
    assert resolve("fill-gpu", "ci", settled, check_files=False).recipe["train"] == asked.train_with(settled)
    # a run the lab adds nothing to keeps what was asked (and is not resolved again)
    plain = resolve("grad-accum", "ci", {"train.max_steps": 2}, check_files=False)
    assert settled_overrides(plain) == ({"train.max_steps": 2}, None)
    # an experiment whose global batch follows its ranks: train_with applies the same rule as resolve
    course = resolve("ddp-course", "ci", check_files=False, simulate_world=4)
    more = {"train.micro_batch_size": 1}
    assert course.train_with(more) == resolve("ddp-course", "ci", more, check_files=False, simulate_world=4).recipe["train"]


def test_profiled_steps_after_the_timing_train_on_into_the_next_pass():
    """A quick run whose timing has ended (quick_stop has its reason) but whose profiled steps still run: when the
    data set's pass ends first, litgpt starts the next pass and gets real batches (it got None, a TypeError in
    litgpt's loop), until the profiled window ends the loop on a batch, which the pass after that hands back."""
    import torch

    from lab_helpers.training.child_litgpt import _Training

    batches = [
        {"input_ids": torch.zeros(2, 4, dtype=torch.long), "token_counts": {"raw_plus_prompt_template": torch.tensor([3, 4])}}
        for _ in range(3)
    ]
    training = _Training()
    watched = training.watch_batches(batches, accumulation=1, epochs=None, quick=True)
    assert list(watched) == batches
    training.quick_stop.reason = "stable"  # the rule ended the timing; the profiled steps are still to come
    assert list(watched) == batches  # the next pass trains on
    watched._held = batches[0]  # the profiled window ended the loop on this batch
    assert list(watched) == [batches[0]]


@pytest.mark.parametrize("value", ["2", "y", "quick", "0n"])
def test_a_lab_quick_typo_is_one_line_not_the_courses_full_runs(value, monkeypatch):
    """LAB_QUICK=2 (or y) read as off: the course's full step counts, minutes of a paid GPU lease, without a word."""
    from lab_helpers.config.config_error import LabConfigError
    from lab_helpers.training.quick_mode import QUICK_ENV, quick_from_env

    for on, off in (("1", "0"), ("Yes", "off"), (" true ", "")):
        monkeypatch.setenv(QUICK_ENV, on)
        assert quick_from_env() is True
        monkeypatch.setenv(QUICK_ENV, off)
        assert quick_from_env() is False
    monkeypatch.setenv(QUICK_ENV, value)
    with pytest.raises(LabConfigError, match=f"LAB_QUICK='{value}': give 1 for quick mode"):
        quick_from_env()
