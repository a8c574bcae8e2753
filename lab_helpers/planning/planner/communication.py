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

Per optimizer step of ``a`` micro-batches on each GPU (``a`` = ``micro_batches_per_step``). Every count below
was read in the installed torch 2.13 / Lightning 2.6.6 and checked by running FSDP1 and FSDP2 on torch's fake
process group with the collectives counted (``tests/test_communication.py``, ``fake_pg_collectives``):

* **single**: nothing.
* **DDP**: one all-reduce of the gradients per step, 2Ψ whatever ``a``: Lightning's Trainer runs the
  accumulating micro-batches inside ``strategy.block_backward_sync()`` (``lightning/pytorch/loops/optimization/
  automatic.py`` line 184), which enters ``self.model.no_sync()`` whenever the model satisfies the runtime-checkable
  ``DistributedDataParallel`` protocol, i.e. has a ``no_sync`` method (``strategies/parallel.py`` lines 124-125,
  ``utilities/types.py`` lines 52-70).
* **FSDP1** (Lightning's ``FSDPStrategy``, the lab's GPU path): ``self.model`` is torch's
  ``FullyShardedDataParallel`` (``strategies/fsdp.py`` line 310), which has ``no_sync``
  (``torch/distributed/fsdp/fully_sharded_data_parallel.py`` line 1034: ``_sync_gradients = False`` on every unit),
  so the Trainer accumulates under it: ``_post_backward_hook`` returns before the reduce-scatter
  (``_runtime_utils.py`` line 743) and each rank keeps the whole model's gradients unsharded until the last
  micro-batch, whose backward reduce-scatters them once: **one reduce-scatter (Ψ) per optimizer step**. The
  gathers depend on the sharding and the wrapping:

  - FULL_SHARD wrapped per block (``fsdp``): each block is freed after its forward and gathered again for its
    backward, in every micro-batch (``_post_forward_reshard``, line 486; ``_should_free_in_backward``, line 811,
    frees FULL_SHARD units after backward even under ``no_sync``). The root unit (what no block holds: embedding,
    final norm, head; Ψ_root) is not resharded after forward (line 497: ``not state._is_root``), so its weights
    are gathered once per micro-batch: (2a + 1)Ψ − aΨ_root.
  - FULL_SHARD as one unit (``fsdp-course``: no auto-wrap policy, the root is everything): gathered once per
    micro-batch, kept through the backward, freed after it: (a + 1)Ψ, 2Ψ at the course's a = 1.
  - SHARD_GRAD_OP (``fsdp-grad-op``, either wrapping): not freed after forward (not in
    ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``, ``_flat_param.py`` line 112) and, under ``no_sync``, not freed
    after backward either (``_should_free_in_backward`` is ``_sync_gradients or FULL_SHARD``), so the next
    micro-batch's forward finds the weights whole (``FlatParamHandle.unshard``, ``_flat_param.py`` line 1371: no
    all-gather when already unsharded): one all-gather in the step's first forward, freed after its last
    backward: 2Ψ whatever ``a``, and every rank holds the whole weights from the first forward to the last backward.

* **FSDP2** (``fully_shard`` under Lightning's ``ModelParallelStrategy``: the lab's CPU ranks, simulated or over
  gloo): the strategy's ``self.model`` is the LightningModule, which has no ``no_sync``, so
  ``block_backward_sync`` does nothing; Lightning's Trainer never calls ``set_requires_gradient_sync`` (only
  Fabric's ``no_backward_sync`` does, ``lightning/fabric/strategies/model_parallel.py`` line 340). Every
  micro-batch therefore reduce-scatters (``_fsdp_param_group.py`` line 216: ``reduce_grads = True``) and reshards
  after backward (line 223: ``reshard_after_backward = True``): aΨ of reduce-scatters. Gathers per micro-batch:
  blocks with ``reshard_after_forward=True`` twice, the root (``reshard_after_forward=None``, which torch sets to
  False for the root: ``_fsdp_state.py`` line 205) once; with ``reshard_after_forward=False`` (grad-op) every
  unit once. So FULL_SHARD per block 3aΨ − aΨ_root; one unit 2aΨ; SHARD_GRAD_OP 2aΨ.

