"""Reading records at scale: the same records, set-aside lines and derived figures as the
whole-file reader gave, read a line at a time with keys shared, and the bootstrap at numpy's speed drawing the
very resamples ``random.Random(0).choices`` drew. The figures at 100,000 records: benchmarks/records_reading.py."""

from __future__ import annotations

import json
import random
import statistics
import warnings

import pytest

from lab_helpers.config.iteration_times import BOOTSTRAP_RESAMPLES
from lab_helpers.config.record_schema import record_unfit
from lab_helpers.record.records import read_records, scan_lines


def _loop_centres(values: tuple[float, ...], mean: bool) -> list[float]:
    """The bootstrap as it was written before numpy drew it: 2,000 ``choices`` of one ``Random(0)``."""
    draw = random.Random(0)
    centre = statistics.fmean if mean else statistics.median
    return [centre(draw.choices(values, k=len(values))) for _ in range(BOOTSTRAP_RESAMPLES)]


@pytest.mark.parametrize("n", [2, 3, 8, 13, 28, 44, 700])
@pytest.mark.parametrize("mean", [False, True])
def test_the_bootstrap_draws_the_same_resamples_as_the_python_loop(n, mean):
    """Bit for bit: a steady spread or a busy spread must not move because it is computed faster. 700 values
    take two blocks of draws (the blocks must continue one stream); ties and repeated values included."""
    from lab_helpers.config.iteration_times import bootstrap_centres

    rnd = random.Random(n)
    values = tuple(rnd.choice([0.11, 0.12, 0.125]) if i % 3 == 0 else rnd.lognormvariate(-2, 0.5) for i in range(n))
    assert bootstrap_centres(values, mean=mean) == _loop_centres(values, mean)


def _record(i: int, **extra) -> dict:
    return {"experiment": f"exp-{i}", "profile": "ci", "status": "ok", "config": {"train": {"micro_batch_size": 4}},
            **extra}  # fmt: skip


def test_keys_are_stored_once_for_all_records(tmp_path):
    """Half of a record's memory was its keys' text, once per record: the reader shares them."""
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(3)))
    first, _, third = read_records(path)
    assert first == _record(0) and third == _record(2)
    assert [id(key) for key in first] == [id(key) for key in third]
    assert next(iter(first["config"]["train"])) is next(iter(third["config"]["train"]))


def _old_where(data: bytes) -> list[tuple[str, str | None]]:
    """How the whole-file reader named each non-blank line (split at newlines, the last two parts 'trailing')."""
    lines = data.split(b"\n")
    named = []
    for number, raw in enumerate(lines, start=1):
        if raw.strip():
            where = "trailing line" if number >= len(lines) - 1 else f"line {number}"
            try:
                record = json.loads(raw)
            except ValueError:
                named.append((where, "bad JSON or UTF-8"))
                continue
            named.append((where, record_unfit(record)))
    return named


@pytest.mark.parametrize("ending", [b"\n", b"", b"\n\n", b"\r\n"])
def test_lines_are_named_and_judged_as_the_whole_file_reader_did(ending):
    good = [json.dumps(_record(i)).encode() for i in range(3)]
    for data in (
        b"\n".join([good[0], b'{"experiment": "x", "sta', good[1], b"[1, 2]", good[2]]) + ending,
        b"\n".join([good[0], good[1], b'{"experiment": "cut']) + ending,
        b"\n".join([good[0], b"", b"   ", good[1]]) + ending,
        ending,
    ):
        scanned = [(where, problem) for where, _, problem in scan_lines(data)]
        assert scanned == _old_where(data), data


def test_a_huge_integer_or_a_nan_among_a_records_numbers_is_set_aside_not_raised(tmp_path):
    """``seq_lens`` is checked at C speed; an integer too large for a float raised OverflowError in
    ``math.isfinite`` (one such line broke every table); now it is a line set aside, as a NaN is."""
    path = tmp_path / "runs.jsonl"
    lines = [_record(0, seq_lens=[64, 10**400]), _record(1, seq_lens=[64.0, float("nan")]), _record(2, seq_lens=[64])]
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_records(path)
    assert [r["experiment"] for r in records] == ["exp-2"]
    assert "set aside 2 lines" in str(caught[0].message) and "seq_lens (tokens)" in str(caught[0].message)


