"""The length-grouped experiment: small-batch's samples in micro-batches of similar length.

The sampler is tested on its own (seeded, every sample once a pass, the longest batch opening the second step,
less padding than the shuffle); the prediction reads the sampler's batches, so a real quick run's token counts are
exactly the predicted ones of the micro-batches it timed; the words are computed from the two records.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lab_helpers import launch
from lab_helpers.config.experiments import LabConfigError, resolve
from lab_helpers.config.iteration_times import steady_timing
from lab_helpers.present.padding import padding_words
from lab_helpers.training.data_lengths import batch_padding
from lab_helpers.training.quick_mode import (
    MEGA_BATCH_BATCHES,
    QuickOrderSampler,
    batch_sampler,
    stop_reason,
)

_RNG = random.Random(7)
LENGTHS = [min(500, 20 + int(_RNG.expovariate(1 / 120))) for _ in range(1000)]  # a long tail, as Alpaca's


def _grouped(**kwargs):
    return batch_sampler(LENGTHS, batch_order="length-grouped", **{"batch_size": 8, "accumulation": 4, **kwargs})


# ------------------------------------------------------------------------------------------- the sampler


def test_the_grouped_order_is_seeded_and_the_same_every_time():
    assert list(_grouped()) == list(_grouped())
    assert _grouped().timed_batches() != _grouped(seed=43).timed_batches()
    assert _grouped().timed_batches(1) != _grouped().timed_batches(0)  # each pass its own shuffle


@pytest.mark.parametrize("batch_size", [8, 4, 3])
def test_every_sample_once_a_pass_and_the_longest_batch_opens_the_second_step(batch_size):
    accumulation = 4
    sampler = _grouped(batch_size=batch_size, accumulation=accumulation)
    batches = list(sampler)
    warmup = sampler.warmup_batches()
    timed = [i for batch in batches[warmup:] for i in batch]
    assert sorted(timed) == list(range(len(LENGTHS)))  # every sample, once
    assert len(batches) == len(sampler) == warmup + -(-len(LENGTHS) // batch_size)
    longest = sorted(range(len(LENGTHS)), key=lambda i: -LENGTHS[i])[:batch_size]
    assert batches[accumulation] == longest  # quick mode's rule: the peak batch first in step 2
    later = list(sampler)  # a second pass: no warm-up batches, every sample once again
    assert sorted(i for batch in later for i in batch) == list(range(len(LENGTHS)))


def test_micro_batches_hold_samples_of_one_mega_batch_sorted_by_length():
    """The shuffle is cut into mega-batches; each micro-batch comes from one of them and its samples are the
    neighbours by length there: the micro-batches of a mega-batch do not overlap in length."""
    sampler = _grouped()
    order = sampler.shuffle()
    size = MEGA_BATCH_BATCHES * sampler.batch_size
    mega_of = {index: position // size for position, index in enumerate(order)}
    spans: dict[int, list[tuple[int, int]]] = {}
    for batch in sampler.timed_batches():
        assert len({mega_of[i] for i in batch}) == 1
        lengths = [LENGTHS[i] for i in batch]
        spans.setdefault(mega_of[batch[0]], []).append((min(lengths), max(lengths)))
    for ranges in spans.values():
        ranges.sort()
        assert all(high <= low for (_, high), (low, _) in zip(ranges, ranges[1:], strict=False))


def test_grouping_cuts_the_padding_and_keeps_the_samples():
    shuffled = batch_padding(LENGTHS, micro_batch_size=8, batch_order="shuffle")
    grouped = batch_padding(LENGTHS, micro_batch_size=8, batch_order="length-grouped")
    assert grouped.tokens == shuffled.tokens == sum(LENGTHS) and grouped.micro_batches == shuffled.micro_batches
    assert grouped.padding_pct < shuffled.padding_pct / 10
    assert grouped.mean_padded_length < shuffled.mean_padded_length
    # the shuffle's batches are quick mode's own: the prediction and the run read one sampler
    expected = QuickOrderSampler(LENGTHS, batch_size=8, accumulation=1).timed_batches()
    assert shuffled.batch_tokens_padded == tuple(len(b) * max(LENGTHS[i] for i in b) for b in expected)
    cut = batch_padding(LENGTHS, micro_batch_size=8, batch_order="length-grouped", max_seq_length=64)
    assert cut.tokens == sum(min(n, 64) for n in LENGTHS)


def test_one_rank_only_and_known_orders_only():
    with pytest.raises(ValueError, match="one rank"):
        batch_sampler(LENGTHS, batch_order="length-grouped", batch_size=8, accumulation=1, world_size=2)
    with pytest.raises(ValueError, match="not one of shuffle, length-grouped"):
        batch_sampler(LENGTHS, batch_order="sorted", batch_size=8, accumulation=1)


def test_a_grouped_run_is_never_stable_by_the_rule_only_by_its_caps():
    steady = [1.0] * 20
    assert stop_reason(steady) == "stable"
    assert stop_reason(steady, stable_pct=None) is None
    assert stop_reason([1.0] * 64, stable_pct=None) == "iteration_cap"


def test_a_grouped_records_rates_are_over_its_mean_micro_batch():
    """Its micro-batches differ in length by design: the median one is not the mean one."""
    record = {"train_s": 10.0, "iterations": 4, "tokens": 3000, "tokens_padded": 3200, "warmup_iterations": 0,
              "per_iteration": [{"iter": i + 1, "iter_time_s": s} for i, s in enumerate([1.0, 1.0, 1.0, 7.0])]}  # fmt: skip
    shuffled = steady_timing(record)
    grouped = steady_timing({**record, "batch_order": "length-grouped"})
    assert shuffled["iter_median_s"] == grouped["iter_median_s"] == 1.0
    assert shuffled["tokens_per_s"] == pytest.approx(3000 / 4 / 1.0)
    assert grouped["tokens_per_s"] == pytest.approx(3000 / 10.0)  # all its tokens over all its timed seconds


# ------------------------------------------------------------------------------------------- the experiment


def test_length_grouped_is_small_batch_in_another_order(ci_assets, tmp_path):
    for profile in ("ci", "gpu"):
        grouped, pair = (resolve(e, profile, check_files=False) for e in ("length-grouped", "small-batch"))
        assert grouped.recipe == pair.recipe and grouped.recipe_path == pair.recipe_path
        assert (grouped.options["batch_order"], pair.options["batch_order"]) == ("length-grouped", "shuffle")
    argv = launch.command(grouped, tmp_path / "grouped")
    assert argv[-2:] == ["--batch-order", "length-grouped"]
    assert "--batch-order" not in launch.command(pair, tmp_path / "pair")


def test_the_lightning_path_refuses_a_grouped_order(monkeypatch):
    import dataclasses

    from lab_helpers.config import experiments

    ddp = experiments.get_experiment("ddp")
    monkeypatch.setattr(experiments, "get_experiment",
                        lambda _: dataclasses.replace(ddp, options={"batch_order": "length-grouped"}))  # fmt: skip
    with pytest.raises(LabConfigError, match="runs on one device .* only"):
        resolve("ddp", "ci", check_files=False)


def test_plan_time_reads_the_grouped_batches(ci_assets, tmp_path, capsys):
    from lab_helpers.present.plan_command import main

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(map(str, LENGTHS)))
    recipe = Path(__file__).resolve().parent.parent / "configs/ci/ci-llama-xs/full.yaml"
    common = [str(recipe), "--device", "cpu", "--time", "--sample-lengths", str(lengths),
              "--set", "train.max_seq_length=512", "--set", "train.micro_batch_size=8"]  # fmt: skip
    assert main([*common, "--batch-order", "length-grouped"]) == 0
    grouped = batch_padding(LENGTHS, micro_batch_size=8, batch_order="length-grouped")
    out = capsys.readouterr().out
    assert f"8 x {grouped.mean_padded_length} tokens" in out
    assert f"{grouped.padding_pct:.1f}% of their padded tokens are padding" in out


# ------------------------------------------------------------------------------------------- the words


def _record(experiment: str, order: str, **values) -> dict:
    return {"experiment": experiment, "batch_order": order, "status": "ok", "profile": "ci", "mode": "quick",
            "device_name": "cpu (x86_64)", "config": {"precision": "32-true", "train": {"micro_batch_size": 8,
            "max_seq_length": 256}}, "iterations": 10, **values}  # fmt: skip


def _stand_in(record):
    grouped = record["batch_order"] == "length-grouped"
    return {"padding_pct": 1.0 if grouped else 25.0, "mean_padded_length": 101 if grouped else 135,
            "micro_batch_s": 0.5 if grouped else 0.6, "tokens_per_s": 1600.0 if grouped else 1300.0,
            "tokens_per_s_padded": 1616.0 if grouped else 1733.0, "peak_gib": 0.124, "why": None}  # fmt: skip


def test_the_words_are_the_two_records_figures_beside_the_prediction():
    pair = _record("small-batch", "shuffle", padding_pct=26.3, tokens_per_s=365.0, tokens_per_s_padded=495.0,
                   tokens_padded=10792, peak_tensor_gib=0.0734)  # fmt: skip
    grouped = _record("length-grouped", "length-grouped", padding_pct=0.9, tokens_per_s=440.0,
                      tokens_per_s_padded=444.0, tokens_padded=7112, peak_tensor_gib=0.0734)  # fmt: skip
    words = padding_words(pair, grouped, predict=_stand_in)
    assert "small-batch (shuffle) -> length-grouped (length-grouped)" in words
    assert "padding: 26.3 % -> 0.9 % (predicted 25.0 % -> 1.0 %)" in words
    assert "padded length: 135 -> 89 (predicted 135 -> 101)" in words  # 10792 / (10 x 8), 7112 / 80
    assert "real tokens/s: 365 -> 440 (predicted 1,300 -> 1,600)" in words
    assert "time per micro-batch: 2.18 s -> 1.6 s" in words  # 10792 / 10 / 495, 7112 / 10 / 444
    assert "peak memory (live tensors, CPU): 0.0734 GiB -> 0.0734 GiB (predicted 0.124 GiB -> 0.124 GiB)" in words
    assert "real tokens/s rose by 21 %" in words and "the peak moved by +0 GiB" in words


def test_on_a_gpu_the_words_split_the_predicted_micro_batch_beside_what_bound_the_runs():
    def on_gpu(record):
        grouped = record["batch_order"] == "length-grouped"
        return {**_stand_in(record), "device_ms": 70.0 if grouped else 120.0, "host_ms": 186.0, "time_bound": "host"}

    gpu = {"device_name": "NVIDIA H200", "bound": "gpu", "peak_alloc_gib": 28.4}
    pair = _record("small-batch", "shuffle", **gpu, gpu_busy_pct=96.6, padding_pct=38.6, tokens_per_s=13142.0)
    grouped = _record("length-grouped", "length-grouped", **gpu, gpu_busy_pct=90.5, padding_pct=1.8,
                      tokens_per_s=17672.0)  # fmt: skip
    words = padding_words(pair, grouped, predict=on_gpu)
    assert "predicted micro-batch: device 120 -> 70 ms, host 186 -> 186 ms, bound host -> host" in words
    assert "(measured: GPU busy 97 % -> 90 %, bound gpu -> gpu)" in words
    assert "peak memory (allocated): 28.4 GiB -> 28.4 GiB" in words and "real tokens/s rose by 34 %" in words


def test_the_words_refuse_what_does_not_compare():
    grouped = _record("length-grouped", "length-grouped", padding_pct=0.9)
    assert "small-batch has no record" in padding_words(None, grouped, predict=_stand_in)
    skipped = _record("small-batch", "shuffle", status="skipped", reason="no GPU")
    assert padding_words(skipped, grouped, predict=_stand_in) == "no comparison: small-batch is skipped (no GPU)"
    other = _record("small-batch", "shuffle", mode="full")
    assert "different mode" in padding_words(other, grouped, predict=_stand_in)
    full = {"tokens_padded": 512, "iterations": 1}  # the ci profile: one micro-batch of 8 x 64 tokens each
    same = padding_words(_record("small-batch", "shuffle", **full), _record("length-grouped", "length-grouped", **full),
                         predict=_stand_in)  # fmt: skip
    assert "both runs timed micro-batches padded to 64 tokens a sample" in same


# ------------------------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_a_real_quick_run_pads_less_at_the_same_peak_and_times_the_predicted_batches(ci_assets, results):
    """small-batch and length-grouped on the ci profile in quick mode, with the samples uncut (the ci recipes cut
    them at 64 tokens, where nearly every batch is full whatever the order) and up to 10 timed micro-batches each."""
    from lab_helpers.lab import run_experiment
    from lab_helpers.present.padding import latest_record
    from lab_helpers.training.data_lengths import recipe_batch_padding

    overrides = {"train.max_seq_length": 256, "train.max_steps": 12}
    runs = {e: run_experiment(e, profile="ci", overrides=overrides, quick=True, echo=False)[0]
            for e in ("small-batch", "length-grouped")}  # fmt: skip
    pair, grouped = runs["small-batch"], runs["length-grouped"]
    assert pair["status"] == grouped["status"] == "ok", (pair.get("error"), grouped.get("error"))
    assert (pair["batch_order"], grouped["batch_order"]) == ("shuffle", "length-grouped")
    # the shuffled run may stop by the rule (stable after 8); the grouped one is never stable: all 10 timed
    assert 8 <= pair["iterations"] <= 10 and grouped["iterations"] == 10 and grouped["quick_stop"] == "run_end"
    assert grouped["padding_pct"] < 5 < 20 < pair["padding_pct"]
    assert grouped["peak_tensor_gib"] == pytest.approx(pair["peak_tensor_gib"], rel=0.01)  # the same longest batch
    for record in (pair, grouped):  # the run timed exactly the sampler's first micro-batches, as predicted
        run = resolve(record["experiment"], "ci", record["overrides"], check_files=False)
        predicted, _ = recipe_batch_padding(run.recipe, record["batch_order"])
        assert predicted.first(record["iterations"]) == (record["tokens"], record["tokens_padded"])
    log = (results / grouped["log_path"]).read_text()
    assert "lab: length-grouped batches:" in log and "no stable rule" in log
    words = padding_words(latest_record("small-batch", profile="ci"), latest_record("length-grouped", profile="ci"))
    assert f"padding: {pair['padding_pct']:.1f} % -> {grouped['padding_pct']:.1f} % (predicted" in words
    assert f"real tokens/s: {pair['tokens_per_s']:,.0f} -> {grouped['tokens_per_s']:,.0f} (predicted" in words
    # full mode: the grouped order without warm-up batches, every micro-batch from the grouped pass
    [full] = run_experiment("length-grouped", profile="ci", overrides={**overrides, "train.max_steps": 4}, quick=False,
                            echo=False)  # fmt: skip
    assert full["status"] == "ok" and full["mode"] == "full" and full["batch_order"] == "length-grouped"
    run = resolve("length-grouped", "ci", full["overrides"], check_files=False)
    predicted, _ = recipe_batch_padding(run.recipe, "length-grouped")
    assert predicted.first(4)[1] - predicted.first(1)[1] == full["tokens_padded"]  # the first step is warm-up
    assert full["padding_pct"] < 5


@pytest.mark.parametrize("order", ["length-grouped", "shuffle"])
def test_plan_time_with_fewer_lengths_than_one_micro_batch_is_one_line(order, ci_assets, tmp_path, capsys):
    """One sample length for a micro batch of 8 was a ValueError traceback from the sampler."""
    from lab_helpers.present.plan_command import main

    lengths = tmp_path / "one.json"
    lengths.write_text("[100]")
    recipe = Path(__file__).resolve().parent.parent / "configs/ci/ci-llama-xs/full.yaml"
    argv = [str(recipe), "--device", "cpu", "--time", "--batch-order", order, "--sample-lengths", str(lengths)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: 1 sample length cannot fill one micro-batch of 8") and "\n" not in err, err
    with pytest.raises(ValueError, match="cannot fill one micro-batch of 8"):  # PlanError is a ValueError
        batch_padding([100], micro_batch_size=8, batch_order=order)
