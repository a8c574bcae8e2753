"""The results file: append-only, one line per record, never damaged by a crash, a kill or a full disk."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from lab_helpers.records import (
    RecordWriteError,
    append_record,
    load_results,
    merge_records,
    read_records,
    store_records,
)


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


# ------------------------------------------------------------------ issue 31: nothing lost, round two


def test_a_symlinked_results_file_is_refused_and_its_target_untouched(tmp_path):
    secret = tmp_path / "other-file"
    secret.write_text("not yours\n")
    link = tmp_path / "runs.jsonl"
    link.symlink_to(secret)
    with pytest.raises(RecordWriteError, match="symbolic link"):
        append_record(_record(0), path=link)
    assert secret.read_text() == "not yours\n"
    with pytest.warns(UserWarning, match="symbolic link"):
        assert read_records(link) == []  # readers do not follow it either


def test_a_results_file_that_is_a_directory_or_a_fifo_is_one_line_not_a_hang(tmp_path):
    folder = tmp_path / "runs.jsonl"
    folder.mkdir()
    with pytest.raises(RecordWriteError, match="directory"):
        append_record(_record(0), path=folder)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(RecordWriteError):  # no reader: an open for writing would block without O_NONBLOCK
        append_record(_record(0), path=fifo)
    with pytest.warns(UserWarning, match="not a regular file"):
        assert read_records(fifo) == []


def test_a_record_that_cannot_reach_the_results_file_lands_in_a_fallback_and_merges_back(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    path.mkdir()  # what a `sudo` run or a slip leaves: runs.jsonl cannot be opened
    run_dir = tmp_path / "runs" / "r1"
    stored = store_records([_record(0, run_id="r1", rank=0), _record(0, run_id="r1", rank=1)], path=path, run_dir=run_dir)
    assert stored == tmp_path / "runs.r1.jsonl"
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and str(stored) in said[0] and "merge-records" in said[0] and "directory" in said[0]
    assert [r["rank"] for r in read_records(stored)] == [0, 1]
    path.rmdir()
    assert merge_records(stored, path=path) == 2 and not stored.exists()
    assert [r["rank"] for r in read_records(path)] == [0, 1]


def test_the_fallback_goes_to_the_run_folder_when_the_results_folder_takes_nothing(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.jsonl").mkdir()
    (results / "runs.r2.jsonl").mkdir()  # the first fallback is blocked too
    run_dir = tmp_path / "run"
    stored = store_records([_record(0, run_id="r2")], path=results / "runs.jsonl", run_dir=run_dir)
    assert stored == run_dir / "record.jsonl" and read_records(stored)[0]["run_id"] == "r2"
    assert str(stored) in capsys.readouterr().err


HOSTILE_LINES = [
    b'{"experiment": "a", "status": "ok", "rank": 1e400}',
    b'{"experiment": {"x": 1}, "status": "ok"}',
    b'{"experiment": "b", "status": "ok", "timeline_path": "/etc/passwd"}',
    b'{"experiment": "c", "status": "ok", "timeline_path": "../../outside.csv"}',
    b'{"experiment": "d", "status": "ok", "train_s": -1e30}',
    b'{"experiment": "d2", "status": "ok", "peak_alloc_gib": "12"}',
    b'{"experiment": "e", "status": "ok", "reason": "\\ud800"}',  # a lone surrogate: cannot be printed or stored
    b'{"experiment": "f\xff", "status": "ok"}',  # bad UTF-8
    b'{"experiment": "g", "status": "ok", "config": [1, 2]}',
    b"[1, 2, 3]",
]


def test_hostile_lines_are_set_aside_with_one_warning_that_counts_them(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_record(_record(0), path=path)
    with open(path, "ab") as fh:
        fh.write(b"\n".join(HOSTILE_LINES) + b"\n")
    append_record(_record(1), path=path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [r["experiment"] for r in read_records(path)] == ["exp-0", "exp-1"]
        frame = load_results(path)
    assert list(frame["experiment"]) == ["exp-0", "exp-1"]
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and all(f"set aside {len(HOSTILE_LINES)} lines" in s for s in said), said


def test_every_shipped_reference_record_passes_the_readers_checks():
    from lab_helpers.paths import reference_dir

    for path in reference_dir().glob("*.jsonl"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_records(path), path
