"""Bytes each GPU sends to the others per optimizer step, per data-parallel strategy (the time model's
communication term, and the arithmetic 02_multi_gpu teaches).

Why a module of its own: the byte count is pure arithmetic on a few numbers (parameters, bytes per parameter,
GPUs, micro-batches per step), shared by the time model (``timing.predict_time``) and the notebook arithmetic
(``lab_helpers.planning.arithmetic``). Deriving it once keeps the two from disagreeing.

Ψ is the parameter bytes (parameters x bytes per parameter in the precision they travel in). With ring
collectives (NCCL's default for these sizes, and gloo's) each GPU sends, per call on a tensor of S bytes:
all-reduce 2(N-1)/N x S (a reduce-scatter then an all-gather); all-gather and reduce-scatter (N-1)/N x S each.
``link_bytes_per_gpu`` is that, summed over a step: a lower bound of what crosses each GPU's link (tree
algorithms, protocol headers and padding only add). ``psi_multiple`` is the same in units of Ψ, counting an
all-reduce as 2 (the ZeRO paper's convention), so DDP = 2Ψ.

Per optimizer step of ``m`` micro-batches on each GPU:

* **single**: nothing.
* **DDP**: one all-reduce of the gradients per step, 2Ψ whatever ``m``: Lightning's Trainer runs the
  accumulating micro-batches under DDP's ``no_sync`` and all-reduces in the last backward only (Lightning 2.x
  ``strategies/parallel.py`` ``block_backward_sync``: ``no_sync`` for a DistributedDataParallel model only).
* **FSDP FULL_SHARD** (``sharding="full"``, ZeRO-3 style): every micro-batch all-gathers the weights for forward,
  again for backward (they were freed after forward) and reduce-scatters the gradients: 3Ψ per micro-batch,
  6Ψ at m = 2. FSDP does not skip the reduce-scatter during accumulation in the lab's runs (``no_sync`` would
  keep unsharded gradients on every GPU, undoing the memory saving; Lightning's ``block_backward_sync`` does
  nothing for an FSDP model).
* **FSDP SHARD_GRAD_OP** (``sharding="grad-op"``, ZeRO-2 style): the weights gathered for forward stay until
  backward: one all-gather and one reduce-scatter per micro-batch, 2Ψ per micro-batch, 4Ψ at m = 2.
* **DeepSpeed ZeRO-2**: reduce-scatter of the gradients in every micro-batch's backward, then one all-gather of
  the updated weights after the optimizer step: (m + 1)Ψ (2Ψ at m = 1, as the ZeRO paper says). Source:
  DeepSpeed 0.19 ``runtime/engine.py`` ``allreduce_gradients``: "ZeRO stage >= 2 communicates during non
  gradient accumulation boundaries as well" (``zero_optimization_partition_gradients()`` ->
  ``overlapping_partition_gradients_reduce_epilogue`` on every backward; stage 1 communicates "only at gradient
  accumulation boundaries"); ``runtime/zero/stage_1_and_2.py`` ``step`` ends with ``all_gather_dp_groups`` of the
  updated bit16 partitions.
* **DeepSpeed ZeRO-3**: like FULL_SHARD, 3Ψ per micro-batch (gradients reduce-scattered on every backward,
  same source; weights gathered in forward and backward). DeepSpeed may keep weights that are reused within
  ``stage3_max_reuse_distance`` parameters (the last blocks of forward are the first of backward), which saves
  part of the backward gather: for ZeRO-3 this is the figure without that reuse.

LoRA/QLoRA: only the trainable parameters have gradients to reduce (``trainable_parameter_count``); FSDP and
ZeRO-3 still gather every weight they shard.

Optimizer offload moves data between host and device, not between GPUs: ``host_device_bytes_per_optimizer_step``
counts it separately (its bandwidth is PCIe's, not the GPU link's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .errors import PlanError

SHARDINGS: dict[str, str] = {
    "full": "full",
    "full_shard": "full",
    "FULL_SHARD": "full",
    "grad-op": "grad-op",
    "shard_grad_op": "grad-op",
    "SHARD_GRAD_OP": "grad-op",
}
"""Accepted spellings of FSDP's sharding: the lab's recipe option (``full``/``grad-op``) or torch's enum names."""

# Ψ-units and ring factor per collective: an all-reduce is a reduce-scatter plus an all-gather.
_PSI_UNITS: dict[str, int] = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}


class Collective(NamedTuple):
    """One kind of collective in a step: ``size_bytes`` is the whole tensor (Ψ or the trainable gradients)."""

    name: str  # "all-reduce", "all-gather" or "reduce-scatter"
    size_bytes: int
    times_per_step: int
    purpose: str  # what it moves, for a reader: "gradients", "weights for forward", ...

    def link_bytes_per_gpu(self, world_size: int) -> float:
        """Bytes each GPU sends for this collective per step with a ring algorithm."""
        return _PSI_UNITS[self.name] * (world_size - 1) / world_size * self.size_bytes * self.times_per_step


@dataclass(frozen=True)
class CommunicationVolume:
    """What one optimizer step sends between GPUs, per GPU (see the module docstring for each strategy)."""

    strategy: str
    world_size: int
    micro_batches_per_step: int
    psi_bytes: int  # Ψ: parameters x bytes per parameter
    collectives: tuple[Collective, ...]
    link_bytes_per_gpu: float  # lower bound, ring algorithms
    psi_multiple: float  # model-sized transfers per step (all-reduce counted as 2)

    def describe(self) -> str:
        """One line for a person: the collectives and the total."""
        if not self.collectives:
            return f"{self.strategy}: no communication between GPUs"
        parts = ", ".join(f"{c.name} of {c.purpose} x{c.times_per_step}" for c in self.collectives)
        return (
            f"{self.strategy} on {self.world_size} devices, {self.micro_batches_per_step} micro-batch(es) per step: "
            f"{parts} = {self.psi_multiple:g}Ψ, {self.link_bytes_per_gpu / 1e9:.3g} GB sent per device per step"
        )


