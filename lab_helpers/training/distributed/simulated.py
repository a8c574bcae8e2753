"""Rank 0 of an N-rank run, alone on one device: torch's fake process group (``--simulate-world N``).

What rank 0 allocates is decided by the world size and its rank, not by what the peers send, so one GPU (or none)
measures the per-rank memory of every multi-GPU experiment, as torchtitan's memory estimator does. Not measured:
time (no communication), NCCL's own buffers, and the collectives' results (the loss is wrong).
"""

from __future__ import annotations

from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

SIMULATED_BACKEND = "fake"  # registered by importing torch.testing._internal.distributed.fake_pg


def strategy_label(label: str, world_size: int) -> str:
    return (
        f"{label}; simulated rank 0 of {world_size} (fake process group, no communication; the Trainer as node 0 of "
        f"{world_size} one-device nodes)"
    )


class SimulatedRankEnvironment(LightningEnvironment):
    """The Trainer runs as node 0 of N one-device nodes (``devices=1, num_nodes=N``), so that Lightning's rank
    arithmetic gives rank 0 of N, and creates processes "externally", so that it starts none."""

    def __init__(self, world_size: int) -> None:
        super().__init__()
        if world_size < 2:
            raise ValueError(f"a simulated world needs at least 2 ranks, got {world_size}")
        self._simulated_world_size = world_size
        self._world_size = world_size

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return self._simulated_world_size

    def set_world_size(self, size: int) -> None:
        if size != self._simulated_world_size:
            raise ValueError(f"the Trainer asked for world size {size}, the simulated world is {self.world_size()}")

    def global_rank(self) -> int:
        return 0

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return 0


def init_fake_process_group(world_size: int) -> None:
    """Before the Trainer: Lightning and DeepSpeed then use it instead of starting their own."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists; a simulated rank must start its own fake one")
    dist.init_process_group(SIMULATED_BACKEND, store=FakeStore(), rank=0, world_size=world_size)


class SimulatedDDPStrategy(DDPStrategy):
    """Registers the communication hook on a CPU too (Lightning does only on CUDA). The simulated rank's hook is
    ``noop_hook``: the fake all-reduce hands back no tensor, which DDP's reducer rejects."""

    def _register_ddp_hooks(self) -> None:
        from lightning.pytorch.strategies.ddp import _register_ddp_comm_hook

        _register_ddp_comm_hook(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_hook=self._ddp_comm_hook,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
        )
