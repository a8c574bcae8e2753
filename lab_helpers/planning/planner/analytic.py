"""What tracing one device cannot see: sharding across ranks, DDP buckets, ZeRO and its CPU offload, paged optimizer
state, the CUDA context and communication libraries. Each strategy's function turns the tracer's one-device phase
breakdown into the per-GPU one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab_helpers.config.recipe_defaults import (
    DS_ALLGATHER_BUCKET_NUMEL,
    DS_PREFETCH_BUCKET_NUMEL,
    DS_REDUCE_BUCKET_NUMEL,
)
from lab_helpers.config.record_schema import GIB

from .accounting import Phase
from .spec import TrainingSpec
from .tracer import TraceResult

# CUDA context + kernels (lazy module loading, torch 2.x): about 0.5 GiB on Hopper, less on Ampere.
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
# cuBLAS / cuBLASLt workspaces come from the caching allocator (counted in max_memory_allocated).
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20
# NCCL communicators' own buffers (outside the caching allocator), per GPU.
NCCL_BUFFERS_BYTES = int(0.4 * GIB)
# Caching-allocator slack: reserved exceeds allocated by fragmentation (typ. 3-8 % in fine-tuning loops).
RESERVED_OVER_ALLOCATED = 1.05
# Host memory of one training process (Python, torch, CUDA libraries, data loader) outside offloaded state.
HOST_PROCESS_BYTES = int(2.5 * GIB)
# The checkpoint is memory-mapped while weights are copied to the GPU: its pages count in host RSS then.
CHECKPOINT_BYTES_PER_PARAM = 2  # litgpt checkpoints of the lab's models are stored in 16-bit


# ZeRO-3 optimizer offload keeps in host memory, per trainable parameter: the fp32 master weight (4 bytes), Adam's
# two fp32 moments (8) and the fp32 gradient partition DeepSpeedCPUAdam steps on (4).
OFFLOADED_BYTES_PER_TRAINABLE_PARAM = 16


def host_bytes(spec: TrainingSpec, trace: TraceResult, offloaded_bytes: int = 0) -> int:
    """Process baselines plus the larger of the mapped checkpoint (at load) and offloaded optimizer state."""
    return _host_bytes(trace.total_param_numel, spec.devices, offloaded_bytes)


def _host_bytes(total_numel: int, devices: int, offloaded_bytes: int) -> int:
    checkpoint = CHECKPOINT_BYTES_PER_PARAM * total_numel
    return HOST_PROCESS_BYTES * devices + max(checkpoint, offloaded_bytes)


def offload_host_bytes(total_numel: int, trainable_numel: int, devices: int) -> int:
    """Without a trace (seconds cheaper than a plan), so that the doctor and the pre-run gate decide with one number
    whether a node's RAM holds the offload run."""
    return _host_bytes(total_numel, devices, OFFLOADED_BYTES_PER_TRAINABLE_PARAM * trainable_numel)


# DeepSpeed's own stage3_max_live_parameters (not written into the lab's config); the buckets the config does
# write out are the run's settings, read from recipe_defaults.
DS_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass
class DeviceBreakdown:
    """Allocator-visible parts only."""

    parts: dict[str, int]
    phase: str
    outside_allocator_bytes: int = 0  # paged optimizer state, NCCL buffers: on the GPU, not in max_memory_allocated
    host_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def allocated_bytes(self) -> int:
        return sum(self.parts.values())


def _parts(phase: Phase, spec: TrainingSpec) -> dict[str, int]:
    c = phase.by_category
    return {
        "parameters": c["parameters"],
        "gradients": c["gradients"],
        "optimizer_states": c["optimizer_states"],
        "activations": c["activations"],
        # cuBLAS's workspaces exist only on a GPU; on a CPU the same step holds just its tensors
        "temporaries": c["temporaries"] + (CUBLAS_WORKSPACE_BYTES if spec.device == "cuda" else 0),
        "communication_buffers": 0,
    }


def _max(breakdowns: list[DeviceBreakdown]) -> DeviceBreakdown:
    return max(breakdowns, key=lambda b: b.allocated_bytes)


def single(spec: TrainingSpec, trace: TraceResult) -> DeviceBreakdown:
    best = _max([DeviceBreakdown(_parts(p, spec), p.name) for p in trace.phases])
    best.outside_allocator_bytes = trace.paged_optimizer_bytes
    if trace.paged_optimizer_bytes:
        best.notes.append(
            f"{trace.paged_optimizer_bytes / GIB:.2f} GiB of paged AdamW state is CUDA managed memory "
            "(on the GPU, not in max_memory_allocated)"
        )
    best.host_bytes = host_bytes(spec, trace)
    return best


