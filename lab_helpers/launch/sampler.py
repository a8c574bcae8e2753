"""A background sampler of the GPU timeline (NVML) and of the run's host CPU and memory.

In the launching process, not the training one: it must see every rank's GPU at once and outlive a stuck, dying or
OOM-killed rank.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from lab_helpers.config.paths import open_regular
from lab_helpers.config.record_schema import GIB

TIMELINE_COLUMNS = ("t_s", "gpu", "util_pct", "mem_used_gib", "power_w", "host_cpu_pct", "host_ram_gib")


@dataclass
class TimelineSummary:
    path: Path
    samples: int = 0
    gpu_used_peak_gib: dict[int, float] = field(default_factory=dict)
    gpu_uuids: dict[int, str] = field(default_factory=dict)
    visible_order: list[int] = field(default_factory=list)  # NVML indices in the order the ranks see cuda:0, 1, ...
    host_rss_peak_gib: float | None = None
    t0_monotonic_s: float | None = None  # time.monotonic() of the timeline's t_s = 0: maps a rank's loop onto it
    error: str | None = None  # why the timeline file is incomplete (a full disk); the peaks above are still whole

    def gpu_index_for(self, local_rank: int, device_uuid: str | None = None) -> int | None:
        if device_uuid:
            for index, uuid in self.gpu_uuids.items():
                if uuid == device_uuid:
                    return index
        if 0 <= local_rank < len(self.visible_order):
            return self.visible_order[local_rank]
        return None

    def gpu_used_peak_for(self, local_rank: int, device_uuid: str | None = None) -> float | None:
        index = self.gpu_index_for(local_rank, device_uuid)
        return None if index is None else self.gpu_used_peak_gib.get(index)


def visible_nvml_indices(visible: str | None, uuids: list[str | None]) -> list[int]:
    """As CUDA reads ``CUDA_VISIBLE_DEVICES``: indices or UUID prefixes, ending at the first that names no GPU. An
    index is taken as NVML's, which is CUDA's order only with PCI_BUS_ID order or identical GPUs; a rank's own
    reported UUID is exact."""
    if visible is None:
        return list(range(len(uuids)))
    order: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        else:
            matches = [i for i, uuid in enumerate(uuids) if uuid and entry and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in order:
            break
        order.append(index)
    return order


class _Nvml:
    def __init__(self, visible: str | None = None) -> None:
        self.handles: list = []
        self.indices: list[int] = []
        self.uuids: dict[int, str] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            every = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            uuids = [self._uuid(handle) for handle in every]
            self.indices = visible_nvml_indices(visible, uuids)
            self.handles = [every[i] for i in self.indices]
            self.uuids = {i: uuids[i] for i in self.indices if uuids[i]}
        except Exception:  # no driver, no GPU, no library: the timeline then has host rows only
            self.handles, self.indices = [], []

    def _uuid(self, handle) -> str | None:
        try:
            value = self._nvml.nvmlDeviceGetUUID(handle)
        except Exception:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

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
    """PSS, not RSS: summed RSS counts a page shared by forked workers or a mapped checkpoint once per process."""
    return ProcessTreeMemory(root_pid).read_bytes(time.monotonic())  # a first reading is exact


def _pss_or(proc: psutil.Process, rss: int) -> int:
    try:
        return int(proc.memory_full_info().pss)
    except (psutil.Error, AttributeError, OSError):
        return rss


class ProcessTreeMemory:
    """PSS is dear (14 ms of CPU per torch process; every 150 ms for two ranks, 19 % of a core:
    benchmarks/sampler_cost.out.txt), RSS costs 0.03 ms. So PSS is read every ``exact_every_s`` and in between each
    process adds its RSS growth: new pages are its own, so growth shows at once and shared pages still count once."""

    def __init__(self, root_pid: int, *, exact_every_s: float = 1.0) -> None:
        self._root_pid = root_pid
        self._exact_every_s = exact_every_s
        self._next_exact_s = float("-inf")
        self._procs: list[psutil.Process] = []
        self._last_exact: dict[int, tuple[int, int]] = {}  # pid -> (PSS, RSS) at its last exact reading

    def read_bytes(self, now_s: float) -> int:
        exact = now_s >= self._next_exact_s
        if exact:
            self._next_exact_s = now_s + self._exact_every_s
            try:
                root = psutil.Process(self._root_pid)
                self._procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                self._procs = []
            self._last_exact = {}  # every process of the tree is read exactly below
        total = 0
        for proc in self._procs:
            try:
                rss = int(proc.memory_info().rss)
            except psutil.Error:
                continue  # gone since the tree was read
            if exact:
                pss = _pss_or(proc, rss)
                self._last_exact[proc.pid] = (pss, rss)
                total += pss
            elif (then := self._last_exact.get(proc.pid)) is not None:  # None: unreadable at the exact reading
                pss, rss_then = then
                total += max(0, pss + rss - rss_then)
        return total


class TimelineSampler:
    def __init__(
        self,
        path: Path,
        *,
        root_pid: int,
        interval_s: float = 0.15,
        visible_devices: str | None = None,
        pss_every_s: float = 1.0,
    ) -> None:
        if not 0.01 <= interval_s <= 10:
            raise ValueError(f"interval_s must be between 0.01 and 10 s; got {interval_s}")
        self.summary = TimelineSummary(path=path)
        self._visible = visible_devices
        self._memory = ProcessTreeMemory(root_pid, exact_every_s=pss_every_s)
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
        nvml = _Nvml(self._visible)
        try:
            self._sample_until_stopped(nvml)
        except Exception as exc:  # noqa: BLE001 -- the sampler must never end the run or print a traceback
            self.summary.error = self.summary.error or f"the sampler stopped: {type(exc).__name__}: {exc}"[:300]
        finally:
            nvml.close()

    def _sample_until_stopped(self, nvml: _Nvml) -> None:
        self.summary.gpu_uuids, self.summary.visible_order = dict(nvml.uuids), list(nvml.indices)
        t0 = time.monotonic()
        self.summary.t0_monotonic_s = t0
        last_flush = t0
        psutil.cpu_percent(None)  # the first reading is meaningless; prime it
        rows = _Rows(self.summary)
        try:
            while True:
                now = time.monotonic()
                self._sample(rows, nvml, now - t0, now)
                if now - last_flush >= 1.0:
                    rows.flush()
                    last_flush = now
                if self._stop.wait(self._interval_s):
                    end = time.monotonic()
                    self._sample(rows, nvml, end - t0, end)  # one last reading at the end
                    break
        finally:
            rows.close()

    def _sample(self, writer: _Rows, nvml: _Nvml, t_s: float, now_s: float) -> None:
        rss_gib = self._memory.read_bytes(now_s) / GIB
        cpu_pct = psutil.cpu_percent(None)
        writer.writerow([f"{t_s:.3f}", "", "", "", "", f"{cpu_pct:.1f}", f"{rss_gib:.4f}"])
        summary = self.summary
        summary.samples += 1
        if rss_gib > 0:
            summary.host_rss_peak_gib = max(summary.host_rss_peak_gib or 0.0, rss_gib)
        for index, handle in zip(nvml.indices, nvml.handles, strict=True):
            util, mem, power = nvml.read(handle)
            writer.writerow([f"{t_s:.3f}", index, _fmt(util), _fmt(mem, 4), _fmt(power), "", ""])
            if mem is not None:
                summary.gpu_used_peak_gib[index] = max(summary.gpu_used_peak_gib.get(index, 0.0), mem)


class _Rows:
    """A write that fails (a full disk) stops the file, never the sampling: the peaks still reach the record."""

    def __init__(self, summary: TimelineSummary) -> None:
        self._summary = summary
        self._fh = None
        try:
            summary.path.parent.mkdir(parents=True, exist_ok=True)
            # the rule of every file the lab streams into (paths.open_regular): never through a link, never a FIFO
            fd = open_regular(summary.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            self._fh = os.fdopen(fd, "w", newline="")
            self._writer = csv.writer(self._fh)
            self._writer.writerow(TIMELINE_COLUMNS)
        except OSError as exc:
            self._failed(exc)

    def writerow(self, row: list) -> None:
        if self._fh is not None:
            try:
                self._writer.writerow(row)
            except OSError as exc:
                self._failed(exc)

    def flush(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
            except OSError as exc:
                self._failed(exc)

    def close(self) -> None:
        self.flush()
        self._failed(None)

    def _failed(self, exc: OSError | None) -> None:
        if exc is not None and self._summary.error is None:
            self._summary.error = f"the timeline stopped here: {exc.strerror or exc}"
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError as late:  # what was still buffered could not be written
                if self._summary.error is None:
                    self._summary.error = f"the timeline stopped here: {late.strerror or late}"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"
