"""One ordering of records. A ``started_at`` ahead of its time (a clock ahead, an edited record) hid every
newer run in the tables; the order is now the position in the append-only file, and the odd time is named.

The CLI runs for real (``python -m lab_helpers compare / results``) on records appended as the lab
appends them; no training is needed, the fault is in what the file holds.
"""

from __future__ import annotations

import csv
import os
import subprocess
import warnings

from conftest import REPO, cli

from lab_helpers.present import tables
from lab_helpers.record.records import append_record, load_results, odd_started_at

AHEAD = "2099-01-01T00:00:00+00:00"


def _record(run_id: str, started_at: str, train_s: float, **extra) -> dict:
    return {"experiment": "grad-accum", "profile": "ci", "status": "ok", "rank": 0, "run_id": run_id,
            "started_at": started_at, "train_s": train_s, "wall_s": train_s + 5, **extra}  # fmt: skip


def _compare(results, tmp_path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = subprocess.run(cli("compare", "--out", str(tmp_path / "figures")), capture_output=True, text=True,
                         timeout=120, cwd=REPO, env={**os.environ, "LAB_RESULTS": str(results)})  # fmt: skip
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    with open(tmp_path / "figures" / "comparison.csv") as fh:
        return out, list(csv.DictReader(fh))


def test_a_start_time_ahead_hides_no_newer_run_and_is_named(results, tmp_path):
    """The issue's repro: a record dated 2099, then two newer runs of the same experiment. `compare` (its table, its
    CSV) shows the last one stored; stderr names the odd time in one warning line."""
    path = results / "runs.jsonl"
    append_record(_record("earlier", "2026-01-01T10:00:00+00:00", 11.0), path=path)
    append_record(_record("ahead", AHEAD, 99.0), path=path)
    append_record(_record("newer", "2026-01-02T10:00:00+00:00", 22.0), path=path)
    append_record(_record("newest", "2026-01-03T10:00:00+00:00", 33.0), path=path)
    out, rows = _compare(results, tmp_path)
    assert [(row["experiment"], row["train_s"]) for row in rows] == [("grad-accum", "33.0")]
    warned = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and AHEAD in warned[0] and "'ahead'" in warned[0] and "in the future" in warned[0]
    assert "order they were stored" in warned[0]
    # the notebooks' tables read the same frame through the same function
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = tables.comparison_table(load_results(path))
    assert list(table["train_s"]) == [33.0]
    listed = subprocess.run(cli("results"), capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "LAB_RESULTS": str(results)})  # fmt: skip
    assert listed.returncode == 0 and AHEAD in listed.stdout  # every record, the odd one as it was stored


def test_odd_start_times_name_the_fewer_rows():
    """Where two stored runs disagree with their order, the fewer of the two explanations is named: one record
    ahead of the runs after it, or one behind the runs before it; a start in the future is always named."""
    import pandas as pd

    ahead = pd.DataFrame([_record("a", "2026-01-01T10:00:00+00:00", 1), _record("b", "2026-03-01T00:00:00+00:00", 1),
                          _record("c", "2026-01-02T10:00:00+00:00", 1), _record("d", "2026-01-03T10:00:00+00:00", 1)])
    assert odd_started_at(ahead) == [(1, "later than the end of a run stored after it")]
    behind = pd.DataFrame([_record("a", "2026-01-01T10:00:00+00:00", 1), _record("b", "2026-01-02T10:00:00+00:00", 1),
                           _record("c", "2026-01-03T10:00:00+00:00", 1), _record("d", "2025-06-01T10:00:00+00:00", 1)])
    assert odd_started_at(behind) == [(3, "earlier than the start of a run stored before it")]
    future = pd.DataFrame([_record("a", AHEAD, 1), _record("b", "2026-01-02T10:00:00+00:00", 1)])
    assert odd_started_at(future) == [(0, "in the future")]
    # two runs at once (the shorter stored first) and a run stored within the slack: nothing odd
    overlap = pd.DataFrame([_record("long", "2026-01-01T10:00:00+00:00", 1800), _record("short",
                            "2026-01-01T10:05:00+00:00", 60), _record("next", "2026-01-01T10:40:00+00:00", 1)])
    assert odd_started_at(overlap) == []  # fmt: skip
