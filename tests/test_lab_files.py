"""One rule for every file and folder the lab writes, and one line with exit 2 where a traceback was.

* ``paths.write_lab_file``: a regular file in its folder, never written through a link nor into a file another name
  shares; ``compare --out`` (its CSV and figures), exports, reports and recipes all write by it, as runs.jsonl's
  appends go by ``paths.open_regular``.
* ``paths.check_locations``: LAB_RESULTS, LAB_CHECKPOINTS, LAB_DATA that name no folder the lab can use (/proc, a
  file, a dangling link, a name too long, a byte that is not UTF-8) are one line before a command starts.
* stdout closed or full: one line, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli

from lab_helpers.config.paths import open_regular, write_lab_file


def _one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=180, cwd=REPO,
                          env={**os.environ, **(env or {})}, **kw)  # fmt: skip


# ----------------------------------------------------------------------------------- the rule, one function


def test_write_lab_file_never_writes_through_a_link_or_into_a_shared_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "comparison.csv").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_lab_file(folder / "comparison.csv", b"table\n")
    (folder / "dir.png").mkdir()
    with pytest.raises(OSError, match="directory"):
        write_lab_file(folder / "dir.png", b"png")
    os.mkfifo(folder / "fifo.csv")
    with pytest.raises(OSError):  # refused at once, never a blocked open
        write_lab_file(folder / "fifo.csv", b"x")
    os.link(victim, folder / "hard.csv")  # another name of the victim: replaced, the victim keeps its bytes
    assert write_lab_file(folder / "hard.csv", b"new\n").read_bytes() == b"new\n"
    assert victim.read_text() == "untouched\n"
    with pytest.raises(ZeroDivisionError):  # a writer that fails half-way leaves the old file and no temporary
        write_lab_file(folder / "hard.csv", lambda fh: (fh.write(b"half"), 1 / 0))
    assert (folder / "hard.csv").read_bytes() == b"new\n"
    assert sorted(p.name for p in folder.iterdir()) == ["comparison.csv", "dir.png", "fifo.csv", "hard.csv"]
    (folder / "log").symlink_to(victim)  # what output.log and runs.jsonl are opened by
    with pytest.raises(OSError):
        open_regular(folder / "log", os.O_WRONLY | os.O_APPEND)
    assert victim.read_text() == "untouched\n"


@pytest.mark.parametrize("planted", ["comparison.csv", "memory.png"])
def test_compare_out_refuses_a_planted_link_in_one_line(results, tmp_path, planted):
    """The issue's repro: comparison.csv (or a figure) a link to another file; runs.jsonl refused links, compare
    wrote through them."""
    from lab_helpers.record.records import append_record

    append_record({"experiment": "baseline", "status": "ok", "profile": "ci", "run_id": "r1", "train_s": 1.0})
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / planted).symlink_to(victim)
    line = _one_line(_cli("compare", "--out", str(out)))
    assert planted in line and "symbolic link" in line
    assert victim.read_text() == "untouched\n" and (out / planted).is_symlink()


@pytest.mark.parametrize("where", ["a file", "/proc/x", "/dev/null"])
def test_compare_out_that_is_no_folder_is_one_line(results, tmp_path, where):
    target = tmp_path / "a-file" if where == "a file" else Path(where)
    if where == "a file":
        target.write_text("mine\n")
    line = _one_line(_cli("compare", "--out", str(target)))
    assert "figures folder" in line and str(target) in line
    assert where != "a file" or target.read_text() == "mine\n"


def test_compare_out_empty_is_one_line_and_writes_nothing(results, tmp_path):
    """`compare --out "$FIGURES"` with the variable unset: Path("") is the working folder, and the CSV and every
    figure landed there, exit 0."""
    here = tmp_path / "cwd"
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cli("compare", "--reference", "ci-cpu", "--out", ""), capture_output=True, text=True,
                          timeout=180, cwd=here, env=env)  # fmt: skip
    assert "figures folder: an empty name" in _one_line(proc)
    assert list(here.iterdir()) == []


# ------------------------------------------------------------------------- the rule of every read


def test_read_lab_file_reads_only_a_regular_file_inside_its_folder_and_capped(tmp_path):
    """The readers' rule, one function (paths.read_lab_file): a FIFO, /dev/zero, a link (at the file or on the way),
    a file outside its folder and one past the cap are refused at once, in words; a regular file is read."""
    from lab_helpers.config.paths import read_lab_file

    run = tmp_path / "run"
    (run / "reports").mkdir(parents=True)
    (run / "reports" / "rank0.json").write_text("{}")
    os.mkfifo(run / "fifo.json")
    (tmp_path / "secret").write_text("peak 99")
    (run / "link.json").symlink_to(tmp_path / "secret")
    (run / "linked").symlink_to(run / "reports")
    assert read_lab_file(run / "reports" / "rank0.json", max_bytes=2, folder=run) == b"{}"
    refused = {
        run / "fifo.json": "not a regular file (a FIFO)",
        Path("/dev/zero"): "not a regular file (a device)",
        run / "link.json": "a symbolic link, which the lab does not read through",
        run / "linked" / "rank0.json": "linked on its way is a symbolic link",
        tmp_path / "secret": "not inside",
        run / "reports": "not a regular file (a directory)",
    }
    for path, words in refused.items():
        with pytest.raises(OSError) as caught:
            read_lab_file(path, max_bytes=100, folder=None if path == Path("/dev/zero") else run)
        assert words in caught.value.strerror, path
    with pytest.raises(OSError, match="2 bytes, more than the 1"):
        read_lab_file(run / "reports" / "rank0.json", max_bytes=1, folder=run)
    with pytest.raises(FileNotFoundError):  # nothing there stays what it is: most readers take it as "none yet"
        read_lab_file(run / "none.json", max_bytes=1, folder=run)


@pytest.mark.parametrize("linked", ["runs", "figures"])
def test_a_linked_runs_or_figures_folder_is_one_line_and_nothing_is_written_through(results, tmp_path, linked):
    """`$LAB_RESULTS/runs` or `$LAB_RESULTS/figures` a symbolic link: the run folder, or compare's CSV and figures,
    went into the link's target, exit 0, no word. The real CLI now refuses in one line, exit 2."""
    from lab_helpers.record.records import append_record

    target = tmp_path / "target"
    target.mkdir()
    results.mkdir()
    (results / linked).symlink_to(target)
    if linked == "runs":
        proc = _cli("run", "grad-accum", "--set", "train.max_steps=2", env={"LAB_PROFILE": "ci"})
    else:
        append_record({"experiment": "baseline", "status": "ok", "profile": "ci", "run_id": "r1", "train_s": 1.0})
        proc = _cli("compare")
    line = _one_line(proc)
    from lab_helpers.config.paths import shown_path  # a long temporary path is shown cut, as every message cuts it

    assert f"{shown_path(results / linked)} is a symbolic link" in line and "real folder" in line
    assert list(target.iterdir()) == [] and (results / linked).is_symlink()
    assert linked == "figures" or not (results / "runs.jsonl").exists()