def ddp(spec: TrainingSpec, trace: TraceResult) -> DeviceBreakdown:
    """DDP's reducer allocates flat gradient buckets for all trainable parameters at wrap time: a second copy of the
    gradients, or with ``gradient_as_bucket_view`` their storage. Under ``no_sync`` freed gradients would be made anew
    beside the buckets; the lab's module zeroes them in place (``optimizer_zero_grad``), so with bucket views it holds
    one copy. The course's settings hold two."""
    grad_bytes = _trainable_grad_bytes(spec, trace)
    out = []
    for p in trace.phases:
        parts = _parts(p, spec)
        if spec.ddp_gradient_as_bucket_view:
            parts["gradients"] = max(parts["gradients"], grad_bytes)
        else:
            parts["communication_buffers"] = grad_bytes
        out.append(DeviceBreakdown(parts, p.name))
    best = _max(out)
    best.outside_allocator_bytes = NCCL_BUFFERS_BYTES
    best.host_bytes = host_bytes(spec, trace)
    return best


def _trainable_grad_bytes(spec: TrainingSpec, trace: TraceResult) -> int:
    return trace.trainable_param_bytes


def fsdp(spec: TrainingSpec, trace: TraceResult) -> DeviceBreakdown:
    """FULL_SHARD: each rank holds 1/N and gathers the unit it computes (the next one prefetched) plus the root unit,
    kept whole between forward and backward. SHARD_GRAD_OP keeps a unit whole from its forward to its backward (under
    FSDP1's no_sync, to the step's last), so every rank holds the whole weights while the step runs."""
    n = spec.devices
    block, root, full = trace.block_param_bytes, trace.root_param_bytes, trace.param_bytes
    if spec.precision.endswith("-mixed"):  # fp32 shards, bf16 gathered copies
        block, root, full = block // 2, root // 2, full // 2
    # blocks whole at once: in backward the one computing and the next, prefetched explicitly; in forward on a GPU
    # the same (the host runs ahead and issues the next all-gather while the current block computes), on a CPU
    # one (nothing runs ahead of the host: each all-gather ends before the block runs; measured on simulated ranks)
    ahead_fwd = 2 if spec.device == "cuda" else 1
    per_block = spec.fsdp_wrap_blocks and spec.fsdp_reshard_after_forward
    gathered = {kind: (root + blocks * block) if per_block else full
                for kind, blocks in (("fwd", ahead_fwd), ("val", ahead_fwd), ("bwd", 2))}
    grad_unit = trace.block_param_bytes if spec.fsdp_wrap_blocks else trace.trainable_param_bytes
    if spec.method != "full":
        grad_unit = 0 if spec.fsdp_wrap_blocks else trace.trainable_param_bytes
    unsharded_accumulation = spec.fsdp_unsharded_grad_accumulation and spec.gradient_accumulation_iters > 1
    out = []
    for p in trace.phases:
        parts = _parts(p, spec)
        parts["parameters"] = p.by_category["parameters"] // n
        grads = p.by_category["gradients"]
        parts["gradients"] = grads if (unsharded_accumulation and p.kind in ("fwd", "bwd")) else grads // n
        parts["optimizer_states"] = p.by_category["optimizer_states"] // n
        parts["temporaries"] -= p.step_temporaries - p.step_temporaries // n
        if p.kind in ("fwd", "bwd", "val"):
            parts["communication_buffers"] = gathered[p.kind] + (grad_unit if p.kind == "bwd" else 0)
        out.append(DeviceBreakdown(parts, p.name))
    best = _max(out)
    best.outside_allocator_bytes = NCCL_BUFFERS_BYTES
    best.host_bytes = host_bytes(spec, trace)
    if unsharded_accumulation:
        best.notes.append("gradient accumulation under FSDP1's no_sync keeps unsharded gradients on every rank")
    if spec.fsdp_impl:
        best.notes.append(
            f"{spec.fsdp_impl}: FSDP1's flat parameters and FSDP2's per-parameter shards are modelled alike "
            "(the same units gathered, the same shards kept); they differ in accumulation: Lightning's Trainer "
            "runs FSDP1's no_sync (unsharded gradients), FSDP2 reduce-scatters every micro-batch"
        )
    return best


def deepspeed_zero3(spec: TrainingSpec, trace: TraceResult) -> DeviceBreakdown:
    """bf16 parameter and gradient partitions on each GPU; fp32 master weights and Adam moments (12 B per trainable
    parameter) there or, offloaded, in host memory with fp32 gradient partitions (4 B more). Gathered parameters are
    bounded by max-live-parameters and prefetch; reduce buckets hold gradients in flight."""
    n = spec.devices
    numel = trace.total_param_numel
    trainable = trace.trainable_param_numel
    bytes_per = 4 if spec.precision == "32-true" else 2
    # the module being computed plus the prefetch bucket, capped by max-live-parameters; the root modules
    # (embedding, head) are gathered while they run
    live_numel = min(numel, DS_MAX_LIVE_PARAMETERS, trace.block_param_numel + DS_PREFETCH_BUCKET_NUMEL)
    gathered = live_numel * bytes_per + trace.root_param_bytes
    # contiguous_gradients: one reduce ("IPG") bucket of reduce_bucket_size elements per gradient dtype, allocated
    # when the optimizer is built and kept for the whole run, whatever the model's size (DeepSpeed 0.19 stage3.py)
    bucket = DS_REDUCE_BUCKET_NUMEL * bytes_per
    master_and_moments = (OFFLOADED_BYTES_PER_TRAINABLE_PARAM - 4) * trainable // n
    fp32_grads = 4 * trainable // n
    on_device = _offloaded_on_device(spec, trainable)
    out = []
    for p in trace.phases:
        parts = _parts(p, spec)
        parts["parameters"] = p.by_category["parameters"] // n
        # contiguous_gradients: a persistent partition buffer on the GPU, unless offloaded to the host
        parts["gradients"] = on_device["gradients"] if spec.offload_optimizer else bytes_per * trainable // n
        parts["optimizer_states"] = on_device["optimizer_states"] if spec.offload_optimizer else master_and_moments
        if p.kind == "step" and not spec.offload_optimizer:
            parts["temporaries"] += fp32_grads  # fp32 copy of the gradient partition for the update
        parts["temporaries"] -= p.step_temporaries
        parts["communication_buffers"] = bucket + (gathered if p.kind in ("fwd", "bwd", "val") else 0)
        out.append(DeviceBreakdown(parts, p.name))
    return _deepspeed_worst(out, spec, trace)


