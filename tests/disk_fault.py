"""The failing disks for real: a small tmpfs as LAB_RESULTS, in a mount namespace of its own.

A CPU test cannot fill the machine's disk or remount it read-only, but ``unshare -r -m`` gives an unprivileged
process a private mount table where it may mount a tmpfs of a chosen size, fill it, and remount it read-only, with
nothing outside seeing it. The whole scenario runs inside (the CLI, the fault, what is read back afterwards, the
next command that adds the record back), and one JSON file outside the tmpfs tells the caller what happened. Used by tests/test_faults.py and
benchmarks/faults.py.

    from disk_fault import namespaces_work, run_on_a_failing_disk
    seen = run_on_a_failing_disk(tmp_path, "fill", ["run", "grad-accum", "--set", "train.max_steps=6"], env)

Faults: ``fill`` (once training runs, a file fills the tmpfs), ``readonly`` (once training runs, every new open on it
is read-only: ``_apply``), ``none`` (the run's own output is the fault).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULTS = ("fill", "readonly", "none")

# The training process's own output is the fault: 150 lines of 1 MiB and one line of 300 MiB, into a 100 MB folder.
CHATTY = """
    import os
    if os.environ.get("LAB_REPORT_DIR"):
        import sys
        for _ in range(150):
            sys.stdout.buffer.write(b"chatty " + b"z" * (2**20 - 8) + b"\\n")
        for _ in range(300):
            sys.stdout.buffer.write(b"w" * 2**20)
        sys.stdout.buffer.write(b"\\n")
        sys.stdout.flush()
"""

# The training process stays a while after writing its report (as one tearing down its data loaders does), so that
# the test can kill the launcher in the window between the report and the record.
LINGERS_AFTER_ITS_REPORT = """
    import os
    if os.environ.get("LAB_REPORT_DIR"):
        import signal, time
        import lab_helpers.training.child_report as report
        _write = report.write_report
        def write_report(*args, **kwargs):
            path = _write(*args, **kwargs)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ended at once when the launcher dies (orphan_guard)
            print("fixture: report written", flush=True)
            time.sleep(120)
            return path
        report.write_report = write_report
"""


def namespaces_work() -> bool:
    """Whether this machine lets us mount a tmpfs in a private mount namespace (user namespaces enabled)."""
    try:
        probe = subprocess.run(
            ["unshare", "-r", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || "
             "mount -t tmpfs -o size=1m tmpfs /tmp"],
            capture_output=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def run_on_a_failing_disk(
    where: Path, fault: str, args: list[str], env: dict[str, str], *, size_mib: int = 100, timeout_s: float = 300
) -> dict:
    """Run ``python -m lab_helpers ARGS`` with ``where/results`` a ``size_mib`` tmpfs and ``fault`` applied once the
    training runs; return what ``_inside`` saw (exit code, output, files left there, records, the launcher's peak
    memory, the next command that adds back the record it kept). ``where`` must not be inside another test's tmpfs."""
    assert fault in FAULTS, fault
    results = where / "results"
    results.mkdir(parents=True, exist_ok=True)
    spec = {"results": str(results), "fault": fault, "args": args, "size_mib": size_mib, "timeout_s": timeout_s,
            "out": str(where / "disk-fault.json"), "logs": str(where)}  # fmt: skip
    (where / "disk-fault-spec.json").write_text(json.dumps(spec))
    subprocess.run(
        ["unshare", "-r", "-m", "--propagation", "private", sys.executable, __file__, str(where / "disk-fault-spec.json")],
        env={**env, "LAB_RESULTS": str(results)}, cwd=REPO, timeout=timeout_s + 120, check=True,
    )  # fmt: skip
    return json.loads((where / "disk-fault.json").read_text())


def _inside(spec: dict) -> dict:
    import psutil

    results = Path(spec["results"])
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={spec['size_mib']}m", "tmpfs", str(results)], check=True)
    logs = Path(spec["logs"])
    with open(logs / "cli-stdout.txt", "wb") as out, open(logs / "cli-stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lab_helpers", *spec["args"]], cwd=REPO, stdout=out,
                                stderr=err, start_new_session=True)  # fmt: skip
        launcher = psutil.Process(proc.pid)
        peak_rss, faulted = 0, spec["fault"] == "none"
        deadline = time.monotonic() + spec["timeout_s"]
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                peak_rss = max(peak_rss, launcher.memory_info().rss)
            except psutil.Error:
                pass
            if not faulted and _training(results):
                _apply(spec["fault"], results)
                faulted = True
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    seen = {
        "returncode": proc.returncode,
        "faulted": faulted,
        "stdout": (logs / "cli-stdout.txt").read_text(errors="replace")[-20000:],
        "stderr": (logs / "cli-stderr.txt").read_text(errors="replace")[-20000:],
        "launcher_peak_rss_mib": peak_rss / 2**20,
        "files": {str(p.relative_to(results)): p.stat().st_size for p in results.rglob("*") if p.is_file()},
        "free_mib_at_end": os.statvfs(results).f_bavail * os.statvfs(results).f_frsize / 2**20,
        "strays": _strays(str(results)),
    }
    seen["records"] = _records(results / "runs.jsonl")
    _undo(spec["fault"], results)
    named = re.findall(r"the record is kept in (\S+?): the next lab command adds it", seen["stderr"])
    if named:  # the disk mended, the next command adds the record to runs.jsonl
        added = subprocess.run([sys.executable, "-m", "lab_helpers", "results"], cwd=REPO, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        seen["fallback"] = named[-1]
        seen["next_command"] = {"returncode": added.returncode, "said": added.stderr.strip(),
                                "fallback_left": os.path.exists(named[-1])}  # fmt: skip
        seen["records_after"] = _records(results / "runs.jsonl")
    return seen


def _training(results: Path) -> bool:
    for log in results.glob("runs/*/output.log"):
        try:
            if re.search(rb"\biter [2-9]", log.read_bytes()[-65536:]):
                return True
        except OSError:
            continue
    return False


def _apply(fault: str, results: Path) -> None:
    if fault == "fill":
        try:
            with open(results / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 2**20)
                    fh.flush()
        except OSError:
            pass  # full
    elif fault == "readonly":
        # the kernel refuses to remount a file system read-only while files are open for writing on it (the log),
        # as ext4's errors=remount-ro may: a read-only bind mount of it over the same folder is what every later
        # open sees (runs.jsonl, a fallback in the run folder: EROFS), while the files already open write on below
        subprocess.run(["mount", "--bind", str(results), str(results)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(results)], check=True)


def _undo(fault: str, results: Path) -> None:
    if fault == "readonly":
        subprocess.run(["umount", str(results)], check=True)
    (results / "filler").unlink(missing_ok=True)


def _records(path: Path) -> list[dict]:
    import warnings

    from lab_helpers.record.records import read_records

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [{k: r.get(k) for k in ("run_id", "status", "reason", "log_error", "experiment")}
                for r in read_records(path)]  # fmt: skip


def _strays(text: str, grace_s: float = 8.0) -> int:
    """Processes whose command line names the tmpfs, after a grace; killed, and counted."""
    import psutil

    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if proc.pid != os.getpid() and any(text in part for part in proc.info["cmdline"] or []):
                    alive.append(proc)
            except psutil.Error:
                continue
        if not alive or time.monotonic() > deadline:
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            return len(alive)
        time.sleep(0.25)


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["out"]).write_text(json.dumps(_inside(spec)))
