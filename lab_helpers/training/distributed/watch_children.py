"""Rank 0 watches the local ranks Lightning started, and reports for a dead one.

Lightning's own observer SIGKILLs rank 0 without a report when a child dies; the lab turns it off
(``peers.without_lightning_observer``) so that the record names the cause. A callback, because the children exist
only once the Trainer's ``setup`` has run.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L

from lab_helpers.training import child_report
from lab_helpers.training.distributed import peers
from lab_helpers.training.distributed.reporting import RankReport


class WatchChildren(L.Callback):
    """Often rank 0 learns of a dead peer first from its own collective failing (gloo: "Connection reset by peer");
    ``on_exception`` then names the dead rank."""

    def __init__(self, report: RankReport, *, devices: int) -> None:
        self.report = report
        self.devices = devices
        self.procs: list = []
        self.first_rank = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        report = self.report
        self.procs = getattr(trainer.strategy.launcher, "procs", None) or []
        self.first_rank = trainer.node_rank * self.devices
        if self.procs and trainer.local_rank == 0:
            peers.watch_children(
                self.procs,
                lambda message: report.write("error", message),
                on_dead_child=lambda local_rank, message: report_for_dead_rank(
                    self.first_rank + local_rank, message, report.fields
                ),
                is_interrupt=lambda: peers.was_terminated() or self._peers_interrupted(),
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning installed its own SIGTERM handler just before the loop (it signals the children and runs a
        # broadcast inside the handler, which fails once a peer is gone): put back the lab's, which only
        # raises KeyboardInterrupt, so that an interrupt is reported as one
        if not peers.was_terminated():
            peers.sigterm_as_interrupt()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        report = self.report
        if isinstance(exception, KeyboardInterrupt) or peers.was_terminated() or self._peers_interrupted():
            # every rank was interrupted: let them all report; this rank's failure is the interrupt too
            for local_rank in peers.let_children_finish(self.procs):
                message = f"local rank {local_rank} was interrupted while waiting for its peers"
                report_for_dead_rank(self.first_rank + local_rank, message, report.fields, status="interrupted")
            _, text = child_report.status_for_exception(exception)
            report.write("interrupted", f"interrupted; this rank then stopped with:\n{text[-1500:]}")
            return
        dead = peers.dead_children(self.procs, wait_s=2.0)
        for local_rank, message in dead:
            report_for_dead_rank(self.first_rank + local_rank, message, report.fields)
        if dead:
            _, text = child_report.status_for_exception(exception)
            # the dead peer last: the record's one-line reason is the error's last line
            report.write("error", f"{text[-1500:]}\nthis rank failed because {dead[0][1]}")

    def _peers_interrupted(self) -> bool:
        directory = child_report.report_dir()
        if not self.procs or directory is None:
            return False
        time.sleep(0.5)  # a peer that is exiting may still be writing its report
        reports = child_report.read_reports(directory)
        return any(
            reports.get(self.first_rank + i + 1, {}).get("status") == "interrupted" for i in range(len(self.procs))
        )


def report_for_dead_rank(rank: int, message: str, fields: dict[str, Any], *, status: str = "error") -> None:
    directory = child_report.report_dir()
    if directory is None or (directory / f"rank{rank}.json").exists():
        return
    child_report.write_report(
        {
            "status": status,
            "error": f"{message} (reported by rank 0: this rank left no report)",
            "world_size": fields.get("world_size"),
            "strategy_used": fields.get("strategy_used"),
        },
        rank=rank,
    )