def _offloaded_on_device(spec: TrainingSpec, trainable_numel: int) -> dict[str, int]:
    """Nothing on a GPU (it is in host RAM); on a CPU, where the host is the device, all of it: 16 B per trainable
    parameter, 1/N per rank."""
    if spec.device == "cuda" or not spec.offload_optimizer:
        return {"gradients": 0, "optimizer_states": 0}
    n = spec.devices
    states = OFFLOADED_BYTES_PER_TRAINABLE_PARAM - 4
    return {"gradients": 4 * trainable_numel // n, "optimizer_states": states * trainable_numel // n}


def _deepspeed_worst(
    out: list[DeviceBreakdown], spec: TrainingSpec, trace: TraceResult, note: str = ""
) -> DeviceBreakdown:
    best = _max(out)
    best.outside_allocator_bytes = NCCL_BUFFERS_BYTES
    offloaded = OFFLOADED_BYTES_PER_TRAINABLE_PARAM * trace.trainable_param_numel if spec.offload_optimizer else 0
    best.host_bytes = host_bytes(spec, trace, offloaded)
    if spec.offload_optimizer:
        best.notes.append(
            f"optimizer offload: {offloaded / GIB:.1f} GiB of fp32 master weights, Adam moments and gradients "
            f"in host memory across {spec.devices} ranks{note}"
        )
    return best


def deepspeed_zero2(spec: TrainingSpec, trace: TraceResult) -> DeviceBreakdown:
    """Every GPU keeps the whole weights (nothing gathered); gradients leave through reduce buckets into 1/N partitions
    and the fp32 master weights and moments are partitioned. Offloaded (the 8B blog run), those 16 B/param live in host
    memory and the updated weights come back through an all-gather bucket."""
    n = spec.devices
    trainable = trace.trainable_param_numel
    bytes_per = 4 if spec.precision == "32-true" else 2
    # stage 2 allocates its reduce buckets at the configured size whatever the model's (setup_buckets), two
    # with overlap_comm
    buckets = 2 * DS_REDUCE_BUCKET_NUMEL * bytes_per
    allgather = min(DS_ALLGATHER_BUCKET_NUMEL, trace.total_param_numel) * bytes_per
    master_and_moments = (OFFLOADED_BYTES_PER_TRAINABLE_PARAM - 4) * trainable // n
    on_device = _offloaded_on_device(spec, trainable)
    out = []
    for p in trace.phases:
        parts = _parts(p, spec)
        # a gradient is copied into the bucket as soon as it is computed and freed: only the partition stays
        parts["gradients"] = on_device["gradients"] if spec.offload_optimizer else bytes_per * trainable // n
        parts["optimizer_states"] = on_device["optimizer_states"] if spec.offload_optimizer else master_and_moments
        parts["temporaries"] -= p.step_temporaries
        if p.kind == "step":
            parts["temporaries"] += allgather if spec.offload_optimizer else allgather + 4 * trainable // n
        if p.kind == "bwd":
            parts["communication_buffers"] = buckets
        out.append(DeviceBreakdown(parts, p.name))
    return _deepspeed_worst(out, spec, trace, "; every GPU keeps all the weights (ZeRO-2 shards no parameters)")


STRATEGY_MODELS = {
    "single": single,
    "ddp": ddp,
    "fsdp": fsdp,
    "deepspeed-zero2": deepspeed_zero2,
    "deepspeed-zero3": deepspeed_zero3,
}


def gpu_used_bytes(breakdown: DeviceBreakdown, device: str = "cuda") -> int:
    """What NVML would show: reserved memory, the CUDA context and allocations outside PyTorch's; on a CPU the live
    tensors alone."""
    if device != "cuda":
        return breakdown.allocated_bytes
    return (
        int(breakdown.allocated_bytes * RESERVED_OVER_ALLOCATED)
        + CUDA_CONTEXT_BYTES
        + breakdown.outside_allocator_bytes
    )
