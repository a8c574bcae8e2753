"""Per-rank timing, token counts, per-iteration rows and the rank's report: the same contract as the litgpt child's.

A Lightning callback, because the Trainer owns the loop, and ``on_exception`` runs on the failing rank before
Lightning tears anything down: the last moment a report can still be written.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lab_helpers.training import child_report
from lab_helpers.training.tensor_peak import LiveTensorPeak


class RankReport:
    def __init__(self, *, rank: int, world_size: int, strategy_used: str | None = None) -> None:
        self.rank = rank
        self.fields: dict[str, Any] = {
            "world_size": world_size,
            "strategy_used": strategy_used,
            "iterations": 0,
            "samples": 0,
            "tokens": 0,
            "tokens_padded": 0,
            "train_s": None,
            "warmup_s": None,
            "warmup_iterations": None,
            "device_name": None,
            "device_uuid": None,
        }
        self._written = False
        self._lock = threading.Lock()
        self.alloc_before_train_gib: float | None = None  # the load phase's peak, kept when training resets it
        # on a CPU: live tensor bytes over the whole process (train.tensor_peak_on_cpu); the loop's peak starts
        # at on_train_start, as max_memory_allocated's does on CUDA
        self.tensors: LiveTensorPeak | None = None
        self._loop_started = False

    def write(self, status: str, error: str | None = None) -> None:
        with self._lock:
            if self._written:
                return
            self._written = True
            alloc, reserved = child_report.cuda_peaks_gib()
            tensors = self.tensors
            child_report.write_report(
                {
                    **self.fields,
                    "device_uuid": child_report.device_uuid(),
                    "status": status,
                    "error": error,
                    "peak_alloc_gib": alloc,
                    "peak_reserved_gib": reserved,
                    "peak_alloc_whole_run_gib": child_report.whole_run_peak_gib(self.alloc_before_train_gib, alloc),
                    "peak_tensor_gib": tensors.peak_gib if tensors is not None and self._loop_started else None,
                    "peak_tensor_whole_run_gib": None if tensors is None else tensors.whole_run_peak_gib,
                },
                rank=self.rank,
            )

    def write_exception(self, exc: BaseException) -> None:
        from lab_helpers.training.distributed import peers

        status, text = child_report.status_for_exception(exc)
        if peers.was_terminated() and status == "error":
            # after SIGTERM a rank often fails in a collective its interrupted peers left: the interrupt is the cause
            status, text = "interrupted", f"interrupted (SIGTERM); then:\n{text[-1500:]}"
        self.write(status, text)

    @property
    def written(self) -> bool:
        return self._written


def _clocks() -> tuple[float, float]:
    return time.monotonic(), time.process_time()


def host_fields(start: tuple[float, float] | None, end: tuple[float, float]) -> dict[str, Any]:
    if start is None or end[0] <= start[0]:
        return {"host_core_pct": None, "loop_monotonic_s": None}
    wall_s = end[0] - start[0]
    return {"host_core_pct": 100 * (end[1] - start[1]) / wall_s, "loop_monotonic_s": [start[0], end[0]]}


class ReportCallback(L.Callback):
    """As in the litgpt path, the warm-up steps are timed and counted apart from the rest."""

    def __init__(
        self, report: RankReport, *, total_iterations: int, metrics_csv: Path | None = None, warmup_steps: int = 1
    ) -> None:
        self.report = report
        self.warmup_steps = warmup_steps
        self.total_iterations = total_iterations
        self.metrics_csv = metrics_csv  # rank 0 writes its per-iteration rows here
        self._tokens_seen = 0  # this rank's tokens without padding, warm-up included (litgpt's "tokens" column)
        self._train_t0: float | None = None
        self._iter_t0 = 0.0
        self._seen = 0  # micro-batches so far, warm-up included
        self._warmup: dict[str, Any] | None = None  # counts at the end of the warm-up step
        # (time.monotonic, time.process_time) where the loop starts and where its warm-up ends: host_core_pct
        # (this rank's CPU time, every thread, over the timed loop's wall time) and loop_monotonic_s, which
        # gpu_busy_pct averages NVML over, as the litgpt child reports them
        self._loop_clock: tuple[float, float] | None = None
        self._steady_clock: tuple[float, float] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report.rank = trainer.global_rank
        self.report.fields["device_name"] = child_report.device_name(pl_module.device)
        # peaks over the training loop, not the model load; the load's is kept for the whole-run peak
        self.report.alloc_before_train_gib = child_report.reset_cuda_peaks()
        if self.report.tensors is not None:  # what exists now is already counted: the peak restarts from it
            self.report.tensors.seed(local_tensors([*pl_module.parameters(), *pl_module.buffers()]))
            self.report._loop_started = True
        self._train_t0 = time.perf_counter()
        self._loop_clock = _clocks()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._iter_t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        fields = self.report.fields
        now = time.perf_counter()
        accum = trainer.accumulate_grad_batches
        self._seen += 1
        fields["iterations"] += 1
        fields["samples"] += int(batch["input_ids"].shape[0])
        tokens = _tokens_without_padding(batch)
        fields["tokens"] += tokens
        self._tokens_seen += tokens
        fields["tokens_padded"] += int(batch["input_ids"].numel())
        fields.setdefault("seq_lens", []).append(int(batch["input_ids"].shape[-1]))  # warm-up's too: length_split
        fields["train_s"] = now - (self._train_t0 or self._iter_t0)
        if self._seen == accum * self.warmup_steps:  # the warm-up ends here: what follows is timed and counted
            self._warmup = {"t": now, **{k: fields[k] for k in ("iterations", "samples", "tokens", "tokens_padded")}}
            self._steady_clock = _clocks()
            fields["warmup_s"], fields["warmup_iterations"] = fields["train_s"], self._seen
            for key in ("iterations", "samples", "tokens", "tokens_padded"):
                fields[key] = 0
        elif self._warmup is not None:
            fields["train_s"] = now - self._warmup["t"]
        if trainer.is_global_zero:
            # Lightning hands back the loss divided by the accumulation; print it as litgpt does, undivided
            loss = outputs["loss"].item() * accum if isinstance(outputs, dict) and "loss" in outputs else float("nan")
            step_done = self._seen % accum == 0
            iter_time_s = time.perf_counter() - self._iter_t0
            self._write_row(loss, iter_time_s)
            print(
                f"Epoch {trainer.current_epoch + 1} | iter {self._seen} step {self._seen // accum} |"
                f" loss train: {loss:.3f} | iter time: {iter_time_s * 1000:.2f} ms"
                f"{' (step)' if step_done else ''} | of {self.total_iterations}",
                flush=True,
            )

    def on_train_end(self, trainer, pl_module) -> None:
        fields = self.report.fields
        now = time.perf_counter()
        if self._warmup is not None and fields["iterations"] > 0:
            fields["train_s"] = now - self._warmup["t"]
        elif self._train_t0 is not None:  # no step after the warm-up: time (and count) the whole loop
            fields["train_s"] = now - self._train_t0
            if self._warmup is not None:
                for key in ("iterations", "samples", "tokens", "tokens_padded"):
                    fields[key] = self._warmup[key]
            fields["warmup_s"], fields["warmup_iterations"] = None, 0
        steady = self._warmup is not None and fields["iterations"] > 0
        fields.update(host_fields(self._steady_clock if steady else self._loop_clock, _clocks()))
        self.report.write("ok")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.report.write_exception(exception)

    def _write_row(self, loss: float, iter_time_s: float) -> None:
        """Appended and flushed per row: a run that dies keeps the rows it made."""
        if self.metrics_csv is None:
            return
        new = not self.metrics_csv.exists()
        self.metrics_csv.parent.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_csv, "a", newline="") as fh:
            writer = csv.writer(fh)
            if new:
                writer.writerow(METRICS_COLUMNS)
            writer.writerow([self._seen, loss, iter_time_s, self._tokens_seen])


def local_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


METRICS_COLUMNS = ("iter", "loss", "iter_time", "tokens")  # litgpt's CSV logger's: run_record reads both


def _tokens_without_padding(batch: dict[str, Any]) -> int:
    counts = batch.get("token_counts") or {}
    value = counts.get("raw_plus_prompt_template")
    if isinstance(value, torch.Tensor):
        # a sample longer than max_seq_length was truncated by the collate function
        return int(value.clamp(max=batch["input_ids"].shape[1]).sum().item())
    return int((batch["labels"] != -100).sum().item())
