"""How an experiment's training process is started: ``litgpt-cli`` (litgpt's CLI in one process, section 01) or
``lightning-strategy`` (the Lightning Trainer, one process per rank, section 02).

The runner starts and watches either argv the same way; ``lab.run_experiment`` looks at the launcher's name only
to refuse ``trace_steps`` where the Lightning ranks do not profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from lab_helpers.config.experiments import ResolvedRun


class Launcher(Protocol):
    name: str
    supports_quick: bool

    def command(self, run: ResolvedRun, run_dir: Path) -> list[str]:
        """Write what the training process needs into ``run_dir`` and return the argv that starts it."""
        ...

    def ranks(self, run: ResolvedRun) -> list[int | None]:
        """One record per rank (None for a single process), so that a rank killed before it reported still gets one."""
        ...


def launcher_for(run: ResolvedRun) -> Launcher:
    from lab_helpers.launch.lightning_strategy import LightningStrategyLauncher
    from lab_helpers.launch.litgpt_cli import LitgptCliLauncher

    launchers: dict[str, Launcher] = {
        LitgptCliLauncher.name: LitgptCliLauncher(),
        LightningStrategyLauncher.name: LightningStrategyLauncher(),
    }
    return launchers[run.experiment.launcher]
