"""The results file: append-only, one line per record, never damaged by a crash, a kill or a full disk."""

from __future__ import annotations

import errno
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

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.record.fallback import merge_records, store_records
from lab_helpers.record.records import (
    RecordWriteError,
    append_record,
    load_results,
    read_records,
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
        from lab_helpers.record.records import append_record, RecordWriteError
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
        "from lab_helpers.record.records import append_record\n"
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


def test_a_record_that_cannot_reach_the_results_file_lands_in_the_run_folder_and_merges_back(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    path.mkdir()  # what a `sudo` run or a slip leaves: runs.jsonl cannot be opened
    run_dir = tmp_path / "runs" / "r1"
    stored = store_records(
        [_record(0, run_id="r1", rank=0), _record(0, run_id="r1", rank=1)], path=path, run_dir=run_dir
    )
    assert stored == run_dir / "record.jsonl"
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and str(stored) in said[0] and "merge-records" in said[0] and "directory" in said[0]
    assert [r["rank"] for r in read_records(stored)] == [0, 1]
    path.rmdir()
    assert merge_records(stored, path=path).merged == 2 and not stored.exists()
    assert [r["rank"] for r in read_records(path)] == [0, 1]


def test_the_fallback_leaves_the_results_folder_when_it_takes_nothing(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.jsonl").mkdir()
    run_dir = results / "runs" / "r2"
    (run_dir / "record.jsonl").mkdir(parents=True)  # the run folder's fallback is blocked too
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    stored = store_records([_record(0, run_id="r2")], path=results / "runs.jsonl", run_dir=run_dir)
    assert stored == tmp_path / "state" / "lab" / "runs.r2.jsonl" and read_records(stored)[0]["run_id"] == "r2"
    assert str(stored) in capsys.readouterr().err


def _failing_disk(monkeypatch, tmp_path, failing, errno_=None):
    """The results folder's file system fails every write (ENOSPC: full; EROFS: remounted read-only), as the real
    tmpfs of the slow tests does; every other folder stands on a file system of its own."""
    import errno as errnos

    from lab_helpers.record import fallback, records

    errno_ = errno_ or errnos.ENOSPC
    append = records.append_locked

    def append_or_fail(fd, target, data):
        if target.is_relative_to(failing):
            raise RecordWriteError(errno_, f"could not store the record in {target}: {os.strerror(errno_)}")
        append(fd, target, data)

    monkeypatch.setattr(records, "append_locked", append_or_fail)
    monkeypatch.setattr(fallback, "_device_of", lambda path: 1 if path.is_relative_to(failing) else hash(path.parts[:5]))


def test_a_full_results_disk_sends_the_record_off_it_and_leaves_no_empty_file_there(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    run_dir = results / "runs" / "r3"
    run_dir.mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _failing_disk(monkeypatch, tmp_path, results)
    stored = store_records([_record(0, run_id="r3", rank=0), _record(0, run_id="r3", rank=1)],
                           path=results / "runs.jsonl", run_dir=run_dir)  # fmt: skip
    assert stored == tmp_path / "state" / "lab" / "runs.r3.jsonl"
    assert [r["rank"] for r in read_records(stored)] == [0, 1]
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in line and f"merge-records {stored}" in line
    assert [p.name for p in results.rglob("*") if p.is_file()] == []  # no 0-byte runs.jsonl or record.jsonl


def test_a_record_no_place_takes_is_one_error_naming_every_place(tmp_path, monkeypatch):
    from lab_helpers.record import fallback

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(fallback, "temp_fallback_dir", lambda: tmp_path / "tmp" / "lab-0")
    _failing_disk(monkeypatch, tmp_path, tmp_path, errno.EROFS)
    with pytest.raises(RecordWriteError) as info:
        store_records([_record(0, run_id="r4")], path=tmp_path / "results" / "runs.jsonl", run_dir=tmp_path / "run")
    assert "Read-only file system" in info.value.strerror and "\n" not in info.value.strerror
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_a_write_that_fails_removes_the_file_it_created(tmp_path, monkeypatch):
    _failing_disk(monkeypatch, tmp_path, tmp_path / "full")
    with pytest.raises(RecordWriteError):
        append_record(_record(0), path=tmp_path / "full" / "runs.jsonl")
    assert not (tmp_path / "full" / "runs.jsonl").exists()


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
    from lab_helpers.config.paths import reference_dir

    for path in reference_dir().glob("*.jsonl"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_records(path), path


# ------------------------------------------------------------------ issue 45: one safe merge


def _lines(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        for record in records:
            fh.write(json.dumps(record, sort_keys=True) + "\n")


def _run_records(run_id: str, ranks=(0, 1)) -> list[dict]:
    return [_record(0, run_id=run_id, rank=rank) for rank in ranks]


def test_merge_refuses_the_results_file_itself_and_every_file_that_is_not_a_fallback(tmp_path):
    """The results file by any name (itself, a link, a hard link named like a fallback), a notebook, a reference
    file, a backup of many runs, a fallback whose records are another run's, an empty one: refused, untouched."""
    results = tmp_path / "results" / "runs.jsonl"
    _lines(results, _run_records("a") + _run_records("b"))
    notebook = tmp_path / "01_single_gpu.ipynb"
    notebook.write_text('{"cells": []}\n')
    reference = tmp_path / "h100-80gb.jsonl"
    _lines(reference, _run_records("gpu-1"))
    backup = tmp_path / "runs.backup.jsonl"
    _lines(backup, _run_records("a") + _run_records("b"))
    other_run = tmp_path / "runs" / "r9" / "record.jsonl"
    _lines(other_run, _run_records("r8"))
    empty = tmp_path / "runs.r7.jsonl"
    empty.write_text("")
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / "runs.a.jsonl"
    link.symlink_to(results)
    hard = tmp_path / "runs.c.jsonl"
    single = tmp_path / "single" / "runs.jsonl"
    _lines(single, _run_records("c"))
    os.link(single, hard)
    cases = [
        (results, results, "not the name of a fallback"),
        (results.parent / "." / ".." / "results" / "runs.jsonl", results, "not the name of a fallback"),
        (notebook, results, "not the name of a fallback"),
        (reference, results, "not the name of a fallback"),
        (backup, results, "line 1 is a record of run 'a', not of run backup"),
        (other_run, results, "of run 'r8', not of run r9"),
        (empty, results, "no record in it"),
        (link, results, "a symbolic link"),
        (hard, single, "the results file itself"),
    ]
    every = [results, notebook, reference, backup, other_run, empty, single]
    before = {path: path.read_bytes() for path in every}
    for source, target, why in cases:
        with pytest.raises(LabConfigError, match="merge-records takes only a fallback file") as info:
            merge_records(source, path=target)
        assert why in str(info.value) and "nothing was changed" in str(info.value), str(info.value)
        assert "\n" not in str(info.value)
    assert {path: path.read_bytes() for path in every} == before and link.is_symlink() and hard.exists()


def test_merge_is_idempotent_by_run_id_and_rank_and_removes_only_what_is_all_in(tmp_path):
    results = tmp_path / "runs.jsonl"
    _lines(results, _run_records("r1", ranks=(0,)))  # rank 0 of the run made it; rank 1 went to the fallback
    fallback = tmp_path / "runs.r1.jsonl"
    _lines(fallback, _run_records("r1"))
    _lines(fallback, _run_records("r1", ranks=(1,)))  # the same rank twice: appended once
    result = merge_records(fallback, path=results)
    assert (result.merged, result.already_there, result.removed) == (1, 2, True) and not fallback.exists()
    assert [(r["run_id"], r["rank"]) for r in read_records(results)] == [("r1", 0), ("r1", 1)]
    assert "merged 1 record(s) of run r1" in result.line() and "(2 already there); removed" in result.line()


def test_merge_keeps_a_fallback_with_a_line_that_is_not_a_record_and_says_why(tmp_path):
    results = tmp_path / "runs.jsonl"
    fallback = tmp_path / "runs" / "r2" / "record.jsonl"
    _lines(fallback, _run_records("r2"))
    with open(fallback, "ab") as fh:
        fh.write(b'{"experiment": "exp-0", "sta')  # a kill in the middle of a rank's write
    for _ in range(2):  # and again: nothing appended twice, still kept
        result = merge_records(fallback, path=results)
        assert not result.removed and fallback.exists()
        assert "kept" in result.line() and "trailing line is not a record" in result.line()
    assert [(r["run_id"], r["rank"]) for r in read_records(results)] == [("r2", 0), ("r2", 1)]


def test_a_rank_appending_to_a_fallback_a_merge_is_taking_writes_to_a_new_one(tmp_path):
    """The merge unlinks the fallback under its lock; a rank waiting for that lock must not append to the
    unlinked file (its record would be gone): it opens the path again."""
    import fcntl
    import threading

    fallback = tmp_path / "runs.r3.jsonl"
    _lines(fallback, _run_records("r3", ranks=(0,)))
    fd = os.open(fallback, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what merge_records holds while it merges
    late = threading.Thread(target=append_record, args=(_record(0, run_id="r3", rank=1),), kwargs={"path": fallback})
    late.start()
    time.sleep(0.3)
    fallback.unlink()
    os.close(fd)
    late.join(10)
    assert [(r["run_id"], r["rank"]) for r in read_records(fallback)] == [("r3", 1)]


def _cli(*args, env=None, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "lab_helpers", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def test_merge_records_cli_refuses_the_results_file_and_a_reference_in_one_line(tmp_path):
    """The issue's repros through the real CLI: `merge-records results/runs.jsonl` deleted every record."""
    env = {**os.environ, "LAB_RESULTS": str(tmp_path / "results")}
    results = tmp_path / "results" / "runs.jsonl"
    _lines(results, _run_records("a") + _run_records("b"))
    reference = tmp_path / "h100-80gb.jsonl"
    _lines(reference, _run_records("gpu-1"))
    big = tmp_path / "runs.big.jsonl"
    with open(big, "wb") as fh:  # sparse: a fallback too large to read
        fh.truncate((1 << 30) + 1)
    before = {path: path.stat() for path in (results, reference, big)}
    for source in (results, reference, big):
        out, err = _cli("merge-records", str(source), env=env).communicate(timeout=60)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "nothing was changed" in lines[0], err
        assert out == ""
    assert {path: path.stat() for path in before} == before
    assert len(read_records(results)) == 4


def test_two_merges_of_one_fallback_at_once_append_it_once(tmp_path):
    env = {**os.environ, "LAB_RESULTS": str(tmp_path / "results")}
    results = tmp_path / "results" / "runs.jsonl"
    _lines(results, _run_records("seed"))
    fallback = tmp_path / "results" / "runs.r4.jsonl"
    _lines(fallback, _run_records("r4", ranks=range(64)))
    procs = [_cli("merge-records", str(fallback), env=env) for _ in range(3)]
    said = [(proc.wait(timeout=60), *proc.communicate()) for proc in procs]
    assert all("Traceback" not in err and len((out + err).strip().splitlines()) == 1 for _, out, err in said), said
    assert sorted(code for code, _, _ in said)[0] == 0 and {code for code, _, _ in said} <= {0, 2}, said
    assert sum("merged 64 record(s)" in out for _, out, _ in said) == 1, said
    keys = [(r["run_id"], r["rank"]) for r in read_records(results)]
    assert len(keys) == 66 and len(set(keys)) == 66 and not fallback.exists()