def communication_per_optimizer_step(
    *,
    strategy: str,
    parameter_count: int,
    bytes_per_parameter: int,
    world_size: int,
    micro_batches_per_step: int,
    sharding: str | None = None,
    trainable_parameter_count: int | None = None,
) -> CommunicationVolume:
    """The collectives of one optimizer step of ``strategy`` and the bytes each GPU sends for them.

    ``parameter_count`` x ``bytes_per_parameter`` is Ψ (the weights as they travel: 2 B in bf16, 4 B in fp32).
    ``micro_batches_per_step`` is the gradient accumulation on each GPU. ``sharding`` is FSDP's (``full``,
    the default, or ``grad-op``). ``trainable_parameter_count`` (default: all) sizes the gradient collectives:
    LoRA reduces only its adapters' gradients."""
    if parameter_count < 0 or bytes_per_parameter < 1:
        raise PlanError(f"parameter_count must be >= 0 and bytes_per_parameter >= 1, got {parameter_count}, "
                        f"{bytes_per_parameter}")
    if world_size < 1 or micro_batches_per_step < 1:
        raise PlanError(f"world_size and micro_batches_per_step must be >= 1, got {world_size}, "
                        f"{micro_batches_per_step}")
    if sharding is not None and strategy != "fsdp":
        raise PlanError(f"sharding {sharding!r} is an FSDP setting, not one of {strategy!r}")
    trainable = parameter_count if trainable_parameter_count is None else trainable_parameter_count
    if not 0 <= trainable <= parameter_count:
        raise PlanError(f"trainable_parameter_count must be within 0..{parameter_count}, got {trainable}")
    psi = parameter_count * bytes_per_parameter
    grads = trainable * bytes_per_parameter
    m = micro_batches_per_step
    collectives: tuple[Collective, ...]
    if strategy == "single" or world_size == 1:
        collectives = ()
    elif strategy == "ddp":
        collectives = (Collective("all-reduce", grads, 1, "gradients (last micro-batch; no_sync before)"),)
    elif strategy == "fsdp":
        mode = SHARDINGS.get(sharding or "full")
        if mode is None:
            raise PlanError(f"unknown FSDP sharding {sharding!r}: expected full or grad-op")
        gathers = 2 if mode == "full" else 1
        collectives = (
            Collective("all-gather", psi, gathers * m, "weights (forward and backward)" if gathers == 2
                       else "weights (forward, kept for backward)"),
            Collective("reduce-scatter", grads, m, "gradients"),
        )
    elif strategy == "deepspeed-zero2":
        collectives = (
            Collective("reduce-scatter", grads, m, "gradients (every backward)"),
            Collective("all-gather", grads, 1, "updated weights"),
        )
    elif strategy == "deepspeed-zero3":
        collectives = (
            Collective("all-gather", psi, 2 * m, "weights (forward and backward)"),
            Collective("reduce-scatter", grads, m, "gradients (every backward)"),
        )
    else:
        raise PlanError(f"unknown strategy {strategy!r}: single, ddp, fsdp, deepspeed-zero2 or deepspeed-zero3")
    link = sum(c.link_bytes_per_gpu(world_size) for c in collectives)
    multiple = sum(_PSI_UNITS[c.name] * c.size_bytes * c.times_per_step for c in collectives) / psi if psi else 0.0
    name = strategy if strategy != "fsdp" else f"fsdp ({SHARDINGS.get(sharding or 'full')})"
    return CommunicationVolume(name, world_size, m, psi, collectives, link, multiple)


@dataclass(frozen=True)
class HostDeviceTraffic:
    """Bytes one GPU moves over PCIe per optimizer step with DeepSpeed's optimizer offload."""

    device_to_host_bytes: float  # gradient partitions, every micro-batch
    host_to_device_bytes: float  # updated weight partition, once per step

    @property
    def total_bytes(self) -> float:
        return self.device_to_host_bytes + self.host_to_device_bytes


def host_device_bytes_per_optimizer_step(
    *, trainable_parameter_count: int, bytes_per_parameter: int, world_size: int, micro_batches_per_step: int
) -> HostDeviceTraffic:
    """Optimizer offload's PCIe traffic per GPU and step: each GPU owns 1/N of the trainable parameters.

    DeepSpeed (ZeRO-2 and ZeRO-3 with ``offload_optimizer``) copies the GPU's reduced gradient partition to the
    host after every micro-batch's backward (it accumulates in fp32 on the CPU: ``stage_1_and_2.py``
    ``async_accumulate_grad_in_cpu_via_gpu`` / stage 3's ``partition_grads``), the CPU steps Adam, and the
    updated partition comes back once per step in the training precision."""
    if world_size < 1 or micro_batches_per_step < 1:
        raise PlanError(f"world_size and micro_batches_per_step must be >= 1, got {world_size}, "
                        f"{micro_batches_per_step}")
    partition = trainable_parameter_count * bytes_per_parameter / world_size
    return HostDeviceTraffic(partition * micro_batches_per_step, partition)