* **DeepSpeed ZeRO-2**: reduce-scatter of the gradients in every micro-batch's backward, then one all-gather of
  the updated weights after the optimizer step: (a + 1)Ψ (2Ψ at a = 1, as the ZeRO paper says). Source:
  DeepSpeed 0.19 ``runtime/engine.py`` ``allreduce_gradients``: "ZeRO stage >= 2 communicates during non
  gradient accumulation boundaries as well" (``zero_optimization_partition_gradients()`` ->
  ``overlapping_partition_gradients_reduce_epilogue`` on every backward; stage 1 communicates "only at gradient
  accumulation boundaries"); ``runtime/zero/stage_1_and_2.py`` ``step`` ends with ``all_gather_dp_groups`` of the
  updated bit16 partitions.
* **DeepSpeed ZeRO-3**: 3Ψ per micro-batch, 3aΨ (gradients reduce-scattered on every backward, same source;
  weights gathered in forward and backward). DeepSpeed may keep weights that are reused within
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

WRAPPINGS = ("block", "none")
"""FSDP units: ``block`` (each transformer block a unit, the rest the root unit: the lab's ``fsdp``) or ``none``
(no auto-wrap policy: the whole model is the root unit, the course's ``FSDPStrategy()``)."""

FSDP_IMPLS = ("fsdp1", "fsdp2")
"""``fsdp1``: Lightning's ``FSDPStrategy`` (accumulates under ``no_sync``); ``fsdp2``: ``fully_shard`` under
``ModelParallelStrategy`` (reduce-scatters every micro-batch)."""

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
    formula: str = ""  # the count in a and Ψ, e.g. "(2a + 1)Ψ − aΨ_root"; "" where gradients are not Ψ (LoRA)

    def describe(self) -> str:
        """One line for a person: the collectives and the total."""
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
    """The collectives of one optimizer step of ``strategy`` and the bytes each GPU sends for them.

    ``parameter_count`` x ``bytes_per_parameter`` is Ψ (the weights as they travel: 2 B in bf16, 4 B in fp32).
    ``micro_batches_per_step`` is the gradient accumulation on each GPU. ``trainable_parameter_count`` (default:
    all) sizes the gradient collectives: LoRA reduces only its adapters' gradients. FSDP only:

    * ``sharding``: ``full`` (the default) or ``grad-op``;
    * ``wrapping``: ``block`` (the default: each transformer block a unit) or ``none`` (one unit);
    * ``root_parameter_count``: with ``block``, the parameters no block holds (embedding, final norm, head): the
      root unit, which FSDP gathers once per micro-batch (not resharded after forward); default 0, which counts
      the root like a block, (2a + 1)Ψ for FSDP1;
    * ``fsdp_impl``: ``fsdp1`` (the default: Lightning's ``FSDPStrategy``, accumulating under ``no_sync``) or
      ``fsdp2`` (``fully_shard`` under ``ModelParallelStrategy``: reduce-scatters every micro-batch).

    ``wrapping``, ``root_parameter_count`` and ``fsdp_impl`` are ignored for other strategies (so a caller may pass
    a spec's FSDP fields whatever its strategy); ``sharding`` is refused there."""
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
    """FSDP's collectives per optimizer step and their formula (the module docstring says where each is read).

    FSDP1 under Lightning's Trainer accumulates under ``no_sync``: one reduce-scatter per step, and a SHARD_GRAD_OP
    unit stays gathered from the step's first forward to its last backward. FSDP2 there has no ``no_sync``: every
    micro-batch gathers, reduce-scatters and reshards after backward."""
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
    """The root unit's all-gather, for a reader: the one unit where nothing is wrapped."""
    unit = "the one unit's weights" if wrap == "none" else "root unit's weights"
    return f"{unit} (forward; kept for backward)"


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
