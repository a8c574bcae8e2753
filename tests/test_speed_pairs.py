"""Speed verdicts beyond the noise: the steady time apart from first-seen lengths, the one rule of a
verdict, the lesson pairs, on records built for it and on the shipped H200 records."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from lab_helpers.config.experiments import load_experiments
from lab_helpers.config.iteration_times import length_split
from lab_helpers.config.paths import reference_dir
from lab_helpers.present import speed_pairs, tables
from lab_helpers.record.records import conformed, read_records


def built(exp: str, seconds: list[float], *, lengths: list[int] | None = None, warmup: int = 2, micro: int = 8,
          run: str = "r1", device: str = "NVIDIA H200") -> dict:  # fmt: skip
    """A finished GPU record of ``exp`` whose timed micro-batches took ``seconds`` (after ``warmup`` of 0.5 s)."""
    times = [0.5] * warmup + list(seconds)
    return conformed({
        "experiment": exp, "run_id": run, "status": "ok", "profile": "gpu", "device_name": device, "rank": None,
        "world_size": 1, "warmup_iterations": warmup, "train_s": sum(seconds), "iterations": len(seconds),
        "config": {"train": {"micro_batch_size": micro, "global_batch_size": micro}},
        "per_iteration": [{"iter": i, "iter_time_s": s, "loss": 1.0, "tokens": 100.0 * i} for i, s in enumerate(times, 1)],
        "seq_lens": lengths,
    })  # fmt: skip


def jittered(centre: float, n: int = 12, spread: float = 0.05, seed: int = 0) -> list[float]:
    draw = random.Random(seed)
    return [centre * (1 + draw.uniform(-spread, spread)) for _ in range(n)]


def test_length_split_keeps_first_seen_lengths_apart():
    # warm-up meets 100 and 200; timed: 100 (seen), 300 (new), 200 (seen), 300 (seen), 400 (new), 100 (seen)
    record = built("bf16-true", [0.10, 0.30, 0.11, 0.09, 0.32, 0.10], lengths=[100, 200, 100, 300, 200, 300, 400, 100])
    split = length_split(record)
    assert split["steady_iter_count"] == 4 and split["first_seen_count"] == 2
    assert split["steady_iter_s"] == pytest.approx(0.10)
    assert split["first_seen_extra_s"] == pytest.approx(0.31 - 0.10)
    assert split["first_seen_pct"] == pytest.approx(100 * (0.20 + 0.22) / sum([0.10, 0.30, 0.11, 0.09, 0.32, 0.10]))
    assert record["steady_iter_s"] == pytest.approx(0.10)  # readers derive it (records.conformed)


def test_no_silent_fallback_where_lengths_cannot_tell():
    old = length_split(built("bf16-true", [0.1] * 6))
    assert old["steady_iter_s"] is None and "lengths not recorded" in old["steady_basis"]
    few = length_split(built("bf16-true", [0.1] * 4, lengths=[1, 2, 1, 3, 4, 5]))
    assert few["steady_iter_s"] is None and "only 1 of 4" in few["steady_basis"]
    short = length_split(built("bf16-true", [0.1] * 4, lengths=[1, 2]))
    assert short["steady_iter_s"] is None and "fewer than the log's" in short["steady_basis"]


def test_two_percent_apart_is_within_noise():
    records = [built("bf16-true", jittered(0.102, seed=1)), built("grad-accum", jittered(0.100, seed=2), run="r2")]
    verdict = speed_pairs.compare(records, "bf16-true", "grad-accum")
    assert verdict.verdict == "within noise"
    assert "within noise (±" in verdict.words() and "faster" not in verdict.words() and "slower" not in verdict.words()


def test_a_clear_difference_gets_its_verdict_both_ways():
    records = [built("bf16-true", jittered(0.06, seed=1)), built("grad-accum", jittered(0.10, seed=2), run="r2")]
    assert speed_pairs.compare(records, "bf16-true", "grad-accum").verdict == "faster"
    assert speed_pairs.compare(records, "grad-accum", "bf16-true").verdict == "slower"


def test_one_or_two_micro_batches_are_too_few_to_tell():
    """A bootstrap of one value has no width: 31 % apart on one micro-batch each was called 'faster' (ci)."""
    records = [built("length-grouped", [0.069]), built("small-batch", [0.1, 0.1], run="b")]
    verdict = speed_pairs.compare(records, "length-grouped", "small-batch")
    assert verdict.verdict == "too few to tell" and "too few micro-batches to tell (1 and 2)" in verdict.words()


def test_a_cpu_pair_timed_unalike_gets_no_verdict():
    """On a CPU a compiled run cannot count live tensors (TorchDispatchMode stops torch.compile), its eager pair
    does, and the count slows a run: the lever's time difference is not a verdict (the ci compile)."""
    cpu = "cpu (x86_64)"
    compiled = built("compile", jittered(0.05), device=cpu)
    eager = built("lora-1b", jittered(0.10, seed=2), device=cpu, run="b")
    eager["peak_tensor_gib"] = 0.02
    verdict = speed_pairs.compare([compiled, eager], "compile", "lora-1b")
    assert verdict.verdict == "not like for like" and "LAB_TENSOR_PEAK=0" in verdict.words()
    compiled["peak_tensor_gib"] = 0.02  # both counted: a verdict again
    assert speed_pairs.compare([compiled, eager], "compile", "lora-1b").verdict == "faster"


