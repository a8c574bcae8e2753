"""Rank 0 of an N-rank run, alone on this machine's one device: torch's fake process group (``--simulate-world N``).

Why: a rank's memory does not depend on the other ranks being real. What rank 0 allocates -- its shards, the
units it gathers, DDP's buckets, ZeRO's partitions and reduce buckets, its activations -- is decided by the
world size and its rank, not by what the peers send. torch ships a process group whose collectives return at
once (``torch.testing._internal.distributed.fake_pg``: ``FakeStore`` and the ``"fake"`` backend; torchtitan's
memory estimator runs rank 0 of a large world on one GPU this way). So a node with one GPU (or none) can
measure the per-rank memory of every multi-GPU experiment, and check the planner's per-rank prediction.

What is the same as a real run: the Lightning Trainer, the strategy class (DDPStrategy; FSDP through
FSDPStrategy on CUDA or ModelParallelStrategy + fully_shard on a CPU; DeepSpeedStrategy), the module, the data,
the optimizer; the Trainer is told the world has N ranks and this is rank 0 (``SimulatedRankEnvironment``).
What differs, and the record says so (``simulated_world_size``, ``strategy_used``):

- the process group is ``fake``: no communication happens, the collectives' results are wrong (gathered
  weights, reduced gradients and the loss are not what N real ranks would compute; memory is, time is not);
- DDP's gradient all-reduce is torch's ``noop_hook`` (the fake group's all-reduce hands back no tensor, which
  DDP's reducer rejects): it returns the bucket itself, as NCCL's in-place all-reduce leaves it, so the
  memory is the same (``SimulatedDDPStrategy``);
- NCCL's own buffers (outside the caching allocator) do not exist;
- the Trainer runs as node 0 of N nodes of one device (``devices=1, num_nodes=N``) rather than one node of N
  devices: the same world size, rank and data share for rank 0, and no other process is started;
- time covers computation only: ``train_s`` and tokens/s are labelled "no communication".
"""

from __future__ import annotations

from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

SIMULATED_BACKEND = "fake"
"""torch.distributed's backend whose collectives return at once (registered by importing fake_pg)."""


def strategy_label(label: str, world_size: int) -> str:
    """``strategy_used`` of a simulated rank: what ran, and that it ran as rank 0 of ``world_size`` alone."""
    return (
        f"{label}; simulated rank 0 of {world_size} (fake process group, no communication; the Trainer as node 0 of "
        f"{world_size} one-device nodes)"
    )


class SimulatedRankEnvironment(LightningEnvironment):
    """A cluster environment that says: world of ``world_size`` ranks, this process is rank 0 of node 0.

    ``creates_processes_externally`` is True so that Lightning starts no other process (the other ranks do not
    exist); the strategies' ``set_world_ranks`` arithmetic (node rank x devices + local rank) gives rank 0 and
    world N because the Trainer is built with ``devices=1, num_nodes=N``.
    """

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
    """Start the default process group as rank 0 of ``world_size`` with the fake backend (before the Trainer:
    Lightning and DeepSpeed then find it initialised and use it instead of starting their own)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists; a simulated rank must start its own fake one")
    dist.init_process_group(SIMULATED_BACKEND, store=FakeStore(), rank=0, world_size=world_size)


class SimulatedDDPStrategy(DDPStrategy):
    """Lightning's DDPStrategy, registering its communication hook on a CPU too (Lightning registers hooks only on
    CUDA, a torch 1.8 restriction); the simulated rank's hook is ``noop_hook``."""

    def _register_ddp_hooks(self) -> None:
        from lightning.pytorch.strategies.ddp import _register_ddp_comm_hook

        _register_ddp_comm_hook(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_hook=self._ddp_comm_hook,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
        )
