"""Why a training process ended without a report. The host's OOM killer leaves only ``SIGKILL``: "exit code -9"
says nothing to a student, "probably the host ran out of memory" does.
"""

from __future__ import annotations

import re
import signal
import subprocess

OOM_RSS_FRACTION = 0.8  # a run whose tree held this much of the host's memory is a likely OOM-killer victim
# "Out of memory: Killed process 4242 (python)" and "Memory cgroup out of memory: Killed process 4242 (python)"
_KERNEL_OOM = re.compile(
    r"^\[\s*(?P<t>\d+\.\d+)\].*(?:out of memory|oom-kill).*?(?:Killed process |pid=)(?P<pid>\d+)", re.I
)


def describe_returncode(code: int | None) -> str:
    """A negative code is Popen's way of saying "a signal"."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name} (signal {-code})"


def kernel_log(timeout_s: float = 2.0) -> str | None:
    """The kernel's ring buffer (``dmesg``), or None where it cannot be read (often in containers)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def host_memory_gib() -> float:
    """Its container's memory limit where that is lower."""
    from lab_helpers.hardware.node import host_memory_bytes

    total, _ = host_memory_bytes()
    if total is None:
        import psutil

        total = psutil.virtual_memory().total
    return total / 2**30


def host_oom_evidence(
    *,
    pids: set[int],
    started_s: float | None,
    ended_s: float | None,
    kernel_log_text: str | None,
    rss_peak_gib: float | None,
    host_gib: float,
) -> str | None:
    """``started_s``/``ended_s``: ``time.monotonic()`` readings, the clock of the kernel log's timestamps."""
    for line in (kernel_log_text or "").splitlines():
        match = _KERNEL_OOM.search(line)
        if not match:
            continue
        if int(match["pid"]) in pids:
            return f"the kernel log says its OOM killer killed pid {match['pid']}"
        t = float(match["t"])
        if started_s is not None and ended_s is not None and started_s - 1 <= t <= ended_s + 1:
            return "the kernel log shows an OOM kill during the run"
    if rss_peak_gib is not None and host_gib > 0 and rss_peak_gib >= OOM_RSS_FRACTION * host_gib:
        return f"the run's processes held {rss_peak_gib:.1f} of the host's {host_gib:.1f} GiB"
    return None
