"""Which device measured a figure's runs and in which mode, for its title: a PNG travels without its notebook, and
one that does not say "CPU stand-in" or "quick mode" invites reading CPU noise as GPU figures. Read from the
records, never from the machine drawing the figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lab_helpers.config.iteration_times import finite_number
from lab_helpers.hardware.gpu_peaks import nominal_memory_gib

CPU_STAND_IN = "CPU stand-in"
CPU_TIME_NOTE = "code path only"
"""What a CPU stand-in's times are: how long the lab's code path took on tiny models, never a GPU figure."""


UNNAMED_GPU = "a GPU (name not recorded)"
UNKNOWN_DEVICE = "device not recorded"


def device_of(record: Mapping[str, Any]) -> str:
    """Where the record names no device, the figure says so rather than guess."""
    name = record.get("device_name")
    if isinstance(name, str) and name:
        return CPU_STAND_IN if name.lower().startswith("cpu") else name
    environment = record.get("environment")
    gpus = environment.get("gpu_names") if isinstance(environment, Mapping) else None
    if record.get("profile") == "gpu" and isinstance(gpus, list) and gpus and isinstance(gpus[0], str) and gpus[0]:
        return gpus[0]  # a run skipped before it started a process: the node's GPU, from the launcher
    if record.get("profile") == "gpu" or finite_number(record.get("peak_alloc_gib")) is not None:
        return UNNAMED_GPU
    return CPU_STAND_IN if record.get("profile") == "ci" else UNKNOWN_DEVICE


def mode_of(record: Mapping[str, Any]) -> str | None:
    mode = record.get("mode")
    return mode if mode in ("quick", "full") else None


def on_cpu(records: Iterable[Mapping[str, Any]]) -> bool:
    devices = {device_of(r) for r in records}
    return devices == {CPU_STAND_IN}


def describe(records: Iterable[Mapping[str, Any]]) -> str:
    """Naming the runs of a minority mode: ``NVIDIA H100 80GB HBM3, quick mode (full: one-gpu)``."""
    records = list(records)
    if not records:
        return "no runs"
    devices = sorted({device_of(r) for r in records})
    device = " + ".join(d + (f" ({CPU_TIME_NOTE})" if d == CPU_STAND_IN else "") for d in devices)
    by_mode: dict[str, list[str]] = {}
    for record in records:
        by_mode.setdefault(mode_of(record) or "unknown", []).append(str(record.get("experiment")))
    if len(by_mode) == 1:
        mode = next(iter(by_mode))
        return f"{device}, {mode} mode" if mode != "unknown" else f"{device}, mode not recorded"
    main = max(by_mode, key=lambda m: len(by_mode[m]))
    others = "; ".join(f"{m}: {', '.join(dict.fromkeys(names))}" for m, names in by_mode.items() if m != main)
    return f"{device}, {main} mode ({others})"


def gpu_capacity_gib(records: Iterable[Mapping[str, Any]]) -> tuple[float, str] | None:
    """None for CPU runs, mixed GPUs or an unknown size: no line is better than a wrong one."""
    names = {device_of(r) for r in records}
    if len(names) != 1 or names & {CPU_STAND_IN, UNNAMED_GPU, UNKNOWN_DEVICE}:
        return None
    name = names.pop()
    size = nominal_memory_gib(name)
    return (size, name) if size else None
