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

from lab_helpers.record import recovery
from lab_helpers.record.records import (
    RecordWriteError,
    append_record,
    latest_runs,
    load_results,
    read_records,
)
from lab_helpers.record.store import store_records


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


# ------------------------------------------------------------------ nothing lost, round two


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


@pytest.fixture
def lab_results(tmp_path, monkeypatch):
    """A results folder of the lab's (run folders under runs/), and a state folder of this test's."""
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    monkeypatch.setenv("LAB_RESULTS", str(results))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(recovery, "_checked", set())
    return results


def _run_folder(results, run_id: str):
    run_dir = results / "runs" / run_id
    run_dir.mkdir()
    return run_dir


def test_a_record_goes_to_its_run_folder_first_then_to_the_index(lab_results, capsys):
    run_dir = _run_folder(lab_results, "r0")
    records = [_record(0, run_id="r0", rank=0), _record(0, run_id="r0", rank=1)]
    assert store_records(records, path=None, run_dir=run_dir) == lab_results / "runs.jsonl"
    assert read_records(run_dir / "record.jsonl") == read_records(lab_results / "runs.jsonl")
    assert [r["rank"] for r in read_records(lab_results / "runs.jsonl")] == [0, 1]
    assert capsys.readouterr().err == "" and recovery.recover_orphans(once=False) == []


def test_a_record_the_index_cannot_take_stays_in_the_run_folder_and_the_next_command_adds_it(lab_results, capsys):
    index = lab_results / "runs.jsonl"
    index.mkdir()  # what a `sudo` run or a slip leaves: runs.jsonl cannot be opened
    run_dir = _run_folder(lab_results, "r1")
    stored = store_records([_record(0, run_id="r1", rank=0), _record(0, run_id="r1", rank=1)], path=None,
                           run_dir=run_dir)  # fmt: skip
    assert stored == run_dir / "record.jsonl"
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and str(stored) in said[0] and "the next lab command adds it" in said[0], said
    assert "directory" in said[0]
    index.rmdir()
    assert [r["rank"] for r in recovery.recover_orphans(once=False)] == [0, 1]
    assert "added the record of run r1 (ok)" in capsys.readouterr().err
    assert [r["rank"] for r in read_records(index)] == [0, 1] and read_records(stored) == read_records(index)
    assert "recovered" not in read_records(index)[0]  # the launcher's own record, as it stored it
    assert recovery.recover_orphans(once=False) == [] and len(read_records(index)) == 2


def test_a_run_added_to_the_index_late_comes_before_the_run_after_it(lab_results):
    """No record is appended out of order: what the index lacks goes in before the next run's own records."""
    index = lab_results / "runs.jsonl"
    index.mkdir()
    store_records(
        [_record(0, run_id="20261128-100000-a")], path=None, run_dir=_run_folder(lab_results, "20261128-100000-a")
    )
    index.rmdir()
    rerun = _run_folder(lab_results, "20261128-110000-a")
    with recovery.holding_run(rerun):  # as lab.run_experiment stores: its own folder held, the index brought up first
        recovery.recover_orphans(once=False)
        store_records([_record(0, run_id="20261128-110000-a")], path=None, run_dir=rerun)
    assert [r["run_id"] for r in read_records(index)] == ["20261128-100000-a", "20261128-110000-a"]
    assert list(latest_runs(load_results(index))["run_id"]) == ["20261128-110000-a"]


def _failing_disk(monkeypatch, tmp_path, failing, errno_=None):
    """The results folder's file system fails every write (ENOSPC: full; EROFS: remounted read-only), as the real
    tmpfs of the slow tests does; every other folder stands on a file system of its own. Returns the undo."""
    import errno as errnos

    from lab_helpers.record import records, store

    errno_ = errno_ or errnos.ENOSPC
    append = records.append_locked
    broken = [True]

    def append_or_fail(fd, target, data):
        if broken[0] and target.is_relative_to(failing):
            raise RecordWriteError(errno_, f"could not store the record in {target}: {os.strerror(errno_)}")
        append(fd, target, data)

    monkeypatch.setattr(records, "append_locked", append_or_fail)
    monkeypatch.setattr(store, "_device_of", lambda path: 1 if path.is_relative_to(failing) else hash(path.parts[:5]))
    return lambda: broken.clear() or broken.append(False)


