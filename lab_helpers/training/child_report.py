"""What a training process reports back to the runner: ``max_memory_allocated`` and the loop's time can only be read
inside it. One JSON file per rank, renamed into place so that the runner never reads half a report.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

from lab_helpers.config.record_schema import GIB, REPORT_FIELD_NAMES

REPORT_DIR_ENV = "LAB_REPORT_DIR"

REPORT_FIELDS = REPORT_FIELD_NAMES  # each with its unit and meaning: record_schema.REPORT_FIELDS
_ERROR_TAIL_CHARS = 4000


def report_dir() -> Path | None:
    value = os.environ.get(REPORT_DIR_ENV)
    return Path(value) if value else None


def write_report(fields: dict[str, Any], *, rank: int | None = None, directory: Path | None = None) -> Path | None:
    directory = directory or report_dir()
    if directory is None:
        return None
    unknown = set(fields) - set(REPORT_FIELDS)
    if unknown:
        raise ValueError(f"unknown report fields: {sorted(unknown)}")
    target = directory / f"rank{rank if rank is not None else 0}.json"
    from lab_helpers.config.paths import write_lab_file  # the rule of every file the lab writes: never through a link
    from lab_helpers.config.secrets import redact_mapping  # an error text can carry a token: never store one

    return write_lab_file(target, json.dumps(redact_mapping({"rank": rank, **fields}), default=str).encode())


REPORT_MAX_BYTES = 4 * 2**20  # a report's fields and its error's tail (_ERROR_TAIL_CHARS): a few kB


def read_reports(directory: Path, *, folder: Path | None = None) -> dict[int, dict[str, Any]]:
    """Each read as a regular file inside ``folder`` (default ``directory``), never through a link nor from a FIFO
    (``paths.read_lab_file``): a report is data anyone may have planted."""
    from lab_helpers.config.paths import read_lab_file

    reports: dict[int, dict[str, Any]] = {}
    for path in sorted(directory.glob("rank*.json")):
        try:
            data = read_lab_file(path, max_bytes=REPORT_MAX_BYTES, folder=folder or directory)
            reports[int(path.stem[4:])] = json.loads(data)
        except (ValueError, OSError, RecursionError):
            continue  # a report that cannot be read is the same as none: the runner falls back to exit codes
    return reports


def cuda_peaks_gib() -> tuple[float | None, float | None]:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB


def reset_cuda_peaks() -> float | None:
    """Returns the load phase's peak, kept for the whole-run peak."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        before = torch.cuda.max_memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
        return before
    return None


def whole_run_peak_gib(before_reset: float | None, since_reset: float | None) -> float | None:
    known = [v for v in (before_reset, since_reset) if v is not None]
    return max(known) if known else None


OOM_MARKERS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")
"""cuBLAS and cuDNN allocate their workspaces themselves and report a failure as a status, not OutOfMemoryError."""


def is_oom_text(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in OOM_MARKERS)


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def device_uuid() -> str | None:
    """NVML numbers GPUs by PCI bus, CUDA by speed: only the UUID names the same GPU in both."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        return normalize_gpu_uuid(str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid))
    except Exception:  # an old driver or a MIG slice without a UUID: the launcher falls back to the rank
        return None


def device_name(device=None) -> str:
    import torch

    on_cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
    if on_cuda:
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def normalize_gpu_uuid(text: str) -> str:
    """torch prints a bare UUID, NVML "GPU-<uuid>"."""
    text = text.strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def status_for_exception(exc: BaseException) -> tuple[str, str]:
    if is_out_of_memory(exc):
        return "oom", str(exc)[:_ERROR_TAIL_CHARS]
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "interrupted"
    text = "".join(traceback.format_exception(exc))
    return "error", text[-_ERROR_TAIL_CHARS:]
