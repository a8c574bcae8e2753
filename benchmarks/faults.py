"""A matrix of faults against the real CLI and runner on the ci profile: nothing lost, nothing left running.

Each fault runs `python -m lab_helpers ...` (real litgpt / Lightning training processes on the tiny ci models)
in a results folder of its own, seeded with two earlier records, and checks afterwards:

* records lost: an earlier record missing or changed, or a run that should have stored a record (its launcher
  lived and the disk had room) without one. A launcher killed with kill -9 cannot record its run, and a record
  refused by a full disk is reported in one line and counted as "refused", not as lost;
* stray processes: any process still alive whose command line names the fault's results folder (training
  processes, ranks, data-loader workers), after a few seconds' grace for the orphan guard;
* the fault's own expectation (status, exit code, one-line error, no token stored ...).

Fixtures where a CPU cannot produce the fault on demand, as in tests/test_faults.py: a training process that
ignores SIGTERM stands for a rank stuck in a collective; a data loader that sleeps for a hung file system; a
SIGSTOPped rank for a hung rank; RLIMIT_FSIZE for a disk that fills up; a RuntimeError carrying the token for an
error that quotes it. The failing results disk is real: a 100 MB tmpfs in a mount namespace of the fault's
own (tests/disk_fault.py; those rows say "skipped" where user namespaces are off), filled up or covered read-only.
Round three adds: a record dated 2099 before a newer run, links planted where compare --out writes,
export-reference into another kind's file or under no file name, SIGRTMIN+1 and SIGTRAP, lab folders that are no
folders (and a byte that is not UTF-8), a closed or full stdout. Round four adds files planted where the lab reads:
the planner's cache (a FIFO, a link, an edited peak, another litgpt), bandwidth.json, an orphaned run's files, the
wheelhouse's inputs, and $LAB_RESULTS/runs or figures as links.

Usage: python benchmarks/faults.py   (under 10 minutes on 2 cores; one row per fault, then a summary line). The
unit tests (tests/test_faults.py) cover each fault separately, including a single Ctrl-C during training.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from disk_fault import CHATTY, LINGERS_AFTER_ITS_REPORT, namespaces_work, run_on_a_failing_disk  # noqa: E402

FAKE_TOKEN = "hf_FaultProbeTokenNotReal0123456789abcd"
SEED_RECORDS = [
    {"experiment": "seed-a", "status": "ok", "profile": "ci", "run_id": "seed-a"},
    {"experiment": "seed-b", "status": "oom", "profile": "ci", "run_id": "seed-b"},
]
BAD_SET_VALUES = [
    "train.max_steps=abc", "train=5", "data=x", "checkpoint_dir=null", "train.max_steps=[1",
    "out_dir=!!python/object/apply:os.system [ls]", "data.class_path=litgpt.tokenizer.Tokenizer",
    "train.max_steps=.nan", "train.epochs=0", "train.max_seq_length=0", "train.max_seq_length=-1",
    "train.log_interval=0", "data.init_args.num_workers=-1", "optimizer.init_args.lr=-0.001",
]  # fmt: skip
IGNORE_SIGTERM = """
    import os, signal
    if os.environ.get("LAB_REPORT_DIR"):
        _set = signal.signal
        _set(signal.SIGTERM, signal.SIG_IGN)
        signal.signal = lambda s, h: _set(s, signal.SIG_IGN if s == signal.SIGTERM else h)
"""
DEAD_DATA_LOADER = """
    import os
    if os.environ.get("LAB_REPORT_DIR"):
        import time, litgpt.data.json_data as j
        j.JSON.train_dataloader = lambda self: time.sleep(3600)
"""
LEAVES_CHILDREN_ON_STDOUT = """
    import os, subprocess, sys
    if os.environ.get("LAB_REPORT_DIR"):
        env = {k: v for k, v in os.environ.items() if k != "LAB_REPORT_DIR"}
        for session in (False, True):  # one helper in the group (as a data-loader worker), one that left it
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", os.environ["LAB_REPORT_DIR"]],
                             env=env, start_new_session=session)
"""
ERROR_WITH_TOKEN = """
    import os
    if os.environ.get("LAB_REPORT_DIR"):
        import litgpt.model
        def forward(self, *a, **k):
            raise RuntimeError("upload refused for token " + os.environ["HF_TOKEN"])
        litgpt.model.GPT.forward = forward
"""


@dataclass
class Row:
    fault: str
    expected: str
    observed: str = ""
    ok: bool = False
    lost: int = 0
    strays: int = 0
    refused: int = 0


class Fault:
    """One fault's own results folder, environment and checks."""

    def __init__(self, root: Path, name: str, fixture: str | None = None) -> None:
        self.dir = root / name.replace(" ", "-")
        self.results = self.dir / "results"
        self.results.mkdir(parents=True)
        with open(self.results / "runs.jsonl", "w") as fh:
            for record in SEED_RECORDS:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
        self.seed_bytes = (self.results / "runs.jsonl").read_bytes()
        self.env = {**os.environ, "LAB_RESULTS": str(self.results), "LAB_PROFILE": "ci", "LAB_TERMINATE_GRACE_S": "4"}
        self.env["XDG_STATE_HOME"] = str(self.dir / "state")  # a fallback off the results disk stays in the fault
        self.env.pop("HF_TOKEN", None)
        if fixture:
            site = self.dir / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(textwrap.dedent(fixture))
            self.env["PYTHONPATH"] = f"{site}{os.pathsep}{self.env.get('PYTHONPATH', '')}"

    def start(self, *args: str, preexec: Callable[[], None] | None = None) -> subprocess.Popen:
        def child_setup() -> None:
            # as from a terminal: a shell's background job (nohup ... &) starts with SIGINT ignored, inherited here
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and SIGHUP, which nohup ignores (inherited, and honoured)
            if preexec is not None:
                preexec()

        return subprocess.Popen(
            [sys.executable, "-m", "lab_helpers", *args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=child_setup,
        )

    def run(self, *args: str, timeout_s: float = 300, **kw) -> tuple[int, str, str]:
        proc = self.start(*args, **kw)
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err

    def new_records(self) -> list[dict]:
        import warnings

        from lab_helpers.record.records import read_records

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return read_records(self.results / "runs.jsonl")[len(SEED_RECORDS) :]

    def seeds_intact(self) -> bool:
        return (self.results / "runs.jsonl").read_bytes().startswith(self.seed_bytes)

    def strays(self, grace_s: float = 8.0) -> int:
        deadline = time.monotonic() + grace_s
        while True:
            alive = [p for p in _processes() if any(str(self.dir) in part for part in p[1])]
            if not alive or time.monotonic() > deadline:
                for pid, _ in alive:  # leave the machine clean for the next fault, but count them
                    _kill(pid)
                return len(alive)
            time.sleep(0.25)

    def wait_for_training(self, proc: subprocess.Popen, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            for log in self.results.glob("runs/*/output.log"):
                text = log.read_text(errors="replace")
                if " iter 2 " in text or "| iter 2 " in text or "iter 2 step" in text:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"training did not start in {self.dir}")

    def children(self, proc: subprocess.Popen, timeout_s: float = 60) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                found = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                found = []
            if found:
                return found
            time.sleep(0.02)
        return []


def _processes() -> list[tuple[int, list[str]]]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            out.append((proc.pid, proc.info["cmdline"] or []))
        except psutil.Error:
            continue
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _statuses(records: list[dict]) -> str:
    return ",".join(str(r.get("status")) for r in records) or "none"


def _finish(row: Row, fault: Fault, *, expect_records: int | None, ok: bool, observed: str) -> Row:
    """Common accounting: earlier records intact, the run's records there (unless none could be), no stray."""
    new = fault.new_records()
    row.lost = 0 if fault.seeds_intact() else len(SEED_RECORDS)
    if expect_records is not None and len(new) < expect_records:
        row.lost += expect_records - len(new)
    row.strays = fault.strays()
    row.observed = observed
    row.ok = ok and row.lost == 0 and row.strays == 0
    return row


# ------------------------------------------------------------------------------------------------- the faults


def interrupts(root: Path, times: int, *, moment: str, stuck: bool = False) -> Row:
    what = f"Ctrl-C x{times} {moment}" + (", rank deaf to SIGTERM" if stuck else "")
    row = Row(what, "interrupted recorded, exit 130")
    fault = Fault(root, f"int{times}-{moment}-{int(stuck)}", IGNORE_SIGTERM if stuck else None)
    proc = fault.start("run", "grad-accum", "--set", "train.max_steps=10000", "--quiet")
    if moment == "during training":
        fault.wait_for_training(proc)
    else:  # while the training process starts (imports, checkpoint load)
        fault.children(proc)
        time.sleep(1.0)
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.6)
    proc.communicate(timeout=120)
    new = fault.new_records()
    ok = proc.returncode == 130 and _statuses(new) == "interrupted"
    return _finish(row, fault, expect_records=1, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}")


