"""``scripts/gpu-chunk.sh``, one GPU slice as one command (see its header), run here with ``--dry-run`` (the ci
profile, tiny models) on the first steps of the speed chunk: it refuses bad input in one line before doing
anything, leaves ok records in the output folder within the limits of what comes back from a device (8 files,
16 MiB each, 2 folders deep), and a SIGKILL of the whole command mid-chunk keeps the finished steps' records.
Each slow test runs two or three steps (--steps N), not the whole chunk: ~70 s and ~60 s on 2 cores, where
the full speed dry run takes 3-4 minutes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu-chunk.sh"
MAX_FILES, MAX_FILE_BYTES, MAX_FOLDERS_DEEP = 8, 16 * 1024 * 1024, 2  # what a device command brings back


def _env(tmp_path: Path) -> dict[str, str]:
    """The script's environment: this Python, and a private TMPDIR (its work folder, and how its processes are
    found again: every one of them inherits it)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OUT"}  # OUT is --out's default
    return {**env, "LAB_PYTHON": os.environ.get("LAB_PYTHON", sys.executable), "TMPDIR": str(tmp)}


def _in_background(tmp_path: Path, *args: str) -> subprocess.Popen:
    """The chunk started in its own session (os.killpg then reaches the script and everything in its process
    group at once, as the device's limit does), its output discarded."""
    return subprocess.Popen(["bash", str(SCRIPT), *args], env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def _chunk(tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=_env(tmp_path), capture_output=True, text=True, timeout=timeout
    )


def _records(out: Path) -> list[dict]:
    path = out / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _ours(tmp_path: Path) -> list[psutil.Process]:
    """The processes the chunk started, whatever their session: those whose TMPDIR is this test's."""
    tmp = str(tmp_path / "tmp")
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("TMPDIR") == tmp:
                found.append(proc)
    return found


def _end_ours(tmp_path: Path, timeout_s: float) -> list[str]:
    """Wait up to ``timeout_s`` for the chunk's processes to end; SIGKILL any left and say which they were."""
    deadline = time.monotonic() + timeout_s
    while (left := _ours(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            names.append(" ".join(proc.cmdline())[:200])
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    return names


def _within_the_limits(out: Path) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 1 <= len(files) <= MAX_FILES, sorted(p.name for p in files)
    for path in files:
        assert path.stat().st_size < MAX_FILE_BYTES, (path.name, path.stat().st_size)
        assert len(path.relative_to(out).parts) - 1 <= MAX_FOLDERS_DEEP, path
    assert not [p.name for p in files if p.name.startswith(".")]  # no half-written .part file stays behind


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "name a chunk"),
        (("bogus", "--out", "{out}"), "unknown chunk 'bogus'"),
        (("speed", "ranks", "--out", "{out}"), "one chunk per command"),
        (("speed",), "give --out DIR"),
        (("speed", "--out"), "--out needs a value"),
        (("speed", "--out", "{out}", "--deadline-s", "soon"), "--deadline-s soon: give whole seconds"),
        (("speed", "--out", "{out}", "--deadline-s", "-8"), "--deadline-s -8: give whole seconds"),
        (("speed", "--out", "{out}", "--deadline-s", "0"), "--deadline-s 0 starts no step: the first (run lora-1b"),
        (("13b", "--out", "{out}", "--deadline-s", "100"), "--deadline-s 100 starts no step"),  # its row: 120 s
        (("speed", "--out", "{out}", "--wheels", "{tmp}"), "holds no wheels"),
        (("speed", "--out", "{out}", "--steps", "0"), "--steps 0: give a whole number from 1"),
        (("speed", "--out", "{out}", "--bogus"), "unknown option --bogus"),
        (("single-7b", "--out", "{out}", "--only", "lora-7b,lora-13b"), "single-7b has no step of 'lora-13b'"),
        (("speed", "--out", "{out}", "--only"), "--only needs a value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    out_dir = tmp_path / "out"
    wheels = tmp_path / "no-wheels"  # a folder without any .whl
    wheels.mkdir()
    out = _chunk(tmp_path, *(a.format(out=out_dir, tmp=wheels) for a in args), timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stdout == ""
    assert not out_dir.exists()  # nothing made, nothing run
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))  # no work folder either


def test_a_python_that_is_not_there_is_bad_input_before_anything(tmp_path: Path) -> None:
    """LAB_PYTHON naming no command: every logged line went through it (masking), so the slice was spent and
    chunk.log said only that masking failed."""
    out_dir = tmp_path / "out"
    out = subprocess.run(
        ["bash", str(SCRIPT), "speed", "--dry-run", "--out", str(out_dir)],
        env={**_env(tmp_path), "LAB_PYTHON": str(tmp_path / "no-python")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == f"gpu-chunk: LAB_PYTHON {tmp_path / 'no-python'}: no such command"
    assert not out_dir.exists()


def test_an_output_folder_that_holds_a_chunks_output_is_bad_input(tmp_path: Path) -> None:
    """Two chunks into one --out (one command on a warm machine): the second replaced the first's runs.jsonl and
    results.tar.gz, its records lost, while chunk.log went on with both."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "runs.jsonl").write_text('{"experiment": "small-batch"}\n')
    out = _chunk(tmp_path, "speed", "--dry-run", "--out", str(out_dir), timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == (
        f"gpu-chunk: --out {out_dir} already holds a chunk's runs.jsonl: give an empty folder (on a device machine, "
        "one chunk per call: only 8 files come back from its output folder, subfolders included)"
    )
    assert sorted(p.name for p in out_dir.iterdir()) == ["runs.jsonl"]
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))


@pytest.mark.slow  # a dry run's preflight and the ci models, no step (its deadline): ~15 s
def test_an_output_folder_on_a_full_disk_is_said_and_fails_the_chunk(tmp_path: Path) -> None:
    """--out on a full disk: cp and tar into it failed with their errors on stderr only, left half-written .part
    files, and the chunk ended 'done' with exit 0 and no records shipped. Needs a tmpfs of its own (root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs of its own here: {mounted.stderr.decode().strip()}")
    try:
        (disk / "filler").write_bytes(b"\0" * 60 * 1024)  # one page of 16 left: chunk.log's
        out = _chunk(tmp_path, "padding", "--dry-run", "--deadline-s", "60", "--out", str(disk / "out"), timeout=120)
        stragglers = _end_ours(tmp_path, timeout_s=30)
        names = sorted(p.name for p in (disk / "out").iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert out.returncode == 1 and not stragglers, out.stdout + out.stderr
    assert f"results.tar.gz: writing it into {disk / 'out'} failed (a full disk?)" in out.stdout, out.stdout
    assert not [n for n in names if n.endswith(".part")], names


def test_help_is_the_header_and_names_every_option(tmp_path: Path) -> None:
    out = _chunk(tmp_path, "--help", timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("# One slice of GPU time is one command")
    for option in ("--out DIR", "--wheels DIR", "--deadline-s S", "--dry-run", "--steps N"):
        assert option in out.stdout
    assert "set -uo" not in out.stdout  # the header only, not the code after it


def _dry_run_passes(tmp_path: Path, chunk: str, *, steps: int) -> Path:
    """The first ``steps`` steps of ``chunk`` as a dry run: exit 0 and no process left behind; its output folder."""
    out_dir = tmp_path / "out"
    try:
        out = _chunk(tmp_path, chunk, "--dry-run", "--steps", str(steps), "--out", str(out_dir))
    finally:
        stragglers = _end_ours(tmp_path, timeout_s=30)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert not stragglers, stragglers
    return out_dir


@pytest.mark.slow  # two ci runs, both profiled: ~45 s on 2 cores
def test_a_dry_run_leaves_ok_records_within_the_limits_of_what_comes_back(tmp_path: Path) -> None:
    out_dir = _dry_run_passes(tmp_path, "speed", steps=2)
    records = _records(out_dir)
    assert [r["experiment"] for r in records] == ["lora-1b", "bf16-true"]
    assert all(r["status"] == "ok" and r["profile"] == "ci" and r["mode"] == "quick" for r in records), records
    _within_the_limits(out_dir)
    names = {p.name for p in out_dir.iterdir()}
    assert {"chunk.log", "runs.jsonl", "results.tar.gz"} <= names
    assert len([n for n in names if n.startswith("trace-") and n.endswith(".json.gz")]) == 2  # one per profiled run
    log = (out_dir / "chunk.log").read_text()
    assert "2 steps" in log and "export-reference --from" in log
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))  # its work folder went with the command


@pytest.mark.slow  # one ci run to the end, a second one killed: ~1 minute on 2 cores
def test_a_sigkill_mid_chunk_keeps_the_finished_runs_records(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    # the training processes (their own sessions) must end with their launchers
    proc = _in_background(tmp_path, "speed", "--dry-run", "--steps", "2", "--out", str(out_dir))
    try:
        deadline = time.monotonic() + 300
        while not _records(out_dir) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, "the chunk ended before a record reached the output folder"
        before = _records(out_dir)
        assert [r["experiment"] for r in before] == ["lora-1b"] and before[0]["status"] == "ok"
        time.sleep(5)  # into the second step: its launcher and training process are running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        stragglers = _end_ours(tmp_path, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL
    assert not stragglers, f"left running after the kill: {stragglers}"
    after = _records(out_dir)  # whole lines only: the file is replaced by a rename, never written in place
    assert [r["run_id"] for r in after] == [r["run_id"] for r in before]
    assert (out_dir / "chunk.log").exists() and (out_dir / "results.tar.gz").exists()
    _within_the_limits(out_dir)


def _training(tmp_path: Path) -> bool:
    """Whether one of the chunk's processes is a run's training process."""
    for proc in _ours(tmp_path):
        with contextlib.suppress(psutil.Error):
            if "child_litgpt" in " ".join(proc.cmdline()):
                return True
    return False


@pytest.mark.slow  # one ci run, ended by SIGTERM a few seconds in: ~25 s on 2 cores
def test_a_sigterm_mid_step_ships_the_interrupted_runs_record_and_says_what_it_cut_short(tmp_path: Path) -> None:
    """A device's limit sends SIGTERM to the whole command first. The script died at once, shipped what it had and
    removed its work folder while the run's launcher, signalled too, was still recording the run: that record was
    lost, the work folder left behind, and chunk.log did not say which step was cut short."""
    out_dir = tmp_path / "out"
    proc = _in_background(tmp_path, "padding", "--dry-run", "--steps", "1", "--out", str(out_dir))
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:  # until the step's training process runs
            if _training(tmp_path):
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the chunk ended before its step's training process started"
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stragglers = _end_ours(tmp_path, timeout_s=30)
    assert not stragglers, stragglers
    assert [(r["experiment"], r["status"]) for r in _records(out_dir)] == [("small-batch", "interrupted")]
    assert proc.returncode == 128 + signal.SIGTERM
    assert "ended by SIGTERM during step 1 (run small-batch)" in (out_dir / "chunk.log").read_text()
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))
    _within_the_limits(out_dir)


@pytest.mark.slow  # one DeepSpeed run on 2 CPU ranks: ~35 s on 2 cores
def test_the_offload_chunks_dry_run_runs_deepspeed_on_the_ci_model(tmp_path: Path) -> None:
    """The chunk names the gpu profile's 7B (`--set checkpoint_dir=...`): on a CPU that model's host RAM skipped
    both runs, so the dry run exercised no DeepSpeed at all. The ci model stands in, as in the other chunks."""
    out_dir = _dry_run_passes(tmp_path, "offload", steps=1)
    records = _records(out_dir)
    assert {r["experiment"] for r in records} == {"deepspeed-zero2-offload"}
    assert all(r["status"] == "ok" and r["profile"] == "ci" for r in records), records
    assert not [r for r in records if "open_llama_7b" in str(r.get("checkpoint_dir", ""))], records
    _within_the_limits(out_dir)


@pytest.mark.slow  # 00 executed on the ci profile (04 and 01 take the same path; they run under nbval in the suite)
def test_the_notebooks_chunk_ships_each_executed_notebook_with_every_cell_run(tmp_path: Path) -> None:
    import nbformat

    out_dir = _dry_run_passes(tmp_path, "notebooks", steps=1)
    _within_the_limits(out_dir)
    for name in ("00_check_node",):
        notebook = nbformat.read(out_dir / f"{name}.ipynb", as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert code and all(c.execution_count for c in code), name  # every code cell ran, in the copy shipped
        assert not [o for c in code for o in c.outputs if o.output_type == "error"], name
    assert "code cells ran" in (out_dir / "chunk.log").read_text()  # each step's line says how many of its cells ran


LEVERS = ["compile", "pad-64", "compile-static", "fused-adamw", "attention-flash"]  # the levers


def _listed(tmp_path: Path, *args: str) -> list[tuple[str, int, bool, str]]:
    """``--list``: each step as (step, seconds, only if time is left, where the figure comes from)."""
    out = _chunk(tmp_path, *args, "--list", timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stdout + out.stderr
    steps = []
    for line in out.stdout.splitlines():
        number, step, seconds, where = re.fullmatch(r" *(\d+)  (.+?) +(\d+) s  (.*)", line).groups()
        steps.append((step, int(seconds), where.startswith("[if time is left] "), where))
        assert int(number) == len(steps), line
    return steps


@pytest.mark.parametrize("profile", ["gpu", "ci"])
def test_the_levers_chunk_runs_each_lever_beside_its_pair_once_and_every_step_has_a_cost_row(
    tmp_path: Path, profile: str
) -> None:
    """The five levers and their pairs on 1.1B (a pair that another step runs, once), compile
    and its pair profiled, the cost of measuring in 3 tries, then the repeats the speed-verdict rule needs, each
    only if time is left (last, so that the deadline drops them first). Every step has its row in
    configs/gpu-chunk-costs.tsv on both profiles (a step without one starts with 60 s left, whatever it costs)."""
    import yaml

    steps = _listed(tmp_path, "levers", *(["--dry-run"] if profile == "ci" else []))
    assert [s for s, *_ in steps] == [
        "run compile --trace-steps 2", "run lora-1b --trace-steps 2", "run pad-64", "run small-batch",
        "run compile-static", "run fused-adamw", "run attention-flash", "run bf16-true", "overhead lora-1b 3",
        "run small-batch", "run bf16-true", "run lora-1b",
    ]  # fmt: skip
    assert [if_time for _, _, if_time, _ in steps] == [False] * 9 + [True] * 3
    assert not [s for s, *_, where in steps if "no row" in where], steps
    required = [s.split()[1] for s, _, if_time, _ in steps if not if_time and s.startswith("run ")]
    assert len(required) == len(set(required)), required  # each run once before the repeats
    experiments = yaml.safe_load((REPO / "configs" / "experiments" / "single.yaml").read_text())
    for lever in LEVERS:
        assert lever in required and experiments[lever]["pair"] in required, (lever, experiments[lever]["pair"])
    assert all(s.endswith("--trace-steps 2") for s, *_ in steps[:2])  # compile and its pair
    compiled = [(s, seconds, where) for s, seconds, _, where in steps if s.split()[1].startswith("compile")]
    if profile == "gpu":  # never timed on a GPU: the row says its allowance
        assert all("ALLOWANCE" in where for *_, where in compiled), compiled
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))  # --list runs nothing


def test_only_keeps_the_named_steps_in_the_chunks_order(tmp_path: Path) -> None:
    """A slice that stopped part-way: the next one runs only what it did not reach (single-7b's act-ckpt and
    full-7b are measured, its other 7B runs are not), in the chunk's order, if-time steps kept as such."""
    steps = _listed(tmp_path, "single-7b", "--only", "qlora-7b,lora-7b,one-gpu,adamw-8bit")
    assert [s for s, *_ in steps] == [
        "run one-gpu", "run adamw-8bit", "run lora-7b", "run qlora-7b", "run qlora-7b --set train.micro_batch_size=1",
    ]  # fmt: skip
    steps = _listed(tmp_path, "levers", "--only", "bf16-true")
    assert [(s, if_time) for s, _, if_time, _ in steps] == [("run bf16-true", False), ("run bf16-true", True)]


def test_list_is_every_chunks_steps_and_needs_no_output_folder(tmp_path: Path) -> None:
    speed = _listed(tmp_path, "speed", "--steps", "2")
    assert [(s, seconds) for s, seconds, *_ in speed] == [
        ("run lora-1b --trace-steps 2", 90), ("run bf16-true --trace-steps 2", 70)
    ]  # fmt: skip
    assert not any(if_time for _, _, if_time, _ in speed)


@pytest.mark.slow  # one compiled ci run, profiled, its compile cache cold (a private TMPDIR): ~90 s on 2 cores
def test_the_levers_chunks_compiled_run_records_its_compilation_and_ships_its_trace(tmp_path: Path) -> None:
    """The chunk's first step, as on a bare GPU node (nothing compiled before): the compiled run ends ok with what
    was compiled and how long it took in its record, and its profile trace comes back beside it."""
    out_dir = _dry_run_passes(tmp_path, "levers", steps=1)
    [record] = _records(out_dir)
    assert (record["experiment"], record["status"], record["profile"]) == ("compile", "ok", "ci"), record
    assert record["compiled"] and record["compile_s"] > 0, record
    _within_the_limits(out_dir)
    assert len(list(out_dir.glob("trace-*-compile-*.json.gz"))) == 1


@pytest.mark.slow  # a dry run's preflight and the ci models, no step (its deadline): ~15 s
def test_a_step_run_only_if_time_is_left_is_said_apart_from_those_the_deadline_cut(tmp_path: Path) -> None:
    """levers with a deadline that the preflight and checkpoints use up (a cost table where the first step needs the
    whole deadline, every other step more): every step is left out, the chunk fails for the required ones, and the
    repeats are named as run only if time is left, not as steps the deadline cut."""
    steps = _listed(tmp_path, "levers", "--dry-run")
    costs = tmp_path / "costs.tsv"
    rows = {}  # each step's key as the script makes it (its row_for)
    for step, *_ in steps:
        kind, exp_id = step.split()[:2]
        key = f"overhead-{exp_id}" if kind == "overhead" else exp_id + ("+trace" if "--trace-steps" in step else "")
        rows[key] = 20 if key == "compile+trace" else 9999
    costs.write_text("".join(f"{key}\tci\t{seconds}\ttest\n" for key, seconds in rows.items()))
    out_dir = tmp_path / "out"
    env = {**_env(tmp_path), "LAB_CHUNK_COSTS": str(costs)}
    try:
        out = subprocess.run(["bash", str(SCRIPT), "levers", "--dry-run", "--deadline-s", "20", "--out", str(out_dir)],
                             env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    finally:
        stragglers = _end_ours(tmp_path, timeout_s=30)
    assert out.returncode == 1 and not stragglers, out.stdout[-3000:] + out.stderr[-2000:]
    log = (out_dir / "chunk.log").read_text()
    assert "not run (deadline): run compile --trace-steps 2 run lora-1b --trace-steps 2 run pad-64" in log, log
    assert "not run (if time is left; none was): run small-batch run bf16-true run lora-1b\n" in log, log
    assert "not started (if time is left): run lora-1b (needs ~9999 s" in log, log
    assert _records(out_dir) == []
    _within_the_limits(out_dir)


# --- a chunk with its slow parts stubbed (tests/fixtures/chunk_python.sh): the script's own code in seconds ----------
STUB_PYTHON = REPO / "tests" / "fixtures" / "chunk_python.sh"
GRACE_S = 15  # SIGTERM to the chunk's group: the step in flight ends and the chunk ships within this


def _stubbed(tmp_path: Path, **env: str) -> dict[str, str]:
    """The chunk's environment with the stub as its Python (``LAB_PYTHON``), the real one behind it."""
    return {**_env(tmp_path), "LAB_PYTHON": str(STUB_PYTHON), "CHUNK_TEST_PYTHON": sys.executable, **env}


def _slow_notebook(folder: Path, name: str) -> None:
    """A notebook whose second cell is in flight for two minutes (it writes $TMPDIR/step-started first)."""
    import nbformat

    folder.mkdir(exist_ok=True)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("print('first cell')"),
        nbformat.v4.new_code_cell(
            "import os, time\nopen(os.path.join(os.environ['TMPDIR'], 'step-started'), 'w').close()\n"
            "for i in range(600):\n    print('cell line', i, flush=True)\n    time.sleep(0.2)"
        ),
        nbformat.v4.new_code_cell("print('last cell')"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, folder / f"{name}.ipynb")


# (chunk, --steps, the step in flight, the stub's environment, the partial output that step leaves in --out)
IN_FLIGHT = {
    "notebook": ("notebooks", "1", "step 1 (notebook 00_check_node)", {}, "00_check_node.ipynb"),
    "overhead": ("speed", "7", "step 7 (overhead lora-1b 3)", {"CHUNK_TEST_HANG": "overhead"},
                 "measurement-overhead.txt"),
}  # fmt: skip


def _start_mid_step(tmp_path: Path, kind: str) -> tuple[subprocess.Popen, Path]:
    """The chunk in its own session, its step of ``kind`` in flight (stubbed): the process and its --out."""
    chunk, steps, _, stub_env, _ = IN_FLIGHT[kind]
    notebooks = tmp_path / "notebooks"
    _slow_notebook(notebooks, "00_check_node")
    out_dir = tmp_path / "out"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), chunk, "--dry-run", "--steps", steps, "--out", str(out_dir)],
        env=_stubbed(tmp_path, CHUNK_TEST_NOTEBOOKS=str(notebooks), **stub_env),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    started = tmp_path / "tmp" / "step-started"
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started.exists() and proc.poll() is None, f"the {kind} step never started (exit {proc.poll()})"
    time.sleep(1)  # its first lines written
    return proc, out_dir


@pytest.mark.slow  # the stubbed chunk's preflight (512 MiB written) and one step: ~5 s; the notebook's kernel: ~10 s
@pytest.mark.parametrize("kind", ["notebook", "overhead"])
def test_a_sigterm_to_the_chunk_ends_a_notebook_or_overhead_step_in_flight_and_ships_its_partial_output(
    tmp_path: Path, kind: str
) -> None:
    """`timeout` gave the notebook and overhead steps a process group of their own: a SIGTERM to the chunk's group
    (the device's limit) during notebook 04 left it running until it finished, 24 s later (01: minutes past the
    limit). The step in flight must end within the grace period, its partial output shipped."""
    _, _, running, _, partial = IN_FLIGHT[kind]
    proc, out_dir = _start_mid_step(tmp_path, kind)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the chunk was still running {GRACE_S} s after a SIGTERM to its group ({kind} step)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stragglers = _end_ours(tmp_path, timeout_s=15)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not stragglers, stragglers
    assert f"ended by SIGTERM during {running}" in (out_dir / "chunk.log").read_text()
    shipped = (out_dir / partial).read_text()
    if kind == "notebook":  # the cells run so far, the one in flight with the lines it printed
        import nbformat

        cells = [c for c in nbformat.reads(shipped, as_version=4).cells if c.cell_type == "code"]
        assert cells[0].execution_count and "first cell" in cells[0].outputs[0]["text"], cells[0]
        assert "cell line 0" in "".join(o.get("text", "") for o in cells[1].outputs), cells[1]
        assert not cells[2].execution_count
    else:
        assert "step line 0" in shipped, shipped
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*"))
    _within_the_limits(out_dir)


@pytest.mark.slow  # as above
@pytest.mark.parametrize("kind", ["notebook", "overhead"])
def test_a_sigkill_to_the_chunks_group_leaves_nothing_of_a_notebook_or_overhead_step_running(
    tmp_path: Path, kind: str
) -> None:
    """A SIGKILL to the group left the notebook's executor and kernel alive (timeout's own process group): they
    wrote 04_what_if.ipynb into --out 4 s later, and the chunk's work folder stayed behind."""
    proc, out_dir = _start_mid_step(tmp_path, kind)
    before = sorted(p.name for p in out_dir.iterdir())
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        stragglers = _end_ours(tmp_path, timeout_s=10)  # the kernel notices its executor gone within ~1 s
    assert proc.returncode == -signal.SIGKILL
    assert not stragglers, f"left running after the group's SIGKILL: {stragglers}"
    time.sleep(1)
    assert sorted(p.name for p in out_dir.iterdir()) == before  # nothing written into --out after the kill
    assert not list((tmp_path / "tmp").glob("gpu-chunk-*")), "the killed chunk's work folder was left behind"


def test_relative_wheels_and_out_are_read_from_the_callers_directory(tmp_path: Path) -> None:
    """The script changed to the repository before reading its arguments: `--wheels whl` said "holds no wheels"
    where ./whl/*.whl exists (and a relative --out landed inside the repository)."""
    (tmp_path / "whl").mkdir()
    (tmp_path / "whl" / "stub-1.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "rel-out").mkdir()
    (tmp_path / "rel-out" / "runs.jsonl").write_text('{"experiment": "small-batch"}\n')  # a stop after --wheels
    out = subprocess.run(["bash", str(SCRIPT), "padding", "--dry-run", "--wheels", "whl", "--out", "rel-out"],
                         cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"gpu-chunk: --out {tmp_path / 'rel-out'} already holds a chunk's runs.jsonl"), (
        out.stderr
    )


@pytest.mark.slow  # the stubbed chunk's preflight and one step: ~5 s
def test_a_relative_out_lands_in_the_callers_directory_not_the_repository(tmp_path: Path) -> None:
    name = f"rel-out-{os.getpid()}-{time.monotonic_ns()}"
    try:
        out = subprocess.run(["bash", str(SCRIPT), "padding", "--dry-run", "--steps", "1", "--out", name],
                             cwd=tmp_path, env=_stubbed(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
        in_repo = (REPO / name).exists()
    finally:
        if (REPO / name).is_dir():
            import shutil

            shutil.rmtree(REPO / name)
        _end_ours(tmp_path, timeout_s=10)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert not in_repo, "a relative --out landed inside the repository"
    assert (tmp_path / name / "chunk.log").exists()


@pytest.mark.slow  # the stubbed chunk's preflight and one step: ~5 s
@pytest.mark.parametrize("records", [True, False])
def test_the_export_hint_is_quoted_and_only_printed_when_records_were_shipped(tmp_path: Path, records: bool) -> None:
    """The last line told to run `export-reference --from DIR/runs.jsonl` unquoted (an --out with a space gave a
    command that fails) and also where no record was shipped (nothing to export)."""
    import shlex

    out_dir = tmp_path / "out dir"
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "padding", "--dry-run", "--steps", "1", "--out", str(out_dir)],
            env=_stubbed(tmp_path, CHUNK_TEST_RECORDS="1" if records else "0"),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        _end_ours(tmp_path, timeout_s=10)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    log = (out_dir / "chunk.log").read_text()
    hints = [line for line in log.splitlines() if "export-reference" in line]
    if records:
        [hint] = hints
        command = shlex.split(hint.split("Export on the CPU: ", 1)[1])
        assert command == ["python", "-m", "lab_helpers", "export-reference", "--from", str(out_dir / "runs.jsonl")]
    else:
        assert not hints, hints
        assert "no record was shipped" in log, log


def _without_a_venv_on_path(env: dict[str, str]) -> dict[str, str]:
    """A new user's shell after scripts/setup-env.sh: the venv made but not activated (python3: the system's)."""
    venv_bins = {str(Path(sys.prefix) / "bin")} if sys.prefix != sys.base_prefix else set()  # never /usr/bin
    if env.get("VIRTUAL_ENV"):
        venv_bins.add(str(Path(env["VIRTUAL_ENV"]) / "bin"))
    path = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bins)
    return {k: v for k, v in env.items() if k not in ("LAB_PYTHON", "VIRTUAL_ENV")} | {"PATH": path}


@pytest.mark.slow  # the stubbed chunk's preflight and one step: ~5 s
def test_without_lab_python_the_chunk_runs_the_labs_venv(tmp_path: Path) -> None:
    """The documented first step run as a new user would (no LAB_PYTHON, the venv not activated) ran `python3` and
    stopped at "the imports failed: No module named 'litgpt'". Here LAB_VENV (setup-env.sh's) names a venv whose
    python is the stub."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(STUB_PYTHON)
    env = _without_a_venv_on_path(_stubbed(tmp_path)) | {"LAB_VENV": str(venv)}
    try:
        out = subprocess.run(["bash", str(SCRIPT), "padding", "--dry-run", "--steps", "1", "--out", str(tmp_path / "out")],
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        _end_ours(tmp_path, timeout_s=10)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"python {venv / 'bin' / 'python'}" in (tmp_path / "out" / "chunk.log").read_text()


@pytest.mark.slow  # a dry run's preflight and the ci models, no step (its deadline): ~15 s
def test_the_documented_dry_run_works_as_a_new_user_types_it(tmp_path: Path) -> None:
    """docs/measuring-on-a-gpu.md's first step, `bash scripts/gpu-chunk.sh CHUNK --dry-run --out "$(mktemp -d)"`,
    from the repository without LAB_PYTHON and without the venv activated: the repository's .venv runs it."""
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (scripts/setup-env.sh makes it)")
    costs = tmp_path / "costs.tsv"  # the first step needs the whole deadline: preflight, imports, models, no step
    costs.write_text("small-batch\tci\t20\ttest\n")
    env = {k: v for k, v in _without_a_venv_on_path(_env(tmp_path)).items() if k != "LAB_VENV"}
    try:
        out = subprocess.run(["bash", "scripts/gpu-chunk.sh", "padding", "--dry-run", "--deadline-s", "20", "--out",
                              str(tmp_path / "out")], cwd=REPO, env=env | {"LAB_CHUNK_COSTS": str(costs)},
                             capture_output=True, text=True, timeout=180)  # fmt: skip
    finally:
        _end_ours(tmp_path, timeout_s=30)
    log = (tmp_path / "out" / "chunk.log").read_text()
    assert "imports ok" in log and "the imports failed" not in log, log
    assert f"python {REPO / '.venv' / 'bin' / 'python'}" in log, log
    assert out.returncode == 1 and "not started: run small-batch" in log, out.stdout[-3000:] + out.stderr[-2000:]
