"""This machine's CPU, measured: fp32 matmul FLOP/s and torch Adam parameters/s, once, then cached.

Why measured here and not in the planner: the time model (``planner.timing``) takes every fact about the
hardware as an argument, so that one prediction can be made for any machine and tested with exact numbers.
On a CPU (the ci profile) the matmul rate stands in for a datasheet peak; with optimizer offload the Adam rate
is the host's optimizer step. The callers that predict for *this* machine (``plan_command.predict_step_time``,
``benchmarks/planner_time_check.py``) measure it here and pass it in.
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
"""Where the measured rates are kept (default ``~/.cache/lab_helpers/hardware/cpu_speed.json``)."""


@dataclass(frozen=True)
class CpuRates:
    """A CPU's measured speed: fp32 matmul FLOP/s (its "peak") and torch Adam parameters stepped per second."""

    matmul_flops_per_s: float
    adam_params_per_s: float


def measure_cpu_rates(*, refresh: bool = False) -> CpuRates:
    """This machine's rates, measured once (about a second) and cached.

    The cache is keyed by host, CPU count, torch threads and torch version, so a different machine or build
    measures again. On a shared machine a timing is only ever slowed down by other work, so ``refresh=True``
    keeps the best of old and new."""
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
    """``work`` per second of the fastest of ``repeats`` timed calls (the fastest is the least disturbed)."""
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
