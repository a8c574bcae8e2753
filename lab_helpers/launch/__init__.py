"""How an experiment's training process is started: one launcher per way of training, one small interface.

``lab.run_experiment`` asks ``launcher_for(run)`` and never looks at which one it got. Each launcher writes
what its process needs into the run's folder and returns the argv; the runner starts and watches it the same
way for both, and every process reports through the same contract (``child_report``, ``record_schema``).

- ``litgpt-cli`` (``litgpt_cli``): litgpt's own CLI in one process, wrapped by ``child_litgpt`` (section 01).
- ``lightning-strategy`` (``lightning_strategy``): the Lightning Trainer with DDP, FSDP or DeepSpeed, one
  process per rank (``lab_helpers.training.distributed``, section 02).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from lab_helpers.config.experiments import ResolvedRun


class Launcher(Protocol):
    name: str
    supports_quick: bool
    """Quick mode (run until the peak and a steady step are measured) is implemented for this launcher."""

    def command(self, run: ResolvedRun, run_dir: Path) -> list[str]:
        """Write what the training process needs into ``run_dir`` and return the argv that starts it."""
        ...

    def ranks(self, run: ResolvedRun) -> list[int | None]:
        """The rank label of each record the run gets (None for a single process): one record per rank, always,
        so a rank killed before it could report still gets one."""
        ...


def launcher_for(run: ResolvedRun) -> Launcher:
    """The launcher the experiment names (``launcher:`` in configs/experiments/*.yaml)."""
    from lab_helpers.launch.lightning_strategy import LightningStrategyLauncher
    from lab_helpers.launch.litgpt_cli import LitgptCliLauncher

    launchers: dict[str, Launcher] = {
        LitgptCliLauncher.name: LitgptCliLauncher(),
        LightningStrategyLauncher.name: LightningStrategyLauncher(),
    }
    return launchers[run.experiment.launcher]