# ------------------------------------------------------------------------------ the lab's folders, up front


def _bad_values(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return {
        "/proc/x": "/proc/x",
        "a file": str(tmp_path / "a-file"),
        "a dangling link": str(tmp_path / "dangling"),
        "a 300-character name": str(tmp_path / ("n" * 300)),
        "a byte that is not UTF-8": os.fsdecode(bytes(tmp_path) + b"/d\xffata"),
    }


@pytest.mark.parametrize("name", ["LAB_RESULTS", "LAB_CHECKPOINTS", "LAB_DATA"])
def test_a_lab_folder_that_is_no_folder_is_one_line_for_compare_and_prepare(tmp_path, monkeypatch, capsys, name):
    """The CLI's own main, in this process (11 tracebacks before): each value, for the command that uses it."""
    from lab_helpers.cli import main

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    command = "compare" if name == "LAB_RESULTS" else "prepare"
    for label, value in _bad_values(tmp_path).items():
        monkeypatch.setenv(name, value)
        assert main([command, "--profile", "ci"] if command == "prepare" else [command]) == 2, label
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {name}="), (label, err)
        assert not os.path.lexists(tmp_path / ("n" * 300)), label
    assert not (tmp_path / "results").exists()


def test_a_byte_that_is_not_utf8_in_lab_data_is_one_line_before_a_run(results, tmp_path):
    """It passed every check and failed late as `litgpt exited with 2`; now the real CLI says so up front."""
    data = os.fsencode(tmp_path) + b"/d\xffata"
    os.makedirs(data)
    env = {**os.environ, "LAB_DATA": os.fsdecode(data), "LAB_PROFILE": "ci"}
    proc = subprocess.run(cli("run", "grad-accum", "--set", "train.max_steps=2"), capture_output=True, timeout=180,
                          cwd=REPO, env=env)  # fmt: skip
    err = proc.stderr.decode(errors="replace").strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: LAB_DATA="), err
    assert "\\xff" in err[0] and "UTF-8" in err[0]
    assert not (results / "runs").exists() and not (results / "runs.jsonl").exists()


# ----------------------------------------------------------------------------------------------- stdout


@pytest.mark.parametrize(("command", "redirect"), [("results", ">&-"), ("results", "> /dev/full"),
                                                   ("compare", "> /dev/full")])  # fmt: skip
def test_a_closed_or_full_stdout_is_one_line_and_exit_2(results, command, redirect):
    shell = " ".join(cli(command)) + f" {redirect}"
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=180, cwd=REPO)
    line = _one_line(proc)
    assert ("closed" if redirect == ">&-" else "No space left") in line


def test_stdout_piped_into_head_still_ends_quietly(results):
    from lab_helpers.record.records import append_record

    for i in range(300):
        append_record({"experiment": f"e{i}", "status": "ok", "run_id": f"r{i}", "payload": "x" * 200})
    shell = " ".join(cli("results")) + " | head -c 10; echo \" ${PIPESTATUS[0]}\""
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.stdout.endswith(" 1\n") and proc.stderr == "", (proc.stdout, proc.stderr)


def test_warnings_on_the_command_line_are_one_line(results):
    (results / "runs.jsonl").parent.mkdir(parents=True)
    (results / "runs.jsonl").write_text('{"experiment": "x", "status": "ok"}\n{"half a line\n')
    proc = _cli("results")
    assert proc.returncode == 0 and proc.stderr.startswith("warning: ") and len(proc.stderr.splitlines()) == 1
    assert sys.executable not in proc.stderr