def kill_launcher(root: Path, *, moment: str) -> Row:
    exp = "ddp" if moment == "while ranks import torch" else "grad-accum"
    row = Row(f"kill -9 launcher {moment} ({exp})", "no record possible; every training process ends")
    fault = Fault(root, f"kill-launcher-{exp}")
    proc = fault.start("run", exp, "--set", "train.max_steps=10000", "--quiet")
    if moment == "while ranks import torch":
        fault.children(proc)
    else:
        fault.wait_for_training(proc)
    proc.kill()
    proc.communicate()
    return _finish(row, fault, expect_records=0, ok=True, observed=f"launcher {proc.returncode}")


def kill_rank(root: Path) -> Row:
    row = Row("kill -9 of rank 1 (ddp, 2 ranks)", "error recorded for each rank, exit 1")
    fault = Fault(root, "kill-rank")
    proc = fault.start("run", "ddp", "--set", "train.max_steps=10000", "--quiet")
    fault.wait_for_training(proc)
    children = fault.children(proc)
    ranks1 = [p for p in children if "LOCAL_RANK=1" in _environ(p)]
    rank1 = [p for p in ranks1 if p.ppid() not in {q.pid for q in ranks1}]  # the rank, not its loader workers
    for p in rank1:
        p.kill()
    proc.communicate(timeout=180)
    new = fault.new_records()
    ok = bool(rank1) and proc.returncode == 1 and len(new) == 2 and {r["status"] for r in new} == {"error"}
    return _finish(row, fault, expect_records=2, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}")


def _environ(proc: psutil.Process) -> str:
    try:
        return " ".join(f"{k}={v}" for k, v in proc.environ().items())
    except psutil.Error:
        return ""


def hung_rank(root: Path) -> Row:
    row = Row("hung rank (SIGSTOP rank 1, ddp), --time-limit 35", "timeout recorded for each rank")
    fault = Fault(root, "hung-rank")
    proc = fault.start("run", "ddp", "--set", "train.max_steps=10000", "--time-limit", "35", "--quiet")
    fault.wait_for_training(proc)
    for p in fault.children(proc):
        if "LOCAL_RANK=1" in _environ(p):
            p.suspend()
    proc.communicate(timeout=180)
    new = fault.new_records()
    ok = proc.returncode == 1 and len(new) == 2 and {r["status"] for r in new} == {"timeout"}
    return _finish(row, fault, expect_records=2, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}")


def hung_data_loader(root: Path) -> Row:
    row = Row("dead data loader, --time-limit 15", "timeout recorded")
    fault = Fault(root, "hung-loader", DEAD_DATA_LOADER)
    code, _, _ = fault.run("run", "grad-accum", "--time-limit", "15", "--quiet")
    new = fault.new_records()
    ok = code == 1 and _statuses(new) == "timeout"
    return _finish(row, fault, expect_records=1, ok=ok, observed=f"exit {code}, {_statuses(new)}")


def _file_size_limit(limit_bytes: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited: write() fails with EFBIG, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def disk_full_during_run(root: Path) -> Row:
    row = Row("disk fills during a run (files stop at 12 KiB)", "run ends; record stored or refused in one line")
    fault = Fault(root, "disk-run")
    code, _, err = fault.run("run", "grad-accum", "--set", "train.max_steps=3", preexec=_file_size_limit(12 * 1024))
    new = fault.new_records()
    refused = "could not store the record" in err
    one_line = len(err.strip().splitlines()) <= 1 if refused else True
    row.refused = int(refused and not new)
    ok = one_line and (len(new) == 1 or refused)
    observed = f"exit {code}, " + ("record refused in one line" if refused else _statuses(new))
    if new and new[0].get("log_error"):
        observed += " (log cut short, said in the record)"
    return _finish(row, fault, expect_records=0 if refused else 1, ok=ok, observed=observed)


def disk_full_during_append(root: Path) -> Row:
    row = Row("disk full during the append (qlora-7b: skipped)", "refused in one line; file as it was")
    fault = Fault(root, "disk-append")
    size = len(fault.seed_bytes)
    code, _, err = fault.run("run", "qlora-7b", preexec=_file_size_limit(size + 200))
    same = (fault.results / "runs.jsonl").read_bytes() == fault.seed_bytes
    ok = code == 1 and same and err.strip().startswith("error: could not store") and len(err.strip().splitlines()) == 1
    row.refused = 1
    return _finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}, file unchanged: {same}")


def damaged_file(root: Path) -> Row:
    row = Row("damaged results file (half a line at the end)", "new record fenced off; earlier ones readable")
    fault = Fault(root, "damaged")
    with open(fault.results / "runs.jsonl", "ab") as fh:
        fh.write(b'{"experiment": "cut-off", "sta')
    fault.seed_bytes = (fault.results / "runs.jsonl").read_bytes()
    code, _, _ = fault.run("run", "lora-1b", "--set", "train.max_steps=2", "--quiet")
    import warnings

    from lab_helpers.record.records import read_records

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stored = read_records(fault.results / "runs.jsonl")
    names = [r["experiment"] for r in stored]
    ok = code == 0 and names == ["seed-a", "seed-b", "lora-1b"] and len(caught) == 1
    return _finish(row, fault, expect_records=None, ok=ok, observed=f"exit {code}, read back {names}")


