"""Reading records at scale (issue 54 item 8): the same records, set-aside lines and derived figures as the
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
