"""What a figure shows, in words for its title: which device measured the runs and in which mode.

Why: the same plots are drawn from an H100's records, from the CPU stand-ins of the ci profile and from a
student's own runs, and a PNG travels without its notebook. A figure that does not say "NVIDIA H100 80GB HBM3,
quick mode" or "CPU stand-in" invites reading CPU noise as GPU figures, or a quick run's 3 s beside a full run's
24 s as a 7x slowdown. The words come from the records themselves (``device_name``, ``profile``, ``mode``),
never from the machine drawing the figure.
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
    """The GPU's name for a run on a GPU, ``CPU stand-in`` for a run on a CPU (``device_name`` "cpu (...)", or an
    older ci record without a device name). A gpu-profile record without one (a run skipped before its process
    started) takes the node's GPU from ``environment.gpu_names``; one that measured CUDA memory, or ran the gpu
    profile, without either was on an unnamed GPU; with neither, the figure says the device is not recorded rather than guess."""
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
    """``quick`` or ``full`` as the record says (None where it does not)."""
    mode = record.get("mode")
    return mode if mode in ("quick", "full") else None


def on_cpu(records: Iterable[Mapping[str, Any]]) -> bool:
    """True when every run drawn trained on a CPU: their times are the code path's only."""
    devices = {device_of(r) for r in records}
    return devices == {CPU_STAND_IN}


def describe(records: Iterable[Mapping[str, Any]]) -> str:
    """One line for a title: the device(s) and the mode, naming the runs of a minority mode, e.g.
    ``NVIDIA H100 80GB HBM3, quick mode (full: one-gpu)`` or ``CPU stand-in (code path only), full mode``."""
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
    """(GiB, GPU name) of the GPU the runs measured on, from its nominal size (``gpu_peaks.nominal_memory_gib``);
    None for CPU runs, mixed GPUs or a GPU whose size is unknown: no line is better than a wrong one."""
    names = {device_of(r) for r in records}
    if len(names) != 1 or names & {CPU_STAND_IN, UNNAMED_GPU, UNKNOWN_DEVICE}:
        return None
    name = names.pop()
    size = nominal_memory_gib(name)
    return (size, name) if size else None