@pytest.mark.parametrize(
    "line",
    [
        b'{"experiment": "x", "status": "ok", "reason": "\\ud800"}',  # an ASCII line: the escape makes it
        b'{"experiment": "x", "status": "ok", "reason": "\xed\xa0\x80"}',  # UTF-8's form of a surrogate
    ],
)
def test_text_that_is_not_unicode_is_still_found(line):
    """The encoding check is skipped only for an ASCII line without a surrogate escape (all the lab writes)."""
    [(where, record, problem)] = list(scan_lines(line + b"\n"))
    assert record is None and problem == "text that is not valid Unicode in reason"


def _gpu_run(i: int, busy: float, spread: float) -> dict:
    from lab_helpers.record.time_bound import band

    return {"experiment": "small-batch", "status": "ok", "bound": band(busy), "bound_reason": "measured",
            "gpu_busy_pct": busy, "gpu_busy_spread_pct": spread, "gpu_busy_sample_count": 12, "run_id": f"r{i}",
            "device_name": "NVIDIA H200", "profile": "gpu", "rank": 0, "world_size": 1, "overrides": {}}  # fmt: skip


def test_a_reason_names_three_runs_labelled_otherwise_and_counts_the_rest():
    """A class's term holds thousands of runs of one experiment on one GPU: each reason named every run labelled
    otherwise (a quadratic text: 500 runs, 54 kB a reason). It names the first NAMED_OTHERS and counts the rest;
    with three or fewer it is what it was (the shipped references)."""
    from lab_helpers.record.time_bound import NAMED_OTHERS, agree_within_noise

    runs = agree_within_noise([_gpu_run(i, 97.0 if i % 2 else 60.0, 1.0) for i in range(400)])
    assert {run["bound"] for run in runs} == {"gpu", "both"}
    reason = runs[0]["bound_reason"]
    assert reason.count("; the other `small-batch` run on this GPU") == NAMED_OTHERS
    assert reason.endswith(f"; and {200 - NAMED_OTHERS} more run(s) of `small-batch` on this GPU labelled otherwise")
    assert "(r1)" in reason and "(r3)" in reason and "(r5)" in reason and "(r7)" not in reason  # in stored order
    few = agree_within_noise([_gpu_run(i, 97.0 if i == 0 else 60.0, 1.0) for i in range(3)])
    assert few[0]["bound_reason"].count("; the other") == 2 and "more run(s)" not in few[0]["bound_reason"]


def test_pooled_labels_are_the_pairwise_loops():
    """The pairs of a group are compared at numpy's speed; the labels and pooled figures are the loop's, bit for
    bit, boundary pairs (figures exactly the joint noise apart) included."""
    import math

    from lab_helpers.record.time_bound import _apart, _pooled_labels, band

    rnd = random.Random(7)
    runs = [_gpu_run(i, rnd.choice([48.0, 52.0, 85.0, 88.0, 91.0, round(rnd.uniform(40, 99), 2)]),
                     rnd.choice([3.0, 4.0, 5.0, 0.0, rnd.uniform(0, 8)])) for i in range(300)]  # fmt: skip
    runs[5]["gpu_busy_spread_pct"] = None  # no noise estimate: agrees with every run
    for run, (label, pooled, others) in zip(runs, _pooled_labels(runs), strict=True):
        agreeing = [other for other in runs if _apart(run, other)[0] <= _apart(run, other)[1]]
        weights = [12.0 for _ in agreeing]
        expected = sum(w * o["gpu_busy_pct"] for w, o in zip(weights, agreeing, strict=True)) / sum(weights)
        assert (others, pooled) == (len(agreeing) - 1, expected) and not math.isnan(pooled)
        assert label == (band(expected) if len(agreeing) > 1 else run["bound"])
