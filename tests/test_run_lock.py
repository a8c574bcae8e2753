"""One run at a time on a node (lab_helpers.launch.run_lock): the lock is let go of however its holder ends, and a
lock file that cannot be used never stops a run. The refusal of a real second run: tests/test_lab_runs.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.launch.run_lock import LOCK_ENV, one_run_at_a_time

HOLD = """
import sys, time
from pathlib import Path
from lab_helpers.launch.run_lock import one_run_at_a_time
with one_run_at_a_time("lora-1b", Path("/somewhere/results")):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_holder_killed_with_sigkill_lets_go_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "runs.lock"))
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LabConfigError) as refused, one_run_at_a_time("small-batch", tmp_path):
            pass
        assert f"(lora-1b, pid {holder.pid}, started 20" in str(refused.value)
        assert "in /somewhere/results)" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    with one_run_at_a_time("small-batch", tmp_path):  # no stale lock: the kernel let go of it with the process
        pass
    assert (tmp_path / "runs.lock").read_text() == ""  # and the holder's line is gone once a run ends


def test_a_link_or_a_folder_at_the_lock_path_is_a_note_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    target = tmp_path / "someone-elses-file"
    target.write_text("keep me")
    (tmp_path / "link.lock").symlink_to(target)
    (tmp_path / "folder.lock").mkdir()
    for name in ("link.lock", "folder.lock"):
        monkeypatch.setenv(LOCK_ENV, str(tmp_path / name))
        ran = False
        with one_run_at_a_time("small-batch", tmp_path):
            ran = True
        assert ran
        note = capsys.readouterr().out
        assert note.startswith("note: could not check for another run on this node") and note.count("\n") == 1
    assert target.read_text() == "keep me"  # never written through the link


def test_the_lock_file_is_made_for_every_user_of_the_node(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, str(tmp_path / "runs.lock"))
    with one_run_at_a_time("small-batch", tmp_path):
        pass
    assert (tmp_path / "runs.lock").stat().st_mode & 0o777 == 0o666
    start = time.monotonic()
    with one_run_at_a_time("small-batch", tmp_path):  # the file is there now: opened, not made again
        pass
    assert time.monotonic() - start < 5
