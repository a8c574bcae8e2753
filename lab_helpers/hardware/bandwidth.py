"""Measure the bus bandwidth between this node's GPUs (NCCL, or gloo on a CPU) for the time model: the link is the
one figure no datasheet gives for a leased node. It is nccl-tests' *bus bandwidth* (algorithm bandwidth times the
ring factor, 2(N-1)/N for all-reduce), the rate at which each GPU's bytes cross its link, so it divides
``planner.communication``'s ``link_bytes_per_gpu`` directly. The best of the repeats is kept: other work only slows.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.paths import read_lab_file, shown_path, write_lab_file

FILE_NAME = "bandwidth.json"
FILE_MAX_BYTES = 2**20  # an entry per host and device is ~300 bytes: a node's file is a few kB
PLAUSIBLE_GBS = (1e-3, 1e4)
"""GB/s, from a congested 10 Mb/s link to beyond NVLink's 900: outside, an entry is hand-made or a fault (1e-300
GB/s makes a step of 1.88e+297 s) and is treated as unmeasured."""
CPU_PROCESSES = 2  # the ci profile plays a 2-rank run on one CPU (configs/experiments/multi.yaml: devices "all")
GPU_SIZE_BYTES = 256 * 2**20  # large enough that NCCL reaches its bus bandwidth (nccl-tests plateau ~64-256 MiB)
CPU_SIZE_BYTES = 16 * 2**20  # gloo on a shared CPU: a size that takes tens of ms, not seconds
REPEATS = 5


@dataclass(frozen=True)
class BandwidthResult:
    """One measurement on one node; ``*_busbw_gbs`` in GB/s (10^9 bytes), the nccl-tests definition."""

    host: str
    device_name: str  # the GPU's name, or "cpu"
    backend: str  # "nccl" or "gloo"
    world_size: int
    size_bytes: int
    all_reduce_busbw_gbs: float
    all_gather_busbw_gbs: float
    measured_at: str

    @property
    def link_gbs(self) -> float:
        """The figure the time model uses: the slower of the two collectives (a step runs both kinds)."""
        return min(self.all_reduce_busbw_gbs, self.all_gather_busbw_gbs)

    def lines(self) -> list[str]:
        return [
            f"{self.backend} on {self.world_size} x {self.device_name} ({self.host}), {self.size_bytes / 2**20:.0f} MiB "
            "per collective:",
            f"  all-reduce bus bandwidth {self.all_reduce_busbw_gbs:8.2f} GB/s",
            f"  all-gather bus bandwidth {self.all_gather_busbw_gbs:8.2f} GB/s",
            f"  plan --time uses {self.link_gbs:.2f} GB/s on this node when no --link-gbs is given",
        ]


def measure(
    *, world_size: int | None = None, size_bytes: int | None = None, progress: Callable[[str], None] = print
) -> BandwidthResult:
    import torch
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus else "gloo"
    if world_size is None:
        world_size = gpus if gpus else CPU_PROCESSES
    if world_size < 2:
        raise ValueError(f"bandwidth needs at least 2 ranks to send anything between, got {world_size}")
    if gpus and world_size > gpus:
        raise ValueError(f"{world_size} ranks asked for, but this node has {gpus} GPU(s)")
    size = int(size_bytes or (GPU_SIZE_BYTES if gpus else CPU_SIZE_BYTES))
    device_name = torch.cuda.get_device_name(0) if gpus else "cpu"
    progress(f"measuring all-reduce and all-gather over {backend}, {world_size} ranks, {size / 2**20:.0f} MiB ...")
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _rank_main, args=(world_size, backend, size, _free_port(), results), nprocs=world_size, start_method="spawn"
    )
    seconds = results.get()  # rank 0's best times
    algbw_ar, algbw_ag = size / seconds["all_reduce"] / 1e9, size / seconds["all_gather"] / 1e9
    ring = (world_size - 1) / world_size
    return BandwidthResult(
        host=platform.node(),
        device_name=device_name,
        backend=backend,
        world_size=world_size,
        size_bytes=size,
        all_reduce_busbw_gbs=algbw_ar * 2 * ring,
        all_gather_busbw_gbs=algbw_ag * ring,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, backend: str, size: int, port: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "gloo":
        torch.set_num_threads(1)  # ranks share the CPU: one core each, as the ci profile's runs do
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        numel = size // 4
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        shard = torch.ones(numel // world_size, dtype=torch.float32, device=device)
        gathered = torch.empty(shard.numel() * world_size, dtype=torch.float32, device=device)
        pieces = list(gathered.chunk(world_size))
        runs = {
            "all_reduce": lambda: dist.all_reduce(tensor),
            # NCCL gathers into one flat tensor (what FSDP calls); gloo has no native form of that: a list
            "all_gather": (lambda: dist.all_gather_into_tensor(gathered, shard))
            if backend == "nccl"
            else (lambda: dist.all_gather(pieces, shard)),
        }
        best = {name: _best_seconds(run, device) for name, run in runs.items()}
        if rank == 0:
            results.put(best)
    finally:
        dist.destroy_process_group()


def _best_seconds(run: Callable[[], Any], device: Any) -> float:
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    run()  # warm-up: connections, buffers
    sync()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
        sync()
    return best


# ----------------------------------------------------------------------------------------------- the record


def bandwidth_path() -> Path:
    from lab_helpers.config.paths import results_dir

    return results_dir() / FILE_NAME


def save(result: BandwidthResult, path: Path | None = None) -> Path:
    return keep_per_node(result, path or bandwidth_path())


def keep_per_node(result: Any, path: Path) -> Path:
    """The latest per (host, device); a file there the lab may not write (a FIFO, a link) loses the measurement."""
    try:
        entries = _read(path, strict=True)
        entries[f"{result.host}|{result.device_name}"] = asdict(result)
        return write_lab_file(path, json.dumps(entries, indent=1, sort_keys=True).encode())  # never through a link
    except OSError as exc:
        raise LabConfigError(f"{shown_path(path)}: not written: {exc.strerror or exc}; remove it and measure "
                             "again") from None  # fmt: skip


def this_hosts_entries(path: Path) -> list[dict[str, Any]]:
    host = platform.node()
    return [e for e in _read(path).values() if isinstance(e, dict) and e.get("host") == host]


def _read(path: Path, *, strict: bool = False) -> dict[str, Any]:
    """A file that breaks the lab's reading rule, or is not JSON, is skipped in one line (``strict``: raised)."""
    try:
        data = json.loads(read_lab_file(path, max_bytes=FILE_MAX_BYTES))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if strict:
            raise
        warnings.warn(f"{shown_path(path)}: not read: {exc.strerror or exc}", stacklevel=3)
        return {}
    except (ValueError, RecursionError):  # damaged: replaced by the next measurement
        warnings.warn(f"{shown_path(path)}: not read: not JSON", stacklevel=3)
        return {}
    return data if isinstance(data, dict) else {}


