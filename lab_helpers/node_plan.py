"""What the notebooks do with each experiment on *this* node: the decision ``run-all`` makes, with a ``run()`` for
the cell. Apart from ``planning.decision`` because running needs ``lab``, which sits above the decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from lab_helpers.hardware.node import gpu_memory_gib
from lab_helpers.planning import decision, node_limits
from lab_helpers.planning.decision import FP16_ROUTE, LAB_GPU_GIB, LOSS_SCALING, SIMULATED_WORLD, Decision
from lab_helpers.planning.node_limits import bf16_native, gpu_words, reference_hint

__all__ = [
    "Step", "decide", "minutes_words", "lease_table", "overview", "section_note", "offload_words"
]


@dataclass(frozen=True)
class Step(Decision):
    """A :class:`~lab_helpers.planning.decision.Decision` a notebook cell can run."""

    def run(self, **kwargs: Any) -> list[dict[str, Any]]:
        from lab_helpers import lab

        if self.runs:
            return lab.run_experiment(
                self.exp_id, profile=self.profile, overrides=self.overrides, simulate_world=self.simulate_world, **kwargs
            )
        return lab.record_skipped(self.exp_id, profile=self.profile, reason=self.sentence, overrides=self.overrides)

    def with_overrides(self, more: Mapping[str, Any]) -> Step:
        """A lever on the same run (``arithmetic.step_lever``) that runs, or is skipped, where this step is."""
        return replace(self, overrides={**self.overrides, **more})


def decide(exp_id: str, node: Mapping[str, Any], *, path: str | None = None, **how: Any) -> Step:
    """On the core path (``path`` or ``$LAB_PATH``) an optional experiment is a skip saying what it would have added."""
    from lab_helpers.present.lease import core_path_skip

    sentence = core_path_skip(exp_id, path)
    if sentence:
        return Step(exp_id=exp_id, profile=how["profile"], runs=False, expected_status="skipped", sentence=sentence)
    return Step(**asdict(decision.decide(exp_id, node, **how)))


def lease_table(node: Mapping[str, Any], *, profile: str, path: str | None = None):
    """00's table, and ``python -m lab_helpers minutes``."""
    from lab_helpers.present import lease

    minutes = {nb: lease.notebook_minutes(nb, node, profile=profile, path=path) for nb in lease.NOTEBOOKS}
    return lease.path_table(minutes)


def minutes_words(notebook: str, node: Mapping[str, Any], *, profile: str, path: str | None = None) -> str:
    from lab_helpers.present.lease import notebook_minutes

    where = f"{gpu_words(node)}, {profile} profile" if node.get("gpus") else f"this machine's CPU, {profile} profile"
    return notebook_minutes(notebook, node, profile=profile, path=path).words_line(where)


# ----------------------------------------------------------------------------------------------- overviews


def overview(node: Mapping[str, Any], *, profile: str = "gpu"):
    """Model states only, no planner: a quick first answer; 01 asks the planner before each run."""
    import pandas as pd

    from lab_helpers.config.experiments import load_experiments
    from lab_helpers.planning.arithmetic import model_states

    memory = gpu_memory_gib(node)
    where = f"on {gpu_words(node)}"
    if memory is None:  # no GPU here: answer for the GPU LAB.md is written for
        memory, where = LAB_GPU_GIB, f"on an {LAB_GPU_GIB:.0f} GiB GPU (none here)"
    rows = []
    for exp_id in load_experiments("single"):
        states = model_states(exp_id, profile=profile)
        if states.gib > memory:
            verdict = "no: model states alone exceed the GPU"
        else:
            verdict = f"model states use {100 * states.gib / memory:.0f} %; 01 asks the planner"
        rows.append((exp_id, states.precision, round(states.gib, 1), verdict))
    return pd.DataFrame(rows, columns=["experiment", "precision", "model states GiB", where])


def section_note(node: Mapping[str, Any], *, section: str, profile: str) -> str:
    """The sentence at the top of 01 / 02: what this node runs of the section, and why."""
    gpus = node.get("gpus") or []
    if profile == "ci":
        return (
            "ci profile: every experiment runs on tiny CPU stand-ins (QLoRA and 8-bit AdamW, bitsandbytes' CUDA "
            "kernels, are skipped); section 02's multi-GPU runs are rank 0 of 4 simulated alone on the CPU (memory "
            "real, no communication), the two-node run 2 real processes over loopback; "
            f"{reference_hint()}"
        )
    if section == "multi" and len(gpus) < 2:
        return (
            f"{gpu_words(node)}: this section runs one-gpu and DeepSpeed offload for real; DDP and FSDP run as rank 0 "
            f"of {SIMULATED_WORLD} simulated alone on this GPU (its memory real; time without communication, and no "
            f"communication measured); the two-node run needs 2 GPUs and is recorded as skipped. {reference_hint()}"
        )
    route = "" if bf16_native(node) else f"; no native bf16: bf16 experiments run in {FP16_ROUTE}, {LOSS_SCALING}"
    return f"{gpu_words(node)}{route}: each cell says whether its experiment runs as defined, smaller, or not"


def offload_words(step: Decision, node: Mapping[str, Any]) -> str:
    """ONE host-RAM figure, the planner's formula that the run's gate checks, split into its parts."""
    from lab_helpers.config.experiments import gradient_accumulation_steps, resolve
    from lab_helpers.config.record_schema import GIB
    from lab_helpers.planning.arithmetic import model_states
    from lab_helpers.planning.planner.analytic import HOST_PROCESS_BYTES, OFFLOADED_BYTES_PER_TRAINABLE_PARAM

    run = resolve(step.exp_id, step.profile, step.overrides, check_files=False, simulate_world=step.simulate_world)
    ranks = node_limits.node_ranks(run, node)
    train = run.recipe["train"]
    trainable = model_states(step.exp_id, profile=step.profile, overrides=step.overrides).counts.trainable
    offloaded = trainable * OFFLOADED_BYTES_PER_TRAINABLE_PARAM / GIB
    need = node_limits.offload_host_gib(run, ranks)
    return (
        f"{step.exp_id} here: micro batch {train['micro_batch_size']} x accumulate "
        f"{gradient_accumulation_steps(run.recipe, world_size=ranks)} on {ranks} rank(s) = global batch "
        f"{train['global_batch_size']}; host RAM {need:.1f} GiB = {offloaded:.1f} GiB offloaded "
        f"({OFFLOADED_BYTES_PER_TRAINABLE_PARAM} B/param x {trainable:,} trained parameters: fp32 master "
        f"weights, Adam's two moments, fp32 gradient partitions) + the rest, {need - offloaded:.1f} GiB, for "
        f"{ranks} rank process(es) at {HOST_PROCESS_BYTES / GIB:.1f} GiB each"
    )
