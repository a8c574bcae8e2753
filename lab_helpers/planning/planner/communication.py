"""Bytes each GPU sends to the others per optimizer step, per data-parallel strategy: the time model's
communication term and 02_multi_gpu's arithmetic, counted in one place so the two agree.

Ψ is parameters x bytes per parameter as they travel. A ring collective (NCCL's default at these sizes, and gloo's)
sends per GPU 2(N-1)/N x S for an all-reduce and (N-1)/N x S for an all-gather or a reduce-scatter: a lower bound.
``psi_multiple`` counts an all-reduce as 2Ψ (the ZeRO paper's convention). Per step of ``a`` micro-batches, as read
in torch 2.13 / Lightning 2.6.6 and counted on a fake process group (tests/test_communication.py):

* DDP: 2Ψ whatever ``a``: Lightning's Trainer accumulates inside ``block_backward_sync()``, i.e. ``no_sync``.
* FSDP1 (``FSDPStrategy``, the GPU path) has ``no_sync`` too: one reduce-scatter (Ψ) per step, each rank keeping
  the whole gradients until then. Gathers: FULL_SHARD per block (2a + 1)Ψ − aΨ_root (blocks gathered for forward
  and again for backward; the root unit is not resharded after forward); FULL_SHARD as one unit (a + 1)Ψ;
  SHARD_GRAD_OP 2Ψ (under ``no_sync`` it is not freed after backward, so it stays whole for the whole step).
* FSDP2 (``fully_shard`` under ``ModelParallelStrategy``, the CPU ranks): the LightningModule has no ``no_sync``
  and the Trainer never calls ``set_requires_gradient_sync``, so every micro-batch reduce-scatters and reshards:
  per block 3aΨ − aΨ_root, one unit 2aΨ, SHARD_GRAD_OP 2aΨ.
* ZeRO-2: (a + 1)Ψ: stage 2 reduce-scatters on every backward (DeepSpeed 0.19 ``engine.allreduce_gradients``),
  then all-gathers the updated weights once.
* ZeRO-3: 3aΨ, without the backward gather that ``stage3_max_reuse_distance`` may save.

LoRA reduces only its trainable gradients; FSDP and ZeRO-3 still gather every weight they shard.
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

WRAPPINGS = ("block", "none")
"""``block``: each transformer block a unit, the rest the root (the lab's ``fsdp``); ``none``: the whole model
one unit (the course's ``FSDPStrategy()``)."""

FSDP_IMPLS = ("fsdp1", "fsdp2")

# Ψ-units and ring factor per collective: an all-reduce is a reduce-scatter plus an all-gather.
_PSI_UNITS: dict[str, int] = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}


class Collective(NamedTuple):
    """``size_bytes`` is the whole tensor, not a rank's shard."""

    name: str  # "all-reduce", "all-gather" or "reduce-scatter"
    size_bytes: int
    times_per_step: int
    purpose: str  # what it moves, for a reader: "gradients", "weights for forward", ...

    def link_bytes_per_gpu(self, world_size: int) -> float:
        return _PSI_UNITS[self.name] * (world_size - 1) / world_size * self.size_bytes * self.times_per_step


@dataclass(frozen=True)
class CommunicationVolume:
    strategy: str
    world_size: int
    micro_batches_per_step: int
    psi_bytes: int  # Ψ: parameters x bytes per parameter
    collectives: tuple[Collective, ...]
    link_bytes_per_gpu: float  # lower bound, ring algorithms
    psi_multiple: float  # model-sized transfers per step (all-reduce counted as 2)
    formula: str = ""  # the count in a and Ψ, e.g. "(2a + 1)Ψ − aΨ_root"; "" where gradients are not Ψ (LoRA)

    def describe(self) -> str:
        if not self.collectives:
            return f"{self.strategy}: no communication between GPUs"
        parts = ", ".join(f"{c.name} of {c.purpose} x{c.times_per_step}" for c in self.collectives)
        formula = f"{self.formula} = " if self.formula else ""
        return (
            f"{self.strategy} on {self.world_size} devices, {self.micro_batches_per_step} micro-batch(es) per step: "
            f"{parts} = {formula}{self.psi_multiple:.3g}Ψ, {self.link_bytes_per_gpu / 1e9:.3g} GB sent per device "
            "per step"
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
    wrapping: str | None = None,
    root_parameter_count: int = 0,
    fsdp_impl: str | None = None,
) -> CommunicationVolume:
    """``trainable_parameter_count`` (default: all) sizes the gradient collectives. ``root_parameter_count``: with
    ``block`` wrapping, the parameters no block holds (embedding, final norm, head); 0 counts the root like a block.
    The other FSDP arguments are ignored for other strategies, so a caller may pass a spec's FSDP fields whatever its
    strategy; ``sharding`` is refused there."""
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
    a = micro_batches_per_step
    collectives: tuple[Collective, ...]
    formula = ""
    name = strategy
    if strategy == "single" or world_size == 1:
        collectives = ()
    elif strategy == "ddp":
        collectives = (Collective("all-reduce", grads, 1, "gradients (last micro-batch; no_sync before)"),)
        formula = "2Ψ"
    elif strategy == "fsdp":
        mode = SHARDINGS.get(sharding or "full")
        if mode is None:
            raise PlanError(f"unknown FSDP sharding {sharding!r}: expected full or grad-op")
        wrap = wrapping or "block"
        impl = fsdp_impl or "fsdp1"
        if wrap not in WRAPPINGS:
            raise PlanError(f"unknown FSDP wrapping {wrapping!r}: expected block or none")
        if impl not in FSDP_IMPLS:
            raise PlanError(f"unknown FSDP implementation {fsdp_impl!r}: expected fsdp1 or fsdp2")
        if not 0 <= root_parameter_count <= parameter_count:
            raise PlanError(f"root_parameter_count must be within 0..{parameter_count}, got {root_parameter_count}")
        collectives, formula = _fsdp(mode, wrap, impl, a, psi, grads, root_parameter_count * bytes_per_parameter)
        name = f"fsdp ({mode}, {'per block' if wrap == 'block' else 'one unit'}, {impl})"
    elif strategy == "deepspeed-zero2":
        collectives = (
            Collective("reduce-scatter", grads, a, "gradients (every backward)"),
            Collective("all-gather", grads, 1, "updated weights"),
        )
        formula = "(a + 1)Ψ"
    elif strategy == "deepspeed-zero3":
        collectives = (
            Collective("all-gather", psi, 2 * a, "weights (forward and backward)"),
            Collective("reduce-scatter", grads, a, "gradients (every backward)"),
        )
        formula = "3aΨ"
    else:
        raise PlanError(f"unknown strategy {strategy!r}: single, ddp, fsdp, deepspeed-zero2 or deepspeed-zero3")
    collectives = tuple(c for c in collectives if c.size_bytes and c.times_per_step)
    link = sum(c.link_bytes_per_gpu(world_size) for c in collectives)
    multiple = sum(_PSI_UNITS[c.name] * c.size_bytes * c.times_per_step for c in collectives) / psi if psi else 0.0
    if trainable != parameter_count or not collectives:
        formula = ""  # the gradients' terms are not Ψ: the collectives say it
    return CommunicationVolume(name, world_size, a, psi, collectives, link, multiple, formula)


def _fsdp(
    mode: str, wrap: str, impl: str, a: int, psi: int, grads: int, root: int
) -> tuple[tuple[Collective, ...], str]:
    if wrap == "none":
        root = psi  # the one unit is the root
    no_sync = impl == "fsdp1"
    reduce = Collective(
        "reduce-scatter",
        grads,
        1 if no_sync else a,
        "gradients (last micro-batch; no_sync before)" if no_sync else "gradients (every micro-batch: no no_sync)",
    )
    if mode == "grad-op":
        kept = "weights (first forward; kept until the last backward)" if no_sync else "weights (forward, kept for backward)"
        return (Collective("all-gather", psi, 1 if no_sync else a, kept), reduce), "2Ψ" if no_sync else "2aΨ"
    gathers = (
        Collective("all-gather", psi - root, 2 * a, "block weights (forward, again for backward)"),
        Collective("all-gather", root, a, _root_words(wrap)),
    )
    if wrap == "none":
        formula = "(a + 1)Ψ" if no_sync else "2aΨ"
    else:
        formula = ("(2a + 1)Ψ" if no_sync else "3aΨ") + (" − aΨ_root" if root else "")
    return (*gathers, reduce), formula


def _root_words(wrap: str) -> str:
    unit = "the one unit's weights" if wrap == "none" else "root unit's weights"
    return f"{unit} (forward; kept for backward)"


@dataclass(frozen=True)
class HostDeviceTraffic:
    device_to_host_bytes: float  # gradient partitions, every micro-batch
    host_to_device_bytes: float  # updated weight partition, once per step

    @property
    def total_bytes(self) -> float:
        return self.device_to_host_bytes + self.host_to_device_bytes


def host_device_bytes_per_optimizer_step(
    *, trainable_parameter_count: int, bytes_per_parameter: int, world_size: int, micro_batches_per_step: int
) -> HostDeviceTraffic:
    """Each GPU's 1/N gradient partition goes to the host after every micro-batch's backward (DeepSpeed accumulates
    in fp32 on the CPU), and the updated partition comes back once per step."""
    if world_size < 1 or micro_batches_per_step < 1:
        raise PlanError(f"world_size and micro_batches_per_step must be >= 1, got {world_size}, "
                        f"{micro_batches_per_step}")
    partition = trainable_parameter_count * bytes_per_parameter / world_size
    return HostDeviceTraffic(partition * micro_batches_per_step, partition)