def test_runs_that_disagree_widen_the_interval():
    """Two runs of one experiment 30 % apart: a 15 % difference that one run of each calls 'faster' is noise."""
    one = [built("lora-1b", jittered(0.085, seed=1)), built("full-7b", jittered(0.100, seed=2), run="b")]
    assert speed_pairs.compare(one, "lora-1b", "full-7b").verdict == "faster"
    two = [*one, built("lora-1b", jittered(0.115, seed=3), run="c")]
    assert speed_pairs.compare(two, "lora-1b", "full-7b").verdict == "within noise"


def test_both_sides_use_the_same_kind_of_time():
    steady = built("bf16-true", [0.1] * 6, lengths=[1, 2, 1, 2, 1, 2, 1, 2])
    unsplit = built("grad-accum", [0.1] * 6, run="b")
    verdict = speed_pairs.compare([steady, unsplit], "bf16-true", "grad-accum")
    assert not verdict.steady and "all timed micro-batches (first-seen lengths included)" in verdict.words()


def test_other_gpus_and_step_variants_are_not_the_experiment():
    records = [built("bf16-true", [0.1] * 6), built("grad-accum", [0.1] * 6, device="NVIDIA H100 80GB HBM3")]
    assert speed_pairs.compare(records, "bf16-true", "grad-accum").startswith("no finished run of grad-accum on")
    variant = built("grad-accum", [0.1] * 6)
    variant["overrides"] = {"optimizer.fused": True}
    assert isinstance(speed_pairs.compare([records[0], variant], "bf16-true", "grad-accum"), str)


def test_every_pair_of_the_experiments_is_a_lesson_pair():
    lesson = {(exp, against) for exp, against, _ in speed_pairs.LESSON_PAIRS}
    for exp_id, experiment in load_experiments().items():
        if experiment.pair:
            assert (exp_id, experiment.pair) in lesson, exp_id


def test_h200_pairs_and_the_bf16_verdict():
    """The shipped H200 records: every single-GPU lesson pair they hold is printed; bf16-true's steady time sits
    below fp32's as the repeated-length figures do, and is not called slower (the old 'bf16-true slower')."""
    records = [conformed(r) for r in read_records(reference_dir() / "h200-141gb.jsonl")]
    rows = {row["pair"]: row for row in speed_pairs.pairs_rows(records)}
    held = {r["experiment"] for r in records if r["status"] == "ok"}
    single = [(exp, against) for exp, against, _ in speed_pairs.LESSON_PAIRS
              if exp in load_experiments("single") and {exp, against} <= held]  # fmt: skip
    assert len(single) >= 7  # the course's pairs, fill-gpu, length-grouped and act-ckpt at least
    for exp, against in single:
        assert f"{exp} vs {against}" in rows
    bf16 = speed_pairs.compare(records, "bf16-true", "grad-accum")
    assert bf16.steady and bf16.exp_ms < bf16.against_ms and bf16.verdict != "slower"
    assert rows["fill-gpu vs lora-1b"]["verdict"] == "faster"
    assert "within noise" in rows["lora-1b vs full-7b"]["verdict"]  # 01 once printed 'lora-1b slower' from one run
    assert "rank 0 of 4" in " ".join(rows)


def test_speed_words_read_the_rule():
    words = tables.speed_words("bf16-true", "grad-accum")
    assert "h200-141gb: bf16-true" in words and "(steady, one run each)" in words and "bf16-true slower" not in words
    assert "first-seen lengths:" in words


def test_compare_pairs_cli():
    done = subprocess.run([sys.executable, "-m", "lab_helpers", "compare", "--pairs", "--reference", "h200-141gb"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "bf16-true vs grad-accum" in done.stdout and "95 % interval" in done.stdout
    assert "faster or slower only when the interval excludes 0" in done.stdout
