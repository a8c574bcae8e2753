"""What this node offers a run, in the words and numbers ``decision`` weighs: native bf16, its GPUs in words, the
ranks a run starts here, and host RAM against an optimizer-offload run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.record_schema import GIB
from lab_helpers.hardware.node import gpu_memory_gib

# ----------------------------------------------------------------------------------------------- the node


def bf16_native(node: Mapping[str, Any]) -> bool:
    gpus = node.get("gpus") or []
    return bool(gpus) and all(g.get("bf16_native") for g in gpus)


def gpu_words(node: Mapping[str, Any]) -> str:
    """``NVIDIA A10G (22.5 GiB)``, ``4 x NVIDIA H100 80GB HBM3 (79.6 GiB each)`` or ``no GPU``."""
    gpus = node.get("gpus") or []
    if not gpus:
        return "no GPU"
    memory = gpu_memory_gib(node)
    count = f"{len(gpus)} x " if len(gpus) > 1 else ""
    size = "" if memory is None else f" ({memory:.1f} GiB{' each' if len(gpus) > 1 else ''})"
    return f"{count}{gpus[0].get('name')}{size}"


def reference_hint() -> str:
    """Where the student finds real numbers for what this node cannot run (only files that exist are named)."""
    from lab_helpers.config.paths import reference_dir

    shipped = sorted(p.stem for p in reference_dir().glob("*.jsonl")) if reference_dir().is_dir() else []
    have = ", ".join(shipped) if shipped else "none yet"
    return f"reference results: 03_compare with USE_REFERENCE = True (shipped today: {have}; REFERENCE_NAME picks one)"


def ram_gib(node: Mapping[str, Any]) -> float | None:
    """The node's host RAM as ``describe_node`` read it (a container's memory limit counts)."""
    ram = (node.get("host") or {}).get("ram_total_gib")
    return float(ram) if isinstance(ram, (int, float)) else None


def node_ranks(run: Any, node: Mapping[str, Any]) -> int:
    """Ranks ``run`` starts on ``node``: "all" means this node's GPUs (a recorded node is not this machine); a
    simulated rank or a node without GPUs starts what the run was resolved with."""
    gpus = node.get("gpus") or []
    if run.simulated_world_size or not gpus or run.experiment.devices != "all":
        return run.world_size
    return len(gpus) * run.experiment.num_nodes


# ----------------------------------------------------------------------------------------------- host RAM


@dataclass(frozen=True)
class OffloadFit:
    """``smaller``: the profile's largest model that fits where the run's own does not (None: none does)."""

    need_gib: float
    ram_gib: float | None
    model: str
    smaller: tuple[str, str, float] | None  # (model key, checkpoint_dir, host GiB)

    @property
    def fits(self) -> bool:
        return self.ram_gib is not None and self.need_gib <= self.ram_gib

    def words(self) -> str:
        ram = "unknown" if self.ram_gib is None else f"{self.ram_gib:.0f} GiB"
        return (
            f"needs ~{self.need_gib:.0f} GiB of host RAM for the {self.model} (the planner: fp32 master weights, "
            f"Adam moments and gradients in host memory, 16 bytes per parameter, plus each rank's process) and "
            f"this node has {ram}"
        )


def offload_host_gib(run: Any, ranks: int) -> float:
    from lab_helpers.planning.arithmetic import model_states
    from lab_helpers.planning.planner.analytic import offload_host_bytes

    counts = model_states(run.experiment.id, profile=run.profile, overrides=run.overrides).counts
    return offload_host_bytes(counts.total, counts.trainable, max(1, ranks)) / GIB


def offload_fit(run: Any, node: Mapping[str, Any]) -> OffloadFit:
    from lab_helpers.config.experiments import check_profile

    ranks = node_ranks(run, node)
    ram = ram_gib(node)
    model = _model_of(run)
    need = offload_host_gib(run, ranks)
    if ram is not None and need <= ram:
        return OffloadFit(need, ram, model, None)
    best = None
    for key in check_profile(run.profile)["models"]:
        checkpoint_dir = smaller_model_checkpoint(run.profile, key)
        trial = _with_overrides(run, {"checkpoint_dir": checkpoint_dir})
        gib = offload_host_gib(trial, ranks)
        if ram is not None and gib <= ram:
            best = (key, checkpoint_dir, gib)  # profiles list their models smallest first
    return OffloadFit(need, ram, model, best)


def _model_of(run: Any) -> str:
    from pathlib import Path

    return Path(str(run.recipe.get("checkpoint_dir"))).name


def _with_overrides(run: Any, more: Mapping[str, Any]) -> Any:
    from lab_helpers.config.experiments import resolve

    return resolve(run.experiment.id, run.profile, {**run.overrides, **more}, check_files=False)


def smaller_model_checkpoint(profile: str, model: str) -> str:
    import yaml

    from lab_helpers.config.experiments import check_profile
    from lab_helpers.config.paths import configs_dir

    folder = check_profile(profile)["models"][model]
    recipe = yaml.safe_load((configs_dir() / profile / folder / "full.yaml").read_text())
    return str(recipe["checkpoint_dir"])
