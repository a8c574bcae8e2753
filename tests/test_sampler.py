"""The timeline sampler: host rows always; GPU rows through NVML where there is a GPU."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
import types

import pytest

from lab_helpers.launch.sampler import ProcessTreeMemory, TimelineSampler


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_host_rows_and_process_tree_rss_on_a_cpu(tmp_path):
    script = "x = bytearray(200 * 2**20); print('allocated', flush=True); import time; time.sleep(3)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "allocated"  # a loaded machine may start the child slowly
        with TimelineSampler(tmp_path / "t.csv", root_pid=child.pid, interval_s=0.1) as sampler:
            time.sleep(1.5)
    finally:
        child.kill()
        child.wait()
    summary = sampler.summary
    assert summary.samples >= 5
    assert summary.host_rss_peak_gib > 0.18  # the child's 200 MiB
    rows = _rows(tmp_path / "t.csv")
    assert all(row["gpu"] == "" for row in rows)
    if not summary.gpu_used_peak_gib:  # a CPU machine: no GPU figures at all, never zeros
        assert summary.gpu_used_peak_for(0) is None


def test_gpu_rows_from_nvml(tmp_path, monkeypatch):
    """NVML readings cannot happen on a CPU: a stand-in pynvml module reports two GPUs whose memory grows."""
    state = {"calls": 0}

    def memory_info(handle):
        state["calls"] += 1
        return types.SimpleNamespace(used=(handle + 1) * 2**30 + state["calls"] * 2**20)

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + h),
        nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetPowerUsage=lambda h: 300_000,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with TimelineSampler(tmp_path / "t.csv", root_pid=1, interval_s=0.05) as sampler:
        time.sleep(0.5)
    summary = sampler.summary
    assert set(summary.gpu_used_peak_gib) == {0, 1}
    assert 1.0 < summary.gpu_used_peak_gib[0] < summary.gpu_used_peak_gib[1] < 2.2
    gpu_rows = [row for row in _rows(tmp_path / "t.csv") if row["gpu"] != ""]
    assert {row["gpu"] for row in gpu_rows} == {"0", "1"}
    assert {row["power_w"] for row in gpu_rows} == {"300.0"}


def test_a_nonsense_interval_is_refused(tmp_path):
    with pytest.raises(ValueError, match="interval_s"):
        TimelineSampler(tmp_path / "t.csv", root_pid=1, interval_s=0)


def test_tree_memory_reads_pss_once_a_second_and_sees_growth_between(tmp_path, monkeypatch):
    """PSS costs the kernel a walk over every page (14 ms for a torch process, benchmarks/sampler_cost.out.txt):
    the sampler reads it once a second, and in between adds what RSS has grown, so a process that allocates is
    seen at the next sample."""
    import psutil

    reads = []
    real = psutil.Process.memory_full_info
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda self: reads.append(self.pid) or real(self))
    # The child says when it has started and when its 200 MiB are written: waiting on RSS alone raced the memset
    # (RSS passed 200 MiB with the interpreter's own pages while the last ~10 MiB were still being zeroed).
    script = (
        "import sys, time; print('started', flush=True); sys.stdin.readline();"
        " x = bytearray(200 * 2**20); print('allocated', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        memory = ProcessTreeMemory(child.pid, exact_every_s=1.0)
        before = memory.read_bytes(100.0)  # exact
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "allocated"
        grown = memory.read_bytes(100.5)  # estimated from RSS: no new PSS read
        assert reads == [child.pid]
        assert grown - before > 190 * 2**20
        memory.read_bytes(101.0)  # a second later: exact again
        assert reads == [child.pid, child.pid]
        reads.clear()
        with TimelineSampler(tmp_path / "t.csv", root_pid=child.pid, interval_s=0.05) as sampler:
            time.sleep(1.5)
    finally:
        child.kill()
        child.wait()
    assert sampler.summary.samples >= 10 and 1 <= len(reads) <= 3  # ~30 samples, PSS read once a second
    assert sampler.summary.host_rss_peak_gib > 0.18


@pytest.mark.parametrize("where", ["/dev/full", "missing-folder-in-a-file"])
def test_a_timeline_file_that_fails_ends_the_file_quietly_and_keeps_sampling(tmp_path, where):
    """A disk that filled up (/dev/full: every write is ENOSPC) or a folder that cannot be made printed a
    20-line 'Exception in thread lab-timeline' traceback; the peaks are still sampled and the error said once."""
    import os
    import threading
    from pathlib import Path

    (tmp_path / "file").write_text("")
    path = Path(where) if where.startswith("/") else tmp_path / "file" / "t.csv"
    seen: list = []
    hook, threading.excepthook = threading.excepthook, seen.append
    try:
        with TimelineSampler(path, root_pid=os.getpid(), interval_s=0.05) as sampler:
            time.sleep(1.3)  # past the one-second flush
    finally:
        threading.excepthook = hook
    summary = sampler.summary
    assert not seen and summary.samples >= 5 and summary.host_rss_peak_gib > 0
    assert summary.error and summary.error.startswith("the timeline stopped here:"), summary.error


def test_the_timeline_is_never_written_through_a_planted_link(tmp_path):
    """The one rule for every file the lab writes (paths.open_regular): a timeline.csv planted as a link to
    another file is refused, the other file stays as it was, and sampling goes on with the error said once."""
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "t.csv").symlink_to(victim)
    with TimelineSampler(tmp_path / "t.csv", root_pid=os.getpid(), interval_s=0.05) as sampler:
        time.sleep(0.5)
    assert victim.read_text() == "keep me\n"
    assert sampler.summary.samples >= 2 and sampler.summary.error
