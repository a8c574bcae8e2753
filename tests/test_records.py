"""The results file: append-only, one line per record, never damaged by a crash, a kill or a full disk."""

from __future__ import annotations

import json
import multiprocessing
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lab_helpers.records import append_record, load_results, read_records


def _record(i: int, **extra) -> dict:
    return {"experiment": f"exp-{i}", "profile": "ci", "status": "ok", "rank": None, **extra}


def test_append_and_read_back_in_order(tmp_path):
    path = tmp_path / "runs.jsonl"
    for i in range(3):
        append_record(_record(i, peak_alloc_gib=None, train_s=1.5), path=path)
    records = read_records(path)
    assert [r["experiment"] for r in records] == ["exp-0", "exp-1", "exp-2"]
    assert records[0]["peak_alloc_gib"] is None  # null stays null, never 0
    frame = load_results(path)
    assert list(frame["experiment"]) == ["exp-0", "exp-1", "exp-2"]


def test_nan_is_stored_as_null_and_bad_records_are_refused(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record(0, mfu=float("nan")), path=path)
    assert read_records(path)[0]["mfu"] is None
    with pytest.raises(ValueError, match="status"):
        append_record({"experiment": "x", "status": "fine"}, path=path)
    with pytest.raises(ValueError, match="experiment"):
        append_record({"status": "ok"}, path=path)
    assert len(read_records(path)) == 1


def test_damaged_trailing_line_is_skipped_with_a_warning_and_fenced_off(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record(0), path=path)
    with open(path, "ab") as fh:  # what a kill in the middle of a write leaves behind
        fh.write(b'{"experiment": "exp-1", "sta')
    with pytest.warns(UserWarning, match="damaged trailing line"):
        assert [r["experiment"] for r in read_records(path)] == ["exp-0"]
    append_record(_record(2), path=path)  # the next record must not be glued to the damaged one
    with pytest.warns(UserWarning, match="damaged line 2"):
        assert [r["experiment"] for r in read_records(path)] == ["exp-0", "exp-2"]


def test_empty_or_missing_file_gives_an_empty_frame(tmp_path):
    frame = load_results(tmp_path / "none.jsonl")
    assert frame.empty and "status" in frame.columns


def _append_many(path: str, worker: int) -> None:
    for i in range(50):
        append_record(_record(i, worker=worker, payload="x" * 5000), path=path)


def test_concurrent_appends_from_several_processes_never_interleave(tmp_path):
    path = tmp_path / "runs.jsonl"
    procs = [multiprocessing.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    records = read_records(path)
    assert len(records) == 200
    assert all(len(r["payload"]) == 5000 for r in records)


def test_a_full_disk_leaves_earlier_records_intact(tmp_path):
    """A real failed write: the file-size limit (RLIMIT_FSIZE) makes write() fail part-way, like a full disk."""
    path = tmp_path / "runs.jsonl"
    append_record(_record(0), path=path)
    size = path.stat().st_size
    script = textwrap.dedent(
        f"""
        import resource, signal
        from lab_helpers.records import append_record, RecordWriteError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({size} + 100, {size} + 100))
        try:
            append_record({{"experiment": "big", "status": "ok", "payload": "y" * 10000}}, path={str(path)!r})
        except RecordWriteError as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "refused" in out.stdout
    assert path.stat().st_size == size  # cut back to where it started
    assert [r["experiment"] for r in read_records(path)] == ["exp-0"]
    append_record(_record(1), path=path)
    assert [r["experiment"] for r in read_records(path)] == ["exp-0", "exp-1"]


def test_killed_writer_never_damages_earlier_records(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record(0), path=path)
    script = (
        "from lab_helpers.records import append_record\n"
        f"while True: append_record({{'experiment': 'loop', 'status': 'ok', 'payload': 'z' * 20000}}, path={str(path)!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(200):
            if path.stat().st_size > 200_000:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with open(path) as fh:
        first = json.loads(fh.readline())
    assert first["experiment"] == "exp-0"
    records = read_records(path)  # at most a damaged tail, skipped
    assert records[0]["experiment"] == "exp-0" and all(r["experiment"] == "loop" for r in records[1:])
