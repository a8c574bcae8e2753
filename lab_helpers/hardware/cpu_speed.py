"""This machine's CPU speed, measured once and cached. Not in the planner: its time model takes every hardware fact
as an argument, to predict for any machine; on a CPU the matmul rate stands in for a datasheet peak.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from lab_helpers.config.paths import read_lab_file, shown_path, write_lab_file

CACHE_ENV = "LAB_CPU_SPEED_CACHE"
CACHE_MAX_BYTES = 2**20  # an entry per host, CPU count, threads and torch: ~100 bytes each


@dataclass(frozen=True)
class CpuRates:
    matmul_flops_per_s: float
    adam_params_per_s: float


def measure_cpu_rates(*, refresh: bool = False) -> CpuRates:
    """About a second, then cached per host, CPU count, torch threads and version. Other work only ever slows a
    timing, so ``refresh=True`` keeps the best of old and new."""
    import torch

    key = f"{platform.node()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}"
    path = _cache_path()
    cache = _read_cache(path)
    cached = _rates(cache.get(key))
    if not refresh and cached is not None:
        return cached
    measured = {"matmul_flops_per_s": _measure_matmul(), "adam_params_per_s": _measure_adam()}
    if cached is not None:  # a refresh keeps the best rate seen: other work only slows a timing down
        measured = {k: max(v, getattr(cached, k)) for k, v in measured.items()}
    rates = CpuRates(**measured)
    cache[key] = asdict(rates)
    try:
        write_lab_file(path, json.dumps(cache, indent=1).encode())  # atomic, never through a link
    except OSError:
        pass  # a read-only home: measure again next time
    return rates


def _read_cache(path: Path) -> dict:
    """By the readers' rule (``paths.read_lab_file``: a regular file, no link, capped); a FIFO would hang `plan`."""
    try:
        cache = json.loads(read_lab_file(path, max_bytes=CACHE_MAX_BYTES))
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a link, a FIFO, too large: measured again (and not kept: the writer refuses it too)
        warnings.warn(f"{shown_path(path)}: not read ({exc.strerror}): the CPU is measured again", stacklevel=3)
        return {}
    except (ValueError, RecursionError):  # damaged: measured again and replaced
        return {}
    return cache if isinstance(cache, dict) else {}


PLAUSIBLE = {"matmul_flops_per_s": (1e6, 1e18), "adam_params_per_s": (1e3, 1e15)}
"""Rates a CPU can measure: outside, a kept entry is an edit or damage (1e-300 would make each step ages)."""


def _rates(entry: object) -> CpuRates | None:
    """A kept entry whose two rates are numbers within ``PLAUSIBLE``, else None: measured again."""
    if not isinstance(entry, dict):
        return None
    values = [entry.get(name) for name in PLAUSIBLE]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and low <= v <= high
               for v, (low, high) in zip(values, PLAUSIBLE.values(), strict=True)):  # fmt: skip
        return None
    return CpuRates(float(values[0]), float(values[1]))


def _cache_path() -> Path:
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lab_helpers" / "cpu_speed.json"


def _best_rate(work: float, run: Callable[[], object], repeats: int = 5) -> float:
    """The fastest call is the least disturbed."""
    run()  # warm-up: thread pool, allocation
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return work / max(best, 1e-9)


def _measure_matmul(n: int = 1024) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return _best_rate(2.0 * n**3 * 2, lambda: [torch.mm(a, b) for _ in range(2)])


def _measure_adam(numel: int = 2**22) -> float:
    import torch

    param = torch.nn.Parameter(torch.zeros(numel))
    param.grad = torch.randn(numel)
    optimizer = torch.optim.Adam([param], lr=1e-3)
    return _best_rate(float(numel), optimizer.step, repeats=3)
