"""This machine's CPU speed, measured once and cached. Not in the planner: its time model takes every hardware fact
as an argument, to predict for any machine; on a CPU the matmul rate stands in for a datasheet peak.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from lab_helpers.config.paths import write_lab_file

CACHE_ENV = "LAB_CPU_SPEED_CACHE"


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
    cache: dict = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}
    cached = cache.get(key) if isinstance(cache, dict) else None
    names = {"matmul_flops_per_s", "adam_params_per_s"}
    if not refresh and isinstance(cached, dict) and names <= set(cached):
        return CpuRates(float(cached["matmul_flops_per_s"]), float(cached["adam_params_per_s"]))
    measured = {"matmul_flops_per_s": _measure_matmul(), "adam_params_per_s": _measure_adam()}
    if isinstance(cached, dict):  # a refresh keeps the best rate seen: other work only slows a timing down
        measured = {k: max(v, float(cached.get(k) or 0.0)) for k, v in measured.items()}
    rates = CpuRates(**measured)
    if not isinstance(cache, dict):
        cache = {}
    cache[key] = asdict(rates)
    try:
        write_lab_file(path, json.dumps(cache, indent=1).encode())  # atomic, never through a link
    except OSError:
        pass  # a read-only home: measure again next time
    return rates


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