def bad_set_values(root: Path) -> list[Row]:
    """Every bad value through the CLI's own ``main`` in one process (the imports are paid once, not per value)."""
    fault = Fault(root, "set-values")
    script = textwrap.dedent(
        """
        import contextlib, io, json, sys
        from lab_helpers.cli import main
        for pair in json.loads(sys.argv[1]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = main(["run", "grad-accum", "--set", pair])
            print(json.dumps([pair, code, err.getvalue()]), flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(BAD_SET_VALUES)],
        cwd=ROOT, env=fault.env, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    rows = []
    started_nothing = not (fault.results / "runs").exists() and not fault.new_records()
    for line in out.splitlines():
        pair, code, err = json.loads(line)
        lines = err.strip().splitlines()
        ok = code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and started_nothing
        row = Row(f"--set {pair}", "exit 2, one line, nothing started")
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}: {lines[0] if lines else ''}"))
    if len(rows) != len(BAD_SET_VALUES):
        rows.append(Row("--set values", "one row per value", observed=f"{len(rows)} of {len(BAD_SET_VALUES)} ran"))
    row = Row("--set out_dir=2024-01-01 (YAML reads a date)", "run ok, record stored")
    fault = Fault(root, "set-date")
    code, _, _ = fault.run("run", "lora-1b", "--set", "out_dir=2024-01-01", "--set", "train.max_steps=2", "--quiet")
    new = fault.new_records()
    rows.append(_finish(row, fault, expect_records=1, ok=code == 0 and _statuses(new) == "ok",
                        observed=f"exit {code}, {_statuses(new)}"))  # fmt: skip
    return rows


def token_in_error(root: Path) -> Row:
    row = Row("HF token in the environment and in an error", "error recorded; no file or export holds the token")
    fault = Fault(root, "token", ERROR_WITH_TOKEN)
    fault.env["HF_TOKEN"] = FAKE_TOKEN
    home = fault.dir / "home"
    home.mkdir()
    (home / "configs").symlink_to(ROOT / "configs")
    code, out, err = fault.run("run", "lora-1b", "--set", "train.max_steps=2", "--quiet")
    fault.env["LAB_HOME"] = str(home)
    fault.run("export-reference", "probe")
    new = fault.new_records()
    leaks = [p for p in fault.dir.rglob("*") if p.is_file() and p.name != "sitecustomize.py"
             and FAKE_TOKEN in p.read_text(errors="replace")]  # fmt: skip
    leaks += ["stdout/stderr"] if FAKE_TOKEN in out + err else []
    ok = _statuses(new) == "error" and "***" in (new[0].get("error") or "") and not leaks
    return _finish(
        row, fault, expect_records=1, ok=ok, observed=f"{_statuses(new)}, files with the token: {len(leaks)}"
    )


# ------------------------------------------------------------------ round two


def closed_output(root: Path) -> Row:
    row = Row("stdout closed after 3 lines (| head -3)", "ok recorded; the run goes on to its end")
    fault = Fault(root, "head")
    proc = fault.start("run", "grad-accum", "--set", "train.max_steps=10")
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()  # what `head -3` does when it has its lines
    proc.wait(timeout=300)
    err = proc.stderr.read()
    new = fault.new_records()
    ok = _statuses(new) == "ok" and "Traceback" not in err
    return _finish(row, fault, expect_records=1, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}")


def hang_up(root: Path) -> Row:
    row = Row("terminal hangs up (SIGHUP) during training", "interrupted recorded, naming SIGHUP")
    fault = Fault(root, "sighup")
    proc = fault.start("run", "grad-accum", "--set", "train.max_steps=10000")
    fault.wait_for_training(proc)
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=120)
    new = fault.new_records()
    ok = _statuses(new) == "interrupted" and "SIGHUP" in (new[0].get("reason") or "")
    return _finish(row, fault, expect_records=1, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}")


def results_file_breaks(root: Path) -> Row:
    row = Row("runs.jsonl turned into a directory mid-run", "in its run folder, 1 line; next command adds it")
    fault = Fault(root, "fallback")
    proc = fault.start("run", "grad-accum", "--set", "train.max_steps=6", "--quiet")
    fault.wait_for_training(proc)
    (fault.results / "runs.jsonl").rename(fault.results / "seeds.jsonl")
    (fault.results / "runs.jsonl").mkdir()
    _, err = proc.communicate(timeout=300)
    from lab_helpers.record.records import read_records

    kept = [r for path in fault.results.glob("runs/*/record.jsonl") for r in read_records(path)]
    said = [line for line in err.splitlines() if "the next lab command adds it" in line]
    (fault.results / "runs.jsonl").rmdir()
    (fault.results / "seeds.jsonl").rename(fault.results / "runs.jsonl")
    code, _, later = fault.run("results")
    ok = _statuses(kept) == "ok" and len(said) == 1 and code == 0 and "Traceback" not in err + later
    observed = f"exit {proc.returncode}, kept {_statuses(kept)}, lines {len(said)}; results: exit {code}"
    return _finish(row, fault, expect_records=1, ok=ok, observed=observed)


def refused_up_front(root: Path) -> list[Row]:
    """Each bad results folder or limit: one line, exit 2, no run folder, nothing started."""
    rows = []
    cases = [
        ("runs.jsonl a symlink to another file", "link", ["run", "grad-accum"], None),
        ("LAB_RESULTS=/proc/x", "proc", ["run", "grad-accum"], None),
        ("results disk full at start (RLIMIT_FSIZE 0)", "full-start", ["run", "grad-accum"], _file_size_limit(0)),
        ("--time-limit 1e10", "limit", ["run", "grad-accum", "--time-limit", "1e10"], None),
        ("plan --fit --gpu-memory-gib nan", "nan", ["plan", "configs/ci/ci-llama-xs/full.yaml", "--fit",
                                                    "--gpu-memory-gib", "nan"], None),
    ]  # fmt: skip
    for name, folder, args, preexec in cases:
        fault = Fault(root, folder)
        target = fault.dir / "other-file"
        target.write_text("untouched\n")
        if folder == "link":
            (fault.results / "runs.jsonl").unlink()
            (fault.results / "runs.jsonl").symlink_to(target)
        if folder == "proc":
            fault.env["LAB_RESULTS"] = "/proc/x"
        code, _, err = fault.run(*args, preexec=preexec)
        lines = err.strip().splitlines()
        nothing = not (fault.results / "runs").exists() and target.read_text() == "untouched\n"
        ok = code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and nothing
        row = Row(name, "exit 2, one line, nothing started")
        row.strays = fault.strays()
        row.ok = ok and row.strays == 0
        row.observed = f"exit {code}: {lines[0] if lines else ''}"
        rows.append(row)
    return rows


def relative_results(root: Path) -> Row:
    row = Row("relative LAB_RESULTS, started from another folder", "ok recorded in that folder")
    fault = Fault(root, "relative")
    fault.env["LAB_RESULTS"] = "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab_helpers", "run", "grad-accum", "--set", "train.max_steps=2", "--quiet"],
        cwd=fault.dir, env={**fault.env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    proc.communicate(timeout=300)
    new = fault.new_records()
    return _finish(row, fault, expect_records=1, ok=_statuses(new) == "ok",
                   observed=f"exit {proc.returncode}, {_statuses(new)}")  # fmt: skip


def absurd_micro_batch(root: Path) -> Row:
    row = Row("plan micro batch 1e9, global batch 1e9", "an answer in seconds, bounded memory")
    fault = Fault(root, "absurd")
    started = time.monotonic()
    proc = fault.start("plan", "configs/ci/ci-llama-xs/full.yaml", "--set", "train.micro_batch_size=1000000000",
                       "--set", "train.global_batch_size=1000000000")  # fmt: skip
    rss_gib = 0.0
    while proc.poll() is None and time.monotonic() - started < 120:
        try:
            rss_gib = max(rss_gib, psutil.Process(proc.pid).memory_info().rss / 2**30)
        except psutil.Error:
            pass
        time.sleep(0.2)
    proc.communicate(timeout=60)
    seconds = time.monotonic() - started
    ok = proc.returncode == 0 and seconds < 60 and rss_gib < 2
    return _finish(row, fault, expect_records=0, ok=ok,
                   observed=f"exit {proc.returncode} in {seconds:.0f} s, RSS {rss_gib:.1f} GiB")  # fmt: skip


def hostile_lines(root: Path) -> Row:
    row = Row("hostile lines in runs.jsonl (rank 1e400, dict, /etc/passwd)", "compare and export work on the rest")
    fault = Fault(root, "hostile")
    secret = fault.dir / "secret.csv"
    secret.write_text("t_s\nSECRET\n")
    (fault.results / "runs" / "x").mkdir(parents=True)
    (fault.results / "runs" / "x" / "timeline.csv").symlink_to(secret)  # a link leading out of the results
    with open(fault.results / "runs.jsonl", "a") as fh:
        fh.write('{"experiment": "a", "status": "ok", "rank": 1e400}\n{"experiment": {"x": 1}, "status": "ok"}\n')
        fh.write('{"experiment": "b", "status": "ok", "timeline_path": "/etc/passwd"}\n')
        fh.write('{"experiment": "c", "status": "ok", "profile": "ci", "run_id": "x", '
                 '"timeline_path": "runs/x/timeline.csv"}\n')  # fmt: skip
    home = fault.dir / "home"
    home.mkdir()
    (home / "configs").symlink_to(ROOT / "configs")
    fault.env["LAB_HOME"] = str(home)
    compare_code, _, _ = fault.run("compare", "--out", str(fault.dir / "figures"))
    export_code, _, _ = fault.run("export-reference", "probe", "--profile", "ci")
    exported = home / "reference_results"
    leaked = [p for p in exported.rglob("*") if p.is_file() and "SECRET" in p.read_text(errors="replace")]
    ok = compare_code == 0 and export_code == 0 and not leaked and (exported / "probe.jsonl").is_file()
    row.ok, row.observed = ok, f"compare {compare_code}, export {export_code}, secrets copied {len(leaked)}"
    row.strays = fault.strays()
    return row


# ------------------------------------------------------------------ round three


def indexed_three_at_once(root: Path) -> Row:
    """A run folder's record that runs.jsonl lacks, and three commands starting at once: each adds what it lacks."""
    row = Row("3 commands at once, runs.jsonl lacking a record", "each record added once, no traceback")
    fault = Fault(root, "index-three")
    kept = fault.results / "runs" / "r45" / "record.jsonl"
    kept.parent.mkdir(parents=True)
    with open(kept, "w") as fh:
        for rank in range(64):
            fh.write(json.dumps({"experiment": "x", "status": "ok", "run_id": "r45", "rank": rank}) + "\n")
    procs = [fault.start("results") for _ in range(3)]
    said = [(proc.wait(timeout=120), *proc.communicate()) for proc in procs]
    new = fault.new_records()
    keys = {(r["run_id"], r["rank"]) for r in new}
    clean = all(code == 0 and "Traceback" not in err for code, _, err in said)
    ok = clean and len(new) == len(keys) == 64 and sum("added the record of run r45" in err for *_, err in said) == 1
    codes = ",".join(str(code) for code, _, _ in said)
    return _finish(row, fault, expect_records=64, ok=ok, observed=f"exits {codes}, {len(new)} lines, {len(keys)} runs")


def children_hold_output(root: Path) -> Row:
    row = Row("children hold the run's stdout, --time-limit 60", "ok recorded within the limit, helpers killed")
    fault = Fault(root, "held-output", LEAVES_CHILDREN_ON_STDOUT)
    started = time.monotonic()
    code, _, _ = fault.run("run", "grad-accum", "--set", "train.max_steps=6", "--time-limit", "60", "--quiet")
    took = time.monotonic() - started
    new = fault.new_records()
    ok = code == 0 and _statuses(new) == "ok" and took < 60 + 15
    return _finish(row, fault, expect_records=1, ok=ok, observed=f"exit {code} in {took:.0f} s, {_statuses(new)}")


FAKE_GHP = "ghp_FaultProbeNotReal0123456789abcdefABCD"  # GitHub's classic shape, in GITHUB_PAT (not a name it knew)
PRINTS_AND_QUOTES_GHP = """
    import os
    if os.environ.get("LAB_REPORT_DIR"):
        import atexit, base64, sys, urllib.parse
        tok = os.environ["GITHUB_PAT"]
        print("url", urllib.parse.quote(tok + "/x", safe=""), "basic", base64.b64encode(b"u:" + tok.encode()).decode())
        print("wrapped " + tok[:15] + "\\n" + tok[15:], flush=True)
        atexit.register(lambda: (print("RuntimeError: 401 for " + tok, file=sys.stderr, flush=True), os._exit(3)))
"""


def secrets_by_shape(root: Path) -> Row:
    row = Row("ghp_ in GITHUB_PAT: encoded, split, in an error", "error recorded; no log, CSV or export holds it")
    fault = Fault(root, "secret-shapes", PRINTS_AND_QUOTES_GHP)
    fault.env["GITHUB_PAT"] = FAKE_GHP
    data = fault.dir / "hf_abcdefghijklmnopqrstdata2024"  # a data folder that merely looks like a token: must work
    shutil.copytree(ROOT / "data" / "ci", data / "ci")
    fault.env["LAB_DATA"] = str(data)
    code, out, err = fault.run("run", "grad-accum", "--set", "train.max_steps=2", "--set", f"access_token={FAKE_TOKEN}")
    said = out + err + "".join(fault.run("results", "--format", "csv")[1:])
    said += "".join(fault.run("compare", "--out", str(fault.dir / "figures"))[1:])
    home = fault.dir / "home"
    home.mkdir()
    (home / "configs").symlink_to(ROOT / "configs")
    fault.env["LAB_HOME"] = str(home)
    said += "".join(fault.run("export-reference", "--profile", "ci")[1:])
    new = fault.new_records()
    pieces = (FAKE_GHP, FAKE_GHP[:15], FAKE_GHP[15:], FAKE_TOKEN)
    files = [p for p in fault.dir.rglob("*") if p.is_file() and p.name != "sitecustomize.py" and "/ci/" not in str(p)]
    leaks = [p.name for p in files if any(s in p.read_text(errors="replace") for s in pieces)]
    leaks += ["output"] if any(s in said for s in pieces) else []
    trained = bool(new) and (new[0].get("iterations") or 0) > 0
    ok = _statuses(new) == "error" and trained and not leaks and any(p.suffix == ".csv" for p in files)
    observed = f"{_statuses(new)}, trained {trained}, files or output with it: {len(leaks)}"
    return _finish(row, fault, expect_records=1, ok=ok, observed=observed)


def _alias_bomb(levels: int = 9) -> str:
    parts = ["&b0 [" + ",".join(["x"] * 10) + "]"]
    parts += [f"&b{i} [" + ",".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def bounded_values(root: Path) -> list[Row]:
    """Values YAML would expand, Python would refuse, or a terminal would act on: each one line, exit 2, at once,
    through the CLI's own ``main`` in one process (as bad_set_values)."""
    fault = Fault(root, "bounded-values")
    recipe = str(ROOT / "configs" / "ci" / "ci-llama-xs" / "full.yaml")
    bomb_file, token_file = fault.dir / "bomb.yaml", fault.dir / "token.txt"
    bomb_file.write_text(f"checkpoint_dir: x\ntrain:\n  micro_batch_size: {_alias_bomb()}\n")
    token_file.write_text(FAKE_TOKEN + "\n")
    cases = [
        ("run --set an alias bomb (10**9 once expanded)", ["run", "grad-accum", "--set", f"train.max_steps={_alias_bomb()}"]),
        ("plan --set an alias bomb", ["plan", recipe, "--set", f"train.micro_batch_size={_alias_bomb()}"]),
        ("plan RECIPE holding an alias bomb", ["plan", str(bomb_file)]),
        ("run --set a 5000-digit integer", ["run", "grad-accum", "--set", "train.max_steps=" + "9" * 5000]),
        ("run --set a list nested 5000 deep", ["run", "grad-accum", "--set", "train.max_steps=" + "[" * 5000]),
        ("plan --fit --gpu-memory-gib 1e308", ["plan", recipe, "--fit", "--device", "cpu", "--gpu-memory-gib", "1e308"]),
        ("run --set a terminal escape sequence", ["run", "grad-accum", "--set", "out_dir=\x1b]0;owned\x07\x1b[2J"]),
        ("plan --time --sample-lengths a token file", ["plan", recipe, "--time", "--sample-lengths", str(token_file)]),
    ]  # fmt: skip
    script = textwrap.dedent(
        """
        import contextlib, io, json, sys, time
        from lab_helpers.cli import main
        for argv in json.loads(sys.argv[1]):
            err, started = io.StringIO(), time.monotonic()
            with contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except BaseException as exc:  # a traceback is the fault: count it, go on
                    code, _ = 1, err.write("Traceback: " + type(exc).__name__)
            print(json.dumps([code, err.getvalue(), time.monotonic() - started]), flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps([argv for _, argv in cases])],
        cwd=ROOT, env=fault.env, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    rows = []
    for (label, _), line in zip(cases, out.splitlines(), strict=False):
        code, err, took = json.loads(line)
        lines = err.strip().splitlines()
        shown = lines[0] if lines else ""
        clean = "\x1b" not in err and "\x07" not in err and FAKE_TOKEN not in err and len(err) < 400
        ok = code == 2 and len(lines) == 1 and shown.startswith("error: ") and clean and took < 30  # the bomb took 63 s
        started_nothing = not (fault.results / "runs").exists() and not fault.new_records()
        row = Row(label, "exit 2, one line, nothing expanded or echoed")
        observed = f"exit {code} in {took:.1f} s: {shown[:40]}"
        rows.append(_finish(row, fault, expect_records=0, ok=ok and started_nothing, observed=observed))
    if len(rows) != len(cases):
        rows.append(Row("bounded values", "one row per case", observed=f"{len(rows)} of {len(cases)} ran"))
    return rows


def disk_fails_during_run(root: Path, fault: str) -> Row:
    """A real 100 MB tmpfs as LAB_RESULTS (tests/disk_fault.py: a mount namespace of its own) that fills up, or that
    every later open finds read-only, while the run trains."""
    what = {"fill": "fills up", "readonly": "turns read-only"}[fault]
    row = Row(f"results disk (100 MB tmpfs) {what} mid-run", "result printed; record off the disk, then added back")
    if not namespaces_work():
        return Row(row.fault, row.expected, observed="skipped: no user namespaces here", ok=True)
    where = Fault(root, f"disk-{fault}")
    seen = run_on_a_failing_disk(where.dir, fault, ["run", "grad-accum", "--set", "train.max_steps=6", "--quiet"],
                                 where.env)  # fmt: skip
    said = seen["stderr"].strip().splitlines()
    empty = [name for name, size in seen["files"].items() if size == 0 and name.endswith(".jsonl")]
    merged = seen.get("next_command", {}).get("returncode") == 0 and len(seen.get("records_after", [])) == 1
    printed = any(line.startswith("grad-accum: ") for line in seen["stdout"].splitlines())
    off_disk = seen.get("fallback", "").startswith(str(where.dir / "state"))
    row.lost = 0 if merged else 1
    row.strays = seen["strays"]
    row.ok = (printed and off_disk and merged and not empty and len(said) == 1 and "Traceback" not in seen["stderr"]
              and row.strays == 0)  # fmt: skip
    row.observed = (f"exit {seen['returncode']}, printed {printed}, fallback off the disk {off_disk}, "
                    f"added back {merged}, 0-byte {len(empty)}, lines {len(said)}")  # fmt: skip
    return row


def output_larger_than_disk(root: Path) -> Row:
    row = Row("150 MiB output + a 300 MiB line, 100 MB results disk", "ok recorded; log capped; launcher bounded")
    if not namespaces_work():
        return Row(row.fault, row.expected, observed="skipped: no user namespaces here", ok=True)
    where = Fault(root, "disk-chatty", CHATTY)
    env = {**where.env, "LAB_LOG_MAX_MIB": "4"}
    seen = run_on_a_failing_disk(where.dir, "none", ["run", "grad-accum", "--set", "train.max_steps=3", "--quiet"], env)
    log_mib = max((size for name, size in seen["files"].items() if name.endswith("output.log")), default=0) / 2**20
    rss = seen["launcher_peak_rss_mib"]
    row.lost = 0 if len(seen["records"]) == 1 else 1
    row.strays = seen["strays"]
    row.ok = _statuses(seen["records"]) == "ok" and log_mib <= 4.01 and rss < 800 and row.strays == 0
    row.observed = f"exit {seen['returncode']}, {_statuses(seen['records'])}, log {log_mib:.1f} MiB, RSS {rss:.0f} MiB"
    return row


def launcher_killed_after_training(root: Path) -> Row:
    row = Row("kill -9 launcher after its training ended", "next `results` records it once, marked recovered")
    fault = Fault(root, "orphaned-report", LINGERS_AFTER_ITS_REPORT)
    proc = fault.start("run", "grad-accum", "--set", "train.max_steps=4", "--quiet")
    deadline = time.monotonic() + 240
    while not any("fixture: report written" in log.read_text(errors="replace")
                  for log in fault.results.glob("runs/*/output.log")):  # fmt: skip
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the run never wrote its report")
        time.sleep(0.1)
    proc.kill()
    proc.communicate()
    before = len(fault.new_records())
    code, _, err = fault.run("results")
    again_code, _, again = fault.run("results")
    new = fault.new_records()
    said = [line for line in err.splitlines() if line.startswith("lab: recovered the record of run")]
    ok = before == 0 and code == again_code == 0 and len(said) == 1 and not again.strip()
    ok = ok and _statuses(new) == "ok" and bool(new[0].get("recovered"))
    return _finish(row, fault, expect_records=1, ok=ok,
                   observed=f"before {before}, after {_statuses(new)} (recovered), lines {len(said)}")  # fmt: skip


# ------------------------------------------------------------------ round three: the rest


def odd_start_time(root: Path) -> Row:
    """A record whose started_at is in 2099 (a clock ahead, an edited record), then a real run of the same
    experiment: every table shows the newer run, and the odd time is named."""
    row = Row("started_at 2099 on a record, then a newer run", "the newer run in the tables; the odd time named")
    fault = Fault(root, "odd-start")
    with open(fault.results / "runs.jsonl", "a") as fh:  # an edited record, as a hand or a wrong clock left it
        fh.write(json.dumps({"experiment": "grad-accum", "status": "ok", "profile": "ci", "run_id": "ahead",
                             "started_at": "2099-01-01T00:00:00+00:00", "train_s": 999.0}) + "\n")  # fmt: skip
    fault.seed_bytes = (fault.results / "runs.jsonl").read_bytes()
    code, _, _ = fault.run("run", "grad-accum", "--set", "train.max_steps=2", "--quiet")
    compare_code, out, err = fault.run("compare", "--out", str(fault.dir / "figures"))
    table = (fault.dir / "figures" / "comparison.csv").read_text() if compare_code == 0 else ""
    new = fault.new_records()[1:]
    row_of = [line for line in table.splitlines() if line.startswith("grad-accum,")]
    shown_new = len(row_of) == 1 and ",999.0," not in row_of[0]
    named = "2099-01-01" in err and "odd start time" in err and "Traceback" not in err
    ok = code == 0 and compare_code == 0 and _statuses(new) == "ok" and shown_new and named
    observed = f"run {code}, compare {compare_code}, newer shown {shown_new}, odd named {named}"
    return _finish(row, fault, expect_records=2, ok=ok, observed=observed)


def _one_line(code: int, err: str) -> tuple[bool, str]:
    lines = err.strip().splitlines()
    shown = lines[0] if lines else ""
    return code == 2 and len(lines) == 1 and shown.startswith("error: ") and "Traceback" not in err, shown


def planted_links(root: Path) -> list[Row]:
    """compare --out writes by the rule of runs.jsonl: never through a link planted as one of its files, and a
    --out that is no folder is one line."""
    rows = []
    fault = Fault(root, "planted-links")
    victim = fault.dir / "victim.txt"
    victim.write_text("untouched\n")
    (fault.dir / "a-file").write_text("")
    cases = [("compare --out DIR, DIR/comparison.csv a link", "comparison.csv"),
             ("compare --out DIR, DIR/memory.png a link", "memory.png"),
             ("compare --out a regular file", None), ("compare --out /proc/x", None),
             ("compare --out /dev/null", None)]  # fmt: skip
    for name, planted in cases:
        out = fault.dir / f"out-{len(rows)}"
        if planted is not None:
            out.mkdir()
            (out / planted).symlink_to(victim)
        else:
            out = {"compare --out a regular file": fault.dir / "a-file"}.get(name, Path(name.split()[-1]))
        code, _, err = fault.run("compare", "--out", str(out))
        ok, shown = _one_line(code, err)
        ok = ok and victim.read_text() == "untouched\n" and (fault.dir / "a-file").read_text() == ""
        row = Row(name, "exit 2, one line, nothing written through")
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}: {shown[7:]}"))
    return rows


def export_refused(root: Path) -> list[Row]:
    """export-reference from the ci profile into the shipped H100 file, or to a name that is no file name."""
    rows = []
    fault = Fault(root, "export-refused")
    home = fault.dir / "home"
    (home / "reference_results").mkdir(parents=True)
    (home / "configs").symlink_to(ROOT / "configs")
    shipped = home / "reference_results" / "h100-80gb.jsonl"
    shutil.copyfile(ROOT / "reference_results" / "h100-80gb.jsonl", shipped)
    fault.env["LAB_HOME"] = str(home)
    cases = [("export-reference h100-80gb from the ci profile", ["h100-80gb"]),
             ("export-reference .", ["."]), ("export-reference <a 300-character name>", ["x" * 300])]  # fmt: skip
    before = shipped.read_bytes()
    for name, args in cases:
        code, _, err = fault.run("export-reference", *args, "--profile", "ci")
        ok, shown = _one_line(code, err)
        names = sorted(p.name for p in (home / "reference_results").iterdir())
        ok = ok and shipped.read_bytes() == before and names == ["h100-80gb.jsonl"]
        row = Row(name, "exit 2, one line, no reference file changed")
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}: {shown[7:]}"))
    code, _, _ = fault.run("export-reference", "h100-80gb", "--profile", "ci", "--force")
    forced = shipped.read_bytes()
    ok = code == 0 and forced.startswith(before) and len(forced.splitlines()) == len(before.splitlines()) + 2
    row = Row("export-reference h100-80gb --force (ci)", "the ci records added after the shipped ones")
    rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}, shipped lines kept {ok}"))
    return rows


def other_ending_signals(root: Path) -> list[Row]:
    rows = []
    for name, signum in (("SIGRTMIN+1", signal.SIGRTMIN + 1), ("SIGTRAP", signal.SIGTRAP)):
        row = Row(f"{name} to the CLI during training", f"interrupted recorded, naming {name}, exit 130")
        fault = Fault(root, f"signal-{signum}")
        proc = fault.start("run", "grad-accum", "--set", "train.max_steps=10000")
        fault.wait_for_training(proc)
        proc.send_signal(signum)
        proc.communicate(timeout=120)
        new = fault.new_records()
        ok = proc.returncode == 130 and _statuses(new) == "interrupted" and name in (new[0].get("reason") or "")
        rows.append(_finish(row, fault, expect_records=1, ok=ok, observed=f"exit {proc.returncode}, {_statuses(new)}"))
    return rows


def bad_locations(root: Path) -> list[Row]:
    """LAB_RESULTS, LAB_CHECKPOINTS, LAB_DATA as what is no folder the lab can use, for compare and prepare (and a
    run, for a byte that is not UTF-8): one line and exit 2 each, nothing created; through the CLI's own main in one
    process per value, as bounded_values."""
    fault = Fault(root, "bad-locations")
    (fault.dir / "a-file").write_text("")
    (fault.dir / "dangling").symlink_to(fault.dir / "nowhere")
    values = {"/proc/x": "/proc/x", "a regular file": str(fault.dir / "a-file"),
              "a dangling link": str(fault.dir / "dangling"), "a 300-character name": str(fault.dir / ("n" * 300)),
              "a non-UTF-8 byte": os.fsdecode(bytes(fault.dir) + b"/d\xffata")}  # fmt: skip
    script = textwrap.dedent(
        """
        import contextlib, io, json, os, sys
        from lab_helpers.cli import main
        for name, value, argv in json.loads(sys.argv[1]):
            env = dict(os.environ)
            os.environ[name] = value  # a byte that is not UTF-8 comes as a surrogate escape, as Python reads it
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = main(argv)
                except BaseException as exc:  # a traceback is the fault: count it, go on
                    code, _ = 1, err.write("Traceback: " + type(exc).__name__)
            os.environ.clear()
            os.environ.update(env)
            print(json.dumps([code, err.getvalue()]), flush=True)
        """
    )
    rows = []
    for label, value in values.items():
        runs = [("LAB_RESULTS", value, ["compare"]), ("LAB_CHECKPOINTS", value, ["prepare"]),
                ("LAB_DATA", value, ["prepare"]), ("LAB_DATA", value, ["run", "grad-accum"])]  # fmt: skip
        out = subprocess.run([sys.executable, "-c", script, json.dumps(runs)], cwd=ROOT, env=fault.env,
                             capture_output=True, text=True, timeout=300, errors="surrogateescape").stdout  # fmt: skip
        answers = [json.loads(line) for line in out.splitlines()]
        good = [_one_line(code, err)[0] for code, err in answers]
        created = [v for v in (str(fault.dir / ("n" * 300)),) if os.path.lexists(v)]
        row = Row(f"LAB_* = {label} (compare, prepare, run)", "each: exit 2, one line, nothing started")
        ok = len(answers) == len(runs) and all(good) and not created
        shown = _one_line(*answers[0])[1][7:] if answers else ""
        rows.append(_finish(row, fault, expect_records=0, ok=ok,
                            observed=f"{sum(good)} of {len(runs)} one line: {shown}"))  # fmt: skip
    return rows


def closed_or_full_stdout(root: Path) -> list[Row]:
    rows = []
    fault = Fault(root, "stdout")
    for name, redirect in (("results >&- (stdout closed)", ">&-"), ("results > /dev/full", "> /dev/full"),
                           ("compare > /dev/full", "> /dev/full")):  # fmt: skip
        command = name.split()[0]
        shell = f"{sys.executable} -m lab_helpers {command} --{'format' if command == 'results' else 'wide'}"
        shell += " json" if command == "results" else ""
        proc = subprocess.run(["bash", "-c", f"{shell} {redirect}"], cwd=ROOT, env=fault.env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        ok, shown = _one_line(proc.returncode, proc.stderr)
        row = Row(name, "exit 2, one line")
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {proc.returncode}: {shown[7:]}"))
    return rows


# ------------------------------------------------------------------ refused before starting


REFUSED_BEFORE_STARTING = [  # (what, CLI arguments, a piece the one line must hold); {lengths}: a one-length file
    ("run small-batch --set devices=2 (FSDP, on a CPU)", ["run", "small-batch", "--set", "devices=2"],
     "devices=2: small-batch trains on one device"),
    ("run small-batch --set num_nodes=2", ["run", "small-batch", "--set", "num_nodes=2"], "num_nodes=2: small-batch"),
    ("run small-batch --set devices=0", ["run", "small-batch", "--set", "devices=0"], "devices must be a whole"),
    ("run ddp --set devices=8 (not read by its launcher)", ["run", "ddp", "--set", "devices=8"],
     "devices=8: ddp runs on the experiment's own devices"),
    ("run small-batch --trace-steps 10**18", ["run", "small-batch", "--trace-steps", str(10**18)],
     "trace_steps is at most"),
    ("plan --time --batch-order length-grouped, 1 length", ["plan", "configs/ci/ci-llama-xs/full.yaml", "--time",
     "--batch-order", "length-grouped", "--sample-lengths", "{lengths}"], "cannot fill one micro-batch of 8"),
    ("answers --reference ../../etc/passwd (not masked)", ["answers", "--reference", "../../etc/passwd"],
     "../../etc/passwd: no such reference"),
]  # fmt: skip


def _probes_in_one_process(fault: Fault, script: str, probes: list) -> list[list]:
    """Each probe through the lab's own entry point in one process (the imports are paid once): [what, code, text]."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), json.dumps(probes)],
        cwd=ROOT, env=fault.env, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    return [json.loads(line[6:]) for line in out.splitlines() if line.startswith("PROBE ")]


def refused_before_starting(root: Path) -> list[Row]:
    """What the recipe check can know (devices a CPU or the experiment cannot use), a bound, a planner input and a
    path the masker took for a password: exit 2, one line that says it, no run folder, no record."""
    fault = Fault(root, "before-starting")
    lengths = fault.dir / "one-length.json"
    lengths.write_text("[100]")
    probes = [[what, [str(lengths) if a == "{lengths}" else a for a in args]]
              for what, args, _ in REFUSED_BEFORE_STARTING]  # fmt: skip
    script = """
        import contextlib, io, json, sys
        from lab_helpers.cli import main
        for what, args in json.loads(sys.argv[1]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    code = main(args)
                except BaseException as exc:  # a traceback the CLI let out: the row says which
                    code, err = f"uncaught {type(exc).__name__}", io.StringIO(str(exc))
            print("PROBE " + json.dumps([what, code, err.getvalue()]), flush=True)
    """
    said = {what: (code, err) for what, code, err in _probes_in_one_process(fault, script, probes)}
    rows = []
    for what, _, piece in REFUSED_BEFORE_STARTING:
        code, err = said.get(what, (None, "the probe did not report"))
        ok, shown = _one_line(code, err)
        started_nothing = not (fault.results / "runs").exists() and not fault.new_records()
        ok = ok and piece in shown and "***" not in shown and started_nothing
        row = Row(what, "exit 2, one line, nothing started")
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}: {shown[7:]}"))
    return rows


NOTEBOOK_ARGUMENTS = [  # (what, the call as a notebook cell makes it)
    ("run_experiment(None)", "lab.run_experiment(None)"),
    ("run_experiment(5)", "lab.run_experiment(5)"),
    ("run_experiment(profile={'a': 1})", "lab.run_experiment('small-batch', profile={'a': 1})"),
    ("run_experiment(overrides={None: 1})", "lab.run_experiment('small-batch', overrides={None: 1})"),
    ("run_experiment(overrides=5)", "lab.run_experiment('small-batch', overrides=5)"),
    ("run_experiment(overrides=[1, 2])", "lab.run_experiment('small-batch', overrides=[1, 2])"),
    ("run_experiment(overrides={'devices': 2})", "lab.run_experiment('small-batch', overrides={'devices': 2})"),
    ("predict_experiment(None)", "lab.predict_experiment(None)"),
]


def notebook_arguments(root: Path) -> list[Row]:
    """A notebook's wrong argument: a LabConfigError of one line (the notebooks' error), not a TypeError from
    difflib; no run folder, no record."""
    fault = Fault(root, "notebook-arguments")
    script = """
        import json, sys
        from lab_helpers import lab
        for what, call in json.loads(sys.argv[1]):
            try:
                eval(call, {"lab": lab})
                print("PROBE " + json.dumps([what, "returned", ""]), flush=True)
            except Exception as exc:
                print("PROBE " + json.dumps([what, type(exc).__name__, str(exc)]), flush=True)
    """
    said = {what: (kind, text) for what, kind, text in _probes_in_one_process(fault, script, NOTEBOOK_ARGUMENTS)}
    rows = []
    for what, _ in NOTEBOOK_ARGUMENTS:
        kind, text = said.get(what, ("nothing", "the probe did not report"))
        started_nothing = not (fault.results / "runs").exists() and not fault.new_records()
        ok = kind == "LabConfigError" and text and "\n" not in text and started_nothing
        row = Row(what, "LabConfigError, one line, nothing started")
        rows.append(_finish(row, fault, expect_records=0, ok=bool(ok), observed=f"{kind}: {text}"))
    return rows


def recipe_rewritten_in_place(root: Path) -> Row:
    """A recipe rewritten at its size, its mtime put back (same inode, size and mtime): read again, not served
    from the parsed-file cache."""
    row = Row("recipe rewritten at its size, mtime put back", "the new recipe resolved")
    fault = Fault(root, "recipe-in-place")
    home = fault.dir / "home"
    shutil.copytree(ROOT / "configs", home / "configs")
    fault.env["LAB_HOME"] = str(home)
    script = """
        import os, sys
        from pathlib import Path
        from lab_helpers.config.experiments import resolve
        recipe = Path(sys.argv[1])
        first = resolve("small-batch", "ci", check_files=False).recipe["data"]["init_args"]["seed"]
        before = recipe.stat()
        recipe.write_text(recipe.read_text().replace("seed: 42", "seed: 43"))
        os.utime(recipe, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = recipe.stat()
        same = (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
        again = resolve("small-batch", "ci", check_files=False).recipe["data"]["init_args"]["seed"]
        print(first, again, same)
    """
    recipe = home / "configs" / "ci" / "ci-llama-xs" / "full.yaml"
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(recipe)], cwd=ROOT, env=fault.env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    said = out.stdout.split()
    ok = said == ["42", "43", "True"]
    observed = out.stderr[-60:]
    if len(said) == 3:
        observed = f"seed {said[0]} then {said[1]} (inode, size, mtime kept: {said[2]})"
    return _finish(row, fault, expect_records=0, ok=ok, observed=observed)


# ------------------------------------------------------- caches and readers by the lab's rule


def _bounded(fault: Fault, *args: str, timeout_s: float = 90, env: dict | None = None) -> tuple[int | str, str, str]:
    """Fault.run, with a hang (a read blocked on a FIFO) killed at ``timeout_s`` and reported as "hung"."""
    saved = fault.env
    fault.env = env or fault.env
    try:
        proc = fault.start(*args)
    finally:
        fault.env = saved
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return "hung", out, err
    return proc.returncode, out, err


def _plan_entry(cache: Path) -> Path | None:
    """The memory plan's cache entry (the one JSON file with a peak_alloc_gib), or None."""
    for path in sorted(cache.glob("*.json")):
        try:
            if "peak_alloc_gib" in json.loads(path.read_text()):
                return path
        except (OSError, ValueError):
            continue
    return None


def _same_plan(one: dict, other: dict) -> bool:
    """Two plans of one spec: every field but the seconds the trace took."""
    return {**one, "trace_seconds": 0} == {**other, "trace_seconds": 0}


def trace_cache_lies(root: Path) -> list[Row]:
    """The planner's cache (LAB_TRACE_CACHE) as a fault or another hand left it: a FIFO or a link to /dev/zero at
    a plan's key, an edited peak (7.5 GiB for a 0.035 GiB run), NaN; and another litgpt (its dist-info 0.5.99), whose
    plans must not be the old litgpt's. `plan` answers as a fresh trace, within 90 s, and the entry is replaced."""
    fault = Fault(root, "trace-cache")
    cache = fault.dir / "cache"
    fault.env["LAB_TRACE_CACHE"] = str(cache)
    recipe = "configs/ci/ci-llama-xs/full.yaml"
    code, fresh, _ = _bounded(fault, "plan", recipe)
    entry = _plan_entry(cache)
    if code != 0 or entry is None:
        raise RuntimeError(f"plan without a cache entry failed (exit {code})")
    kept = json.loads(entry.read_text())
    cases = [("a FIFO at a plan's cache key", lambda: os.mkfifo(entry)),
             ("a link to /dev/zero at a plan's cache key", lambda: entry.symlink_to("/dev/zero")),
             ("peak_alloc_gib 7.5 in a plan's cache entry", lambda: entry.write_text(json.dumps({**kept, "peak_alloc_gib": 7.5}))),
             ("peak_alloc_gib NaN in a plan's cache entry", lambda: entry.write_text(json.dumps({**kept, "peak_alloc_gib": float("nan")})))]  # fmt: skip
    rows = []
    for what, plant in cases:
        entry.unlink()
        plant()
        code, out, err = _bounded(fault, "plan", recipe)
        replaced = entry.is_file() and not entry.is_symlink() and _same_plan(json.loads(entry.read_text()), kept)
        said = [line for line in err.splitlines() if line.startswith("warning: trace cache ")]
        ok = code == 0 and out == fresh and replaced and len(said) == 1 and "Traceback" not in err
        row = Row(what, "the fresh plan, entry replaced, one line")
        rows.append(_finish(row, fault, expect_records=0, ok=ok,
                            observed=f"exit {code}, replaced {replaced}: {said[0].split('not used ')[-1] if said else err[-40:]}"))  # fmt: skip
    site = fault.dir / "litgpt-0.5.99"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import importlib.metadata as metadata
        _version = metadata.version
        metadata.version = lambda name: "0.5.99" if name == "litgpt" else _version(name)
    """))  # fmt: skip
    env = {**fault.env, "PYTHONPATH": f"{site}{os.pathsep}{fault.env.get('PYTHONPATH', '')}"}
    before = sorted(p.name for p in cache.glob("*.json"))
    code, out, err = _bounded(fault, "plan", recipe, env=env)
    after = sorted(p.name for p in cache.glob("*.json"))
    ok = code == 0 and out == fresh and len(after) == len(before) + 1 and set(before) <= set(after)
    row = Row("litgpt's dist-info says 0.5.99 (another litgpt)", "traced again, under a key of its own")
    rows.append(_finish(row, fault, expect_records=0, ok=ok,
                        observed=f"exit {code}, cache entries {len(before)} -> {len(after)}"))  # fmt: skip
    return rows


def _orphan_run(results: Path, run_id: str, report: dict) -> Path:
    """A run folder as a launcher killed with -9 after its training ended leaves it: launch.json, a report."""
    from lab_helpers.record.recovery import write_launch

    run_dir = results / "runs" / run_id
    (run_dir / "reports").mkdir(parents=True)
    write_launch(run_dir, {"run_id": run_id, "experiment": "grad-accum", "profile": "ci", "overrides": {},
                           "rank": None, "world_size": 1, "mode": "full"}, [None])  # fmt: skip
    (run_dir / "reports" / "rank0.json").write_text(json.dumps({"rank": None, **report}))
    (run_dir / "output.log").write_text("iter 1 ...\n")
    return run_dir


def read_by_the_rule(root: Path) -> list[Row]:
    """Files the lab reads that anyone may plant: bandwidth.json (a FIFO, 1e-300 GB/s, a field missing) under
    plan --time on 2 ranks, and an orphaned run folder's launch.json or rank0.json (a FIFO, a link outside with
    peak 99 GiB and train_s 12345) under `results`. Each: no hang, no traceback, no figure read through a link."""
    import platform

    rows = []
    entry = {"host": platform.node(), "device_name": "cpu", "backend": "gloo", "world_size": 2, "size_bytes": 2**24,
             "all_reduce_busbw_gbs": 2.0, "all_gather_busbw_gbs": 1.0, "measured_at": "2026-01-01T00:00:00+0000"}  # fmt: skip
    bandwidth = [("a FIFO", "not a regular file (a FIFO)", None),
                 ("1e-300 GB/s", "outside", {**entry, "all_gather_busbw_gbs": 1e-300}),
                 ("a GB/s missing", "not numbers", {k: v for k, v in entry.items() if k != "all_reduce_busbw_gbs"}),
                 ("'fast' GB/s", "not numbers", {**entry, "all_gather_busbw_gbs": "fast"})]  # fmt: skip
    for what, piece, planted in bandwidth:
        fault = Fault(root, f"bandwidth-{len(rows)}")
        path = fault.results / "bandwidth.json"
        if planted is None:
            os.mkfifo(path)
        else:
            path.write_text(json.dumps({f"{entry['host']}|cpu": planted}))
        code, out, err = _bounded(fault, "plan", "ddp", "--profile", "ci", "--time")
        lines = err.strip().splitlines()
        ok = code == 0 and len(lines) == 1 and lines[0].startswith("warning: ") and piece in lines[0]
        ok = ok and "no link bandwidth" in out and "e+2" not in out
        row = Row(f"plan ddp --time; bandwidth.json: {what}", "planned unmeasured, one line")
        shown = lines[0].split("bandwidth.json: ", 1)[-1] if lines else ""
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=f"exit {code}: {shown}"))
    ok_report = {"status": "ok", "train_s": 1.5, "iterations": 4, "tokens": 400, "tokens_padded": 512,
                 "device_name": "cpu"}  # fmt: skip
    runs = [("launch.json a FIFO", True, "launch.json not read"),
            ("reports/rank0.json a FIFO", False, "is not a regular file"),
            ("rank0.json linked outside", False, "is not a regular file")]  # fmt: skip
    for what, recovered, piece in runs:
        fault = Fault(root, f"orphan-read-{len(rows)}")
        run_dir = _orphan_run(fault.results, "20261126-080000-grad-accum-aaaaaa", ok_report)
        planted = run_dir / ("launch.json" if what.startswith("launch") else "reports/rank0.json")
        planted.unlink()
        if "FIFO" in what:
            os.mkfifo(planted)
        else:
            outside = fault.dir / "outside.json"
            outside.write_text(json.dumps({"rank": None, **ok_report, "peak_alloc_gib": 99.0, "train_s": 12345.0}))
            planted.symlink_to(outside)
        code, _, err = _bounded(fault, "results")
        new = fault.new_records()
        said = [line for line in err.splitlines() if piece in line]
        ok = code == 0 and len(new) == int(recovered) and all(r.get("train_s") == 1.5 for r in new) and len(said) == 1
        row = Row(f"results; an orphan's {what}", "recovered" if recovered else "not recovered, one line")
        rows.append(_finish(row, fault, expect_records=int(recovered), ok=ok,
                            observed=f"exit {code}, {_statuses(new)}: {said[0].split('aaaaaa', 1)[-1].lstrip(': ') if said else ''}"))  # fmt: skip
    return rows


def wheelhouse_inputs(root: Path) -> list[Row]:
    """wheelhouse's inputs that are no file or folder it can use: each one line, exit 2, before pip runs (the
    wheelhouse folder stays empty: nothing was downloaded)."""
    fault = Fault(root, "wheelhouse-inputs")
    os.mkfifo(fault.dir / "node-list.fifo")
    (fault.dir / "a-file").write_text("mine\n")
    dest = str(fault.dir / "wh")
    cases = [("wheelhouse --node-has /dev/zero", ["--dest", dest, "--node-has", "/dev/zero"]),
             ("wheelhouse --node-has <a FIFO>", ["--dest", dest, "--node-has", str(fault.dir / "node-list.fifo")]),
             ("wheelhouse --dest /proc/x", ["--dest", "/proc/x"]),
             ("wheelhouse --dest <an existing file>", ["--dest", str(fault.dir / "a-file")]),
             ("wheelhouse --with qlora --cuda 99.9", ["--dest", dest, "--with", "qlora", "--cuda", "99.9"])]  # fmt: skip
    rows = []
    for what, args in cases:
        started = time.monotonic()
        code, _, err = _bounded(fault, "wheelhouse", "--python", "3.12", *args, timeout_s=60)
        seconds = time.monotonic() - started
        ok, shown = _one_line(code, err)
        ok = ok and not os.path.exists(dest) and (fault.dir / "a-file").read_text() == "mine\n"
        row = Row(what, "exit 2, one line, nothing downloaded")
        observed = f"exit {code} in {seconds:.0f} s: {shown[7:].replace(str(fault.dir) + '/', '')}"
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=observed))
    return rows


def linked_subfolders(root: Path) -> list[Row]:
    """$LAB_RESULTS/runs or $LAB_RESULTS/figures a symbolic link: the run folder, or compare's CSV and figures,
    went into the link's target, exit 0. Now one line, exit 2, nothing written through the link."""
    rows = []
    for linked, args in (("runs", ["run", "grad-accum", "--set", "train.max_steps=2"]), ("figures", ["compare"])):
        fault = Fault(root, f"linked-{linked}")
        target = fault.dir / "target"
        target.mkdir()
        (fault.results / linked).symlink_to(target)
        code, _, err = _bounded(fault, *args, timeout_s=300)
        ok, shown = _one_line(code, err)
        ok = ok and list(target.iterdir()) == [] and "symbolic link" in shown
        row = Row(f"$LAB_RESULTS/{linked} a link; {' '.join(args[:2])}", "exit 2, one line, nothing written through")
        observed = f"exit {code}: {shown[7:].replace(str(fault.results) + '/', '')}"
        rows.append(_finish(row, fault, expect_records=0, ok=ok, observed=observed))
    return rows