def _link_gbs(entry: dict[str, Any]) -> float | str:
    figures = [entry.get("all_reduce_busbw_gbs"), entry.get("all_gather_busbw_gbs")]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in figures):
        return "its bus bandwidths are missing or not numbers"
    low, high = PLAUSIBLE_GBS
    if not all(low <= v <= high for v in figures):
        return f"bus bandwidths {figures[0]:.3g} and {figures[1]:.3g} GB/s, outside {low:g}-{high:g} GB/s"
    if not isinstance(entry.get("measured_at"), str):
        return "its measured_at is missing or not text"
    return float(min(figures))


def measured_link_gbs(device_name: str | None, path: Path | None = None) -> tuple[float | None, str | None]:
    """Measured on *this* host only; ``device_name`` None: this node's GPUs."""
    host = platform.node()
    for entry in this_hosts_entries(path or bandwidth_path()):
        same = (
            entry.get("device_name") == device_name
            if device_name is not None
            else entry.get("backend") == "nccl"
        )
        if not same:
            continue
        gbs = _link_gbs(entry)
        if isinstance(gbs, str):  # an edited or damaged entry: unmeasured, and said
            warnings.warn(f"{shown_path(path or bandwidth_path())}: the entry of {host}'s {entry.get('device_name')!r} "
                          f"ignored ({gbs}): taken as unmeasured; `bandwidth` measures it again", stacklevel=2)  # fmt: skip
            continue
        return gbs, f"measured by `bandwidth` on {host}, {entry['measured_at']}"
    return None, None
