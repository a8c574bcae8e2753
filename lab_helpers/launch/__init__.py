"""How an experiment's training process starts: litgpt's CLI in one process (section 01), or the Lightning Trainer,
one process per rank (``experiment.distributed``, section 02). The runner starts and watches either argv alike.
"""

from __future__ import annotations

from pathlib import Path

from lab_helpers.config.experiments import ResolvedRun


def command(run: ResolvedRun, run_dir: Path) -> list[str]:
    """Write what the training process needs into ``run_dir`` and return the argv that starts it."""
    if run.experiment.distributed:
        from lab_helpers.training.distributed.command import build_command

        return build_command(run, run_dir)
    from lab_helpers.launch import litgpt_cli

    return litgpt_cli.command(run, run_dir)


def ranks(run: ResolvedRun) -> list[int | None]:
    """One record per rank (None for a single process), so that a rank killed before it reported still gets one;
    a simulated rank is rank 0 alone."""
    return list(range(run.ranks_run)) if run.experiment.distributed else [None]


def traces(run: ResolvedRun) -> bool:
    """Only litgpt's loop carries the trace hook (``training.trace_hook``); the Lightning ranks do not trace."""
    return not run.experiment.distributed