def test_a_full_results_disk_sends_the_record_off_it_and_the_next_command_brings_it_back(
    lab_results, tmp_path, capsys, monkeypatch
):
    run_dir = _run_folder(lab_results, "r3")
    mended = _failing_disk(monkeypatch, tmp_path, lab_results)
    stored = store_records([_record(0, run_id="r3", rank=0), _record(0, run_id="r3", rank=1)], path=None,
                           run_dir=run_dir)  # fmt: skip
    assert stored == tmp_path / "state" / "lab" / "runs.r3.jsonl"
    assert [r["rank"] for r in read_records(stored)] == [0, 1]
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in line and f"kept in {stored}" in line
    assert [p.name for p in lab_results.rglob("*") if p.is_file()] == []  # no 0-byte runs.jsonl or record.jsonl
    recovery.recover_orphans(once=False)  # still full: nothing moves, nothing is lost
    assert read_records(stored) and not (lab_results / "runs.jsonl").exists()
    mended()
    assert len(recovery.recover_orphans(once=False)) == 2
    assert [r["rank"] for r in read_records(lab_results / "runs.jsonl")] == [0, 1]
    assert [r["rank"] for r in read_records(run_dir / "record.jsonl")] == [0, 1] and not stored.exists()


def test_a_run_folder_that_takes_nothing_sends_the_record_off_the_results_folder(lab_results, tmp_path, capsys):
    (lab_results / "runs.jsonl").mkdir()
    run_dir = _run_folder(lab_results, "r2")
    (run_dir / "record.jsonl").mkdir()  # the run folder's file is blocked too
    stored = store_records([_record(0, run_id="r2")], path=None, run_dir=run_dir)
    assert stored == tmp_path / "state" / "lab" / "runs.r2.jsonl" and read_records(stored)[0]["run_id"] == "r2"
    assert str(stored) in capsys.readouterr().err


def test_a_record_no_place_takes_is_one_error_naming_every_place(tmp_path, monkeypatch):
    from lab_helpers.record import store

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(store, "temp_fallback_dir", lambda: tmp_path / "tmp" / "lab-0")
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


# ------------------------------------------------------------------ adding what the index lacks, once


def _cli(*args, env=None, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "lab_helpers", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def test_three_commands_at_once_add_a_run_folders_record_to_the_index_once(tmp_path):
    env = {**os.environ, "LAB_RESULTS": str(tmp_path / "results"), "XDG_STATE_HOME": str(tmp_path / "state")}
    index = tmp_path / "results" / "runs.jsonl"
    append_record(_record(0, run_id="seed"), path=index)
    kept = tmp_path / "results" / "runs" / "r4" / "record.jsonl"
    for rank in range(64):
        append_record(_record(0, run_id="r4", rank=rank), path=kept)
    procs = [_cli("results", env=env) for _ in range(3)]
    said = [(proc.wait(timeout=120), *proc.communicate()) for proc in procs]
    assert all(code == 0 and "Traceback" not in err for code, _, err in said), said
    assert sum("added the record of run r4" in err for _, _, err in said) == 1, said
    keys = [(r["run_id"], r["rank"]) for r in read_records(index)]
    assert len(keys) == 65 and len(set(keys)) == 65 and len(read_records(kept)) == 64


def test_merge_records_is_the_old_name_of_what_every_command_does(tmp_path):
    env = {**os.environ, "LAB_RESULTS": str(tmp_path / "results"), "XDG_STATE_HOME": str(tmp_path / "state")}
    kept = tmp_path / "results" / "runs" / "r5" / "record.jsonl"
    append_record(_record(0, run_id="r5"), path=kept)
    out, err = _cli("merge-records", str(kept), env=env).communicate(timeout=120)
    assert "merge-records is now `python -m lab_helpers results`" in err and "Traceback" not in err, err
    assert [r["run_id"] for r in read_records(tmp_path / "results" / "runs.jsonl")] == ["r5"] and kept.exists()


def test_a_results_file_elsewhere_takes_no_run_of_the_labs_folder(lab_results, tmp_path):
    kept = _run_folder(lab_results, "r6") / "record.jsonl"
    append_record(_record(0, run_id="r6"), path=kept)
    elsewhere = tmp_path / "elsewhere" / "runs.jsonl"
    assert recovery.recover_orphans(elsewhere, once=False) == [] and not elsewhere.exists()
    assert [r["run_id"] for r in recovery.recover_orphans(once=False)] == ["r6"]
