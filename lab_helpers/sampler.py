"""A background sampler of the GPU timeline (NVML) and of the run's host CPU and memory.

Why in the launching process and not in the training one: it must see every rank's GPU at once, keep going
while a rank is stuck or dying, and survive an OOM in the child. Rows go to a CSV file as they are taken
(flushed every second), so a crash still leaves the timeline up to that moment.
"""

from __future__ import annotations

import csv
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

GIB = 2**30
TIMELINE_COLUMNS = ("t_s", "gpu", "util_pct", "mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib")


@dataclass
class TimelineSummary:
    """Peaks over the run; GPU figures are None where there is no GPU (never 0)."""

    path: Path
    samples: int = 0
    gpu_used_peak_gib: dict[int, float] = field(default_factory=dict)
    host_rss_peak_gib: float | None = None

    def gpu_used_peak_for(self, gpu_index: int) -> float | None:
        return self.gpu_used_peak_gib.get(gpu_index)


class _Nvml:
    """NVML handles, or nothing where the driver or library is missing."""

    def __init__(self) -> None:
        self.handles: list = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no driver, no GPU, no library: the timeline then has host rows only
            self.handles = []

    def read(self, handle) -> tuple[float | None, float | None, float | None]:
        nvml = self._nvml
        util = mem = power = None
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB
        except Exception:
            pass
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:
            pass
        return util, mem, power

    def close(self) -> None:
        if self.handles:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def process_tree_rss_bytes(root_pid: int) -> int:
    """Resident memory of a process and all its descendants (ranks, data loader workers)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


class TimelineSampler:
    """Samples every ``interval_s`` (100-200 ms per LAB.md) until stopped; use as a context manager."""

    def __init__(self, path: Path, *, root_pid: int, interval_s: float = 0.15) -> None:
        if not 0.01 <= interval_s <= 10:
            raise ValueError(f"interval_s must be between 0.01 and 10 s; got {interval_s}")
        self.summary = TimelineSummary(path=path)
        self._root_pid = root_pid
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-timeline", daemon=True)

    def __enter__(self) -> TimelineSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> TimelineSummary:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        return self.summary

    def _loop(self) -> None:
        nvml = _Nvml()
        self.summary.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        last_flush = t0
        psutil.cpu_percent(None)  # the first reading is meaningless; prime it
        with open(self.summary.path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(TIMELINE_COLUMNS)
            while True:
                now = time.monotonic()
                self._sample(writer, nvml, now - t0)
                if now - last_flush >= 1.0:
                    fh.flush()
                    last_flush = now
                if self._stop.wait(self._interval_s):
                    self._sample(writer, nvml, time.monotonic() - t0)  # one last reading at the end
                    break
        nvml.close()

    def _sample(self, writer, nvml: _Nvml, t_s: float) -> None:
        rss_gib = process_tree_rss_bytes(self._root_pid) / GIB
        cpu_pct = psutil.cpu_percent(None)
        writer.writerow([f"{t_s:.3f}", "", "", "", "", f"{cpu_pct:.1f}", f"{rss_gib:.4f}"])
        summary = self.summary
        summary.samples += 1
        if rss_gib > 0:
            summary.host_rss_peak_gib = max(summary.host_rss_peak_gib or 0.0, rss_gib)
        for index, handle in enumerate(nvml.handles):
            util, mem, power = nvml.read(handle)
            writer.writerow([f"{t_s:.3f}", index, _fmt(util), _fmt(mem, 4), _fmt(power), "", ""])
            if mem is not None:
                summary.gpu_used_peak_gib[index] = max(summary.gpu_used_peak_gib.get(index, 0.0), mem)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"
