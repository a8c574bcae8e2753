"""What a training process reports back to the runner that launched it.

The runner cannot see inside the training process: peak allocated / reserved CUDA memory must be read there
(``torch.cuda.max_memory_allocated`` is per process), and so must the time spent inside the training loop.
Every training entry point (the litgpt wrapper, the Lightning script for the multi-GPU section) writes one
small JSON file per rank into the directory named by ``$LAB_REPORT_DIR``; the runner turns them into records.
Each file is written to a temporary name and renamed, so the runner never reads half a report, and redacted
(secrets.py) first, so no token in an error text is ever stored.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

from lab_helpers.config.record_schema import GIB, REPORT_FIELD_NAMES

REPORT_DIR_ENV = "LAB_REPORT_DIR"

# Fields a report may carry (all optional except status; lab_helpers.config.record_schema.REPORT_FIELDS has the units):
#   status: "ok" | "oom" | "error" | "interrupted"   (the runner adds "timeout" and "skipped" in records)
#   error: str | None                 -- the allocator's OOM message or the tail of the traceback
#   rank: int | None, world_size: int
#   peak_alloc_gib, peak_reserved_gib: float | None   (None on a CPU, never 0)
#   peak_tensor_gib: float | None      -- on a CPU: the peak of live tensor bytes over training (tensor_peak)
#   peak_alloc_whole_run_gib: float | None  -- max_memory_allocated over the whole process (load included), as
#                                        litgpt prints it; peak_alloc_gib starts when training starts
#   peak_tensor_whole_run_gib: float | None -- on a CPU: the same over the whole process
#   peak_phase: str | None             -- the loop's phase of the training peak (tensor_peak.PEAK_PHASES)
#   train_s: float                     -- inside the training loop after the warm-up step, validation excluded
#   warmup_s: float | None             -- the first optimizer step's iterations (None: not timed apart)
#   warmup_iterations: int | None      -- micro-batches of warm-up (0: the run was too short to exclude any)
#   tokens, tokens_padded: int         -- training tokens without / with padding inside train_s
#   samples: int, iterations: int      -- micro-batches inside train_s
#   device_name: str                   -- the GPU's name, or "cpu (<processor>)" (device_name())
#   device_uuid: str | None            -- the GPU this rank used, as NVML names it ("GPU-..."): maps NVML readings
#   strategy_used: str | None          -- e.g. "fsdp2 (ModelParallelStrategy)" when a fallback ran
REPORT_FIELDS = REPORT_FIELD_NAMES
_ERROR_TAIL_CHARS = 4000


def report_dir() -> Path | None:
    value = os.environ.get(REPORT_DIR_ENV)
    return Path(value) if value else None


def write_report(fields: dict[str, Any], *, rank: int | None = None, directory: Path | None = None) -> Path | None:
    """Write this process's report; a no-op (returning None) when not launched by the runner."""
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


def read_reports(directory: Path) -> dict[int, dict[str, Any]]:
    """All reports in ``directory`` keyed by rank file number (0 for a single process)."""
    reports: dict[int, dict[str, Any]] = {}
    for path in sorted(directory.glob("rank*.json")):
        try:
            reports[int(path.stem[4:])] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue  # a report that cannot be read is the same as none: the runner falls back to exit codes
    return reports


def cuda_peaks_gib() -> tuple[float | None, float | None]:
    """(peak allocated, peak reserved) in GiB for this process, or (None, None) without CUDA."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB


def reset_cuda_peaks() -> float | None:
    """Start the training run's peak here; returns the peak allocated so far (GiB: the load phase's), or None."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        before = torch.cuda.max_memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
        return before
    return None


def whole_run_peak_gib(before_reset: float | None, since_reset: float | None) -> float | None:
    """The whole process's peak allocated from the peak before the training run's reset and the one since."""
    known = [v for v in (before_reset, since_reset) if v is not None]
    return max(known) if known else None


OOM_MARKERS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")
"""How an allocation failure reads when it does not come from PyTorch's allocator: cuBLAS and cuDNN ask for
their workspaces themselves and report a failed allocation as an error status, not as torch.OutOfMemoryError."""


def is_oom_text(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in OOM_MARKERS)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA OOMs however they surface (torch's own type, or a RuntimeError from a kernel, cuBLAS or NCCL)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and is_oom_text(str(exc))


def device_uuid() -> str | None:
    """The UUID of this process's current GPU as NVML spells it ("GPU-<uuid>"), or None without CUDA.

    NVML numbers GPUs by PCI bus, CUDA by speed (and through CUDA_VISIBLE_DEVICES): only the UUID names the
    same GPU in both, so the launcher can pick this rank's row of the NVML timeline.
    """
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        return normalize_gpu_uuid(str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid))
    except Exception:  # an old driver or a MIG slice without a UUID: the launcher falls back to the rank
        return None


def device_name(device=None) -> str:
    """The name of the device this process trains on, the same way in every training process: the GPU's name
    (``torch.cuda.get_device_name``), or ``"cpu (<processor>)"`` on a CPU. ``device``: a torch.device (default:
    the current CUDA device where CUDA is up, else the CPU)."""
    import torch

    on_cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
    if on_cuda:
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def normalize_gpu_uuid(text: str) -> str:
    """torch prints a bare UUID, NVML "GPU-<uuid>": one spelling for both."""
    text = text.strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def status_for_exception(exc: BaseException) -> tuple[str, str]:
    """(status, error text) to report for an exception that ended training."""
    if is_out_of_memory(exc):
        return "oom", str(exc)[:_ERROR_TAIL_CHARS]
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", "interrupted"
    text = "".join(traceback.format_exception(exc))
    return "error", text[-_ERROR_TAIL_CHARS:]