def main() -> int:
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)
    from importlib.metadata import version

    import lightning
    import torch

    print(f"$ python benchmarks/faults.py   # torch {torch.__version__}, lightning {lightning.__version__}, "
          f"litgpt {version('litgpt')}, {os.cpu_count()} CPUs, ci profile")  # fmt: skip
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="lab-faults-"))
    rows: list[Row] = []
    plan: list[Callable[[], Row | list[Row]]] = [
        lambda: interrupts(root, 1, moment="at start-up"),
        lambda: interrupts(root, 2, moment="during training"),
        lambda: interrupts(root, 3, moment="during training", stuck=True),
        lambda: kill_launcher(root, moment="while ranks import torch"),
        lambda: kill_launcher(root, moment="during training"),
        lambda: kill_rank(root),
        lambda: hung_rank(root),
        lambda: hung_data_loader(root),
        lambda: disk_full_during_run(root),
        lambda: disk_full_during_append(root),
        lambda: damaged_file(root),
        lambda: token_in_error(root),
        lambda: bad_set_values(root),
        lambda: closed_output(root),
        lambda: hang_up(root),
        lambda: results_file_breaks(root),
        lambda: refused_up_front(root),
        lambda: relative_results(root),
        lambda: absurd_micro_batch(root),
        lambda: hostile_lines(root),
        lambda: indexed_three_at_once(root),
        lambda: children_hold_output(root),
        lambda: secrets_by_shape(root),
        lambda: bounded_values(root),
        lambda: disk_fails_during_run(root, "fill"),
        lambda: disk_fails_during_run(root, "readonly"),
        lambda: output_larger_than_disk(root),
        lambda: launcher_killed_after_training(root),
        lambda: odd_start_time(root),
        lambda: planted_links(root),
        lambda: export_refused(root),
        lambda: other_ending_signals(root),
        lambda: bad_locations(root),
        lambda: closed_or_full_stdout(root),
        lambda: refused_before_starting(root),
        lambda: notebook_arguments(root),
        lambda: recipe_rewritten_in_place(root),
        lambda: trace_cache_lies(root),
        lambda: read_by_the_rule(root),
        lambda: wheelhouse_inputs(root),
        lambda: linked_subfolders(root),
    ]
    print(f"{'fault':<52} | {'expected':<56} | {'observed':<60} | result")
    for step in plan:
        try:
            got = step()
        except Exception as exc:  # a fault the harness could not even set up is a failure, shown as such
            got = Row(getattr(step, "__name__", "fault"), "", observed=f"harness error: {exc!r}"[:80])
        for row in got if isinstance(got, list) else [got]:
            rows.append(row)
            verdict = "survived" if row.ok else "FAILED"
            observed = row.observed if len(row.observed) <= 60 else row.observed[:57] + "..."
            print(f"{row.fault:<52} | {row.expected:<56} | {observed:<60} | {verdict}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    survived = sum(r.ok for r in rows)
    lost = sum(r.lost for r in rows)
    strays = sum(r.strays for r in rows)
    refused = sum(r.refused for r in rows)
    print(f"# {time.monotonic() - started:.0f} s; records refused by a full disk (said in one line): {refused}")
    print(f"faults {len(rows)}, survived {survived}, records lost {lost}, stray processes {strays}")
    return 0 if survived == len(rows) and lost == 0 and strays == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
