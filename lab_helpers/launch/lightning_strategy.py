from __future__ import annotations

from pathlib import Path

from lab_helpers.config.experiments import ResolvedRun


class LightningStrategyLauncher:
    name = "lightning-strategy"
    supports_quick = True  # the script reorders the data module's loader per rank (quick_mode)

    def command(self, run: ResolvedRun, run_dir: Path) -> list[str]:
        from lab_helpers.training.distributed.command import build_command

        return build_command(run, run_dir)

    def ranks(self, run: ResolvedRun) -> list[int | None]:
        return list(range(run.ranks_run))  # a simulated rank: rank 0 alone
