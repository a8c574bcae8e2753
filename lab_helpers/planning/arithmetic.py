"""The memory arithmetic the notebooks teach: bytes per parameter and model-state GiB, computed from the
experiment's recipe and the real model's parameter count, never typed, so the notebooks' several mentions of a
figure cannot disagree. Model states live the whole run: weights, gradients, optimizer states. Mixed precision's
half-precision weight copies are transient (the planner counts them with the activations), so they are shown
beside the model states, not in them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.record_schema import GIB
from lab_helpers.planning.planner.analytic import OFFLOADED_BYTES_PER_TRAINABLE_PARAM
from lab_helpers.planning.planner.communication import (
    CommunicationVolume,
    HostDeviceTraffic,
    communication_per_optimizer_step,
    host_device_bytes_per_optimizer_step,
)
from lab_helpers.planning.planner.spec import precision_bytes

GB = 1e9

# DeepSpeed ZeRO with the optimizer offloaded keeps fp32 master weights (4), both Adam moments (8) and the fp32
# gradient partitions (4) in host RAM: 16 bytes per trainable parameter -- the planner's own constant, imported.
OFFLOAD_HOST_BYTES_PER_PARAM = OFFLOADED_BYTES_PER_TRAINABLE_PARAM


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes one parameter costs for the whole run, by part; ``transient`` is held only while a step runs."""

    weights: float
    gradients: float
    optimizer_states: float
    transient: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    def formula(self) -> str:
        """``4 + 4 + 8 = 16 B/param`` (weights + gradients + optimizer states)."""
        return f"{self.weights:g} + {self.gradients:g} + {self.optimizer_states:g} = {self.total:g} B/param"

    def fsdp_accumulating(self, world: int) -> float:
        """Per GPU while Lightning accumulates under FSDP1's ``no_sync``: the gradients whole, the rest sharded."""
        return self.gradients + (self.weights + self.optimizer_states) / world

    def fsdp_accumulating_formula(self, world: int | str = "N") -> str:
        """``2 + 6/N`` in bf16-true: :meth:`fsdp_accumulating` as the text shows it."""
        return f"{self.gradients:g} + {self.weights + self.optimizer_states:g}/{world}"


EIGHT_BIT_OPTIMIZERS = ("adamw8bit", "pagedadamw8bit")  # bitsandbytes.optim.AdamW8bit / PagedAdamW8bit


def optimizer_state_count(optimizer: str, optimizer_args: Mapping[str, Any] | None = None) -> int:
    name = optimizer.rsplit(".", 1)[-1].lower()
    if name in ("adamw", "adam", "pagedadamw", "deepspeedcpuadam", *EIGHT_BIT_OPTIMIZERS):
        return 2
    if name == "sgd":
        return 1 if (optimizer_args or {}).get("momentum") else 0
    raise ValueError(f"optimizer {optimizer!r}: the lab's arithmetic knows AdamW, Adam and SGD")


def trainable_bytes(
    precision: str, optimizer: str = "AdamW", optimizer_args: Mapping[str, Any] | None = None, *, paged: bool = False
) -> BytesPerParam:
    """Optimizer states take the weights' dtype (torch's AdamW does), except bitsandbytes' paged AdamW (litgpt's QLoRA
    optimizer: 32-bit states) and 8-bit AdamW (1 byte a moment plus an fp32 absmax per block of 256 values)."""
    weight = precision_bytes(precision)
    state = 4 if paged else weight
    if optimizer.rsplit(".", 1)[-1].lower() in EIGHT_BIT_OPTIMIZERS:
        from lab_helpers.planning.planner.optim8bit import bytes_per_param

        state = bytes_per_param() / 2  # per moment: 1 B + 4 B / 256
    transient = 2 if str(precision).endswith("-mixed") else 0  # autocast's half-precision weight copies
    return BytesPerParam(weight, weight, optimizer_state_count(optimizer, optimizer_args) * state, transient)


def frozen_bytes(precision: str) -> BytesPerParam:
    return BytesPerParam(precision_bytes(precision), 0, 0)


def nf4_bytes_per_param(numel: int, double_quant: bool) -> float:
    """bitsandbytes NF4 storage per weight: 0.5 B of packed values plus the absmax statistics per 64 weights."""
    from lab_helpers.planning.planner.fake_modules import nf4_storage_bytes

    return sum(nf4_storage_bytes(numel, double_quant).values()) / numel


# ----------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ParamCounts:
    name: str
    total: int
    trainable: int
    linear_weights: int  # plain nn.Linear weights: what bitsandbytes quantizes for QLoRA (lm_head included)
    outside_blocks: int = 0  # what no transformer block holds (embedding, final norm, head): FSDP's root unit


@functools.lru_cache(maxsize=16)
def count_params(checkpoint_dir: str, lora_items: tuple[tuple[str, Any], ...] = ()) -> ParamCounts:
    """Built on the meta device: no memory, no weights needed. ``checkpoint_dir``'s ``model_config.yaml`` where it is
    downloaded, else litgpt's config of that name."""
    import torch
    from torch import nn

    from lab_helpers.planning.planner.spec import resolve_model_config

    lora = dict(lora_items)
    config = resolve_model_config(checkpoint_dir, lora or None)
    with torch.device("meta"):
        if lora:
            from litgpt.lora import GPT, mark_only_lora_as_trainable

            model = GPT(config)
            mark_only_lora_as_trainable(model)
        else:
            from litgpt.model import GPT

            model = GPT(config)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    linear = sum(m.weight.numel() for m in model.modules() if type(m) is nn.Linear)
    in_blocks = sum(p.numel() for p in model.transformer.h.parameters())
    return ParamCounts(str(config.name), total, trainable, linear, total - in_blocks)


@dataclass(frozen=True)
class ModelStates:
    exp_id: str
    model: str
    precision: str
    optimizer: str
    method: str
    counts: ParamCounts
    trained: BytesPerParam
    frozen_per_param: float  # bytes per frozen parameter (0 for full fine-tuning)

    @property
    def frozen_params(self) -> int:
        return self.counts.total - self.counts.trainable

    @property
    def bytes(self) -> float:
        return self.counts.trainable * self.trained.total + self.frozen_params * self.frozen_per_param

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    @property
    def transient_gib(self) -> float:
        """Autocast's half-precision copies of every weight a matmul uses: LoRA's frozen base as well."""
        return self.counts.total * self.trained.transient / GIB

    def markdown(self) -> str:
        c = self.counts
        head = f"**{self.exp_id}** ({self.model}, {self.precision}, {self.optimizer}): "
        trained = (
            f"{c.trainable / 1e9:.2f}e9 parameters × ({self.trained.formula()}: weights + gradients + "
            f"{self.optimizer} states)"
        )
        if self.method == "full":
            body = f"{trained} = **{self.gib:.1f} GiB** ({self.bytes / GB:.1f} GB) of model states"
        else:
            share = 100 * c.trainable / c.total
            body = (
                f"frozen {self.frozen_params / 1e9:.2f}e9 × {self.frozen_per_param:.2f} B = "
                f"{self.frozen_params * self.frozen_per_param / GIB:.2f} GiB; trained (adapters) "
                f"{c.trainable / 1e6:.1f} M ({share:.1f} % of {c.total / 1e9:.2f}e9) × {self.trained.total:g} B = "
                f"{c.trainable * self.trained.total / GIB:.2f} GiB; **{self.gib:.2f} GiB** of model states in all"
            )
        if self.trained.transient:
            body += (
                f", plus {self.trained.transient:g} B/param of half-precision weight copies that autocast makes "
                f"while forward and backward run (+{self.transient_gib:.1f} GiB, transient)"
            )
        paged = ""
        if self.optimizer.startswith("PagedAdamW"):
            paged = (
                " The adapters' 32-bit AdamW states are allocated by bitsandbytes itself, as CUDA managed (paged) "
                "memory, for every state tensor of 100,000 elements or more: outside PyTorch's allocator, so "
                "`max_memory_allocated` never sees them and the planner leaves them out of its breakdown (its "
                "notes give their GiB); NVML's used memory counts them while they are on the GPU."
            )
        return head + body + " — before a single activation." + paged


def model_states(exp_id: str, *, profile: str = "gpu", overrides: Mapping[str, Any] | None = None) -> ModelStates:
    from lab_helpers.config.experiments import resolve, resolve_path

    run = resolve(exp_id, profile, overrides, check_files=False)
    recipe = run.recipe
    lora = tuple(sorted((k, v) for k, v in recipe.items() if k.startswith("lora_")))
    counts = count_params(str(resolve_path(recipe["checkpoint_dir"])), lora)
    precision = str(recipe.get("precision") or "bf16-mixed")
    optimizer, optimizer_args = _optimizer(recipe.get("optimizer"))
    quantize = recipe.get("quantize")
    if run.experiment.options.get("offload_optimizer"):
        optimizer = "DeepSpeedCPUAdam"
    trained = trainable_bytes(precision, optimizer, optimizer_args, paged=bool(quantize))
    frozen = 0.0
    if run.experiment.method != "full":
        frozen = frozen_bytes(precision).weights
        if quantize:  # nn.Linear weights in NF4, the rest (embeddings, norms) in the training precision
            others = counts.total - counts.trainable - counts.linear_weights
            nf4 = nf4_bytes_per_param(counts.linear_weights, "-dq" in str(quantize))
            frozen = (counts.linear_weights * nf4 + others * frozen) / (counts.total - counts.trainable)
            optimizer = "PagedAdamW (32-bit states)"
    return ModelStates(
        exp_id=exp_id,
        model=counts.name,
        precision=precision,
        optimizer=optimizer,
        method=run.experiment.method,
        counts=counts,
        trained=trained,
        frozen_per_param=frozen,
    )


def fsdp_bytes_per_param(exp_id: str = "fsdp", *, profile: str = "gpu") -> dict[str, str]:
    """Per-GPU model states as formulas in N: ``sharded`` between optimizer steps (``8/N`` in bf16-true);
    ``accumulating`` under FSDP1's ``no_sync``, the gradients whole on every GPU (``2 + 6/N``)."""
    bytes_per = model_states(exp_id, profile=profile).trained
    return {"sharded": f"{bytes_per.total:g}/N", "accumulating": bytes_per.fsdp_accumulating_formula()}


def _optimizer(value: Any) -> tuple[str, dict[str, Any]]:
    if value is None:
        return "AdamW", {}
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1], {}
    return str(value.get("class_path", "AdamW")).rsplit(".", 1)[-1], dict(value.get("init_args") or {})


# ----------------------------------------------------------------------------------------------- communication


@dataclass(frozen=True)
class Communication:
    """Ψ is the weights in the training precision, a the micro-batches per optimizer step; the counts are
    ``planner.communication``'s, whose docstring says where in torch and Lightning each was read."""

    exp_id: str
    volume: CommunicationVolume
    host_device: HostDeviceTraffic | None  # the offload's GPU<->host bytes per step, None without offload
    strategy_words: str = ""  # "FSDP1 FULL_SHARD, wrapped per block, Lightning's FSDPStrategy", ...
    root_bytes: int = 0  # FSDP per block: the root unit's weights (Ψ_root); 0 elsewhere

    @property
    def psi_multiple(self) -> float:
        return self.volume.psi_multiple

    @property
    def psi_gib(self) -> float:
        return self.volume.psi_bytes / GIB

    @property
    def root_share(self) -> float:
        return self.root_bytes / self.volume.psi_bytes if self.volume.psi_bytes else 0.0

    @property
    def ranks(self) -> int:
        return self.volume.world_size

    @property
    def micro_batches(self) -> int:
        return self.volume.micro_batches_per_step

    @property
    def per_gpu_gib(self) -> float:
        """Ring collectives: a lower bound."""
        return self.volume.link_bytes_per_gpu / GIB

    def formula_words(self) -> str:
        """``(2a + 1)Ψ − aΨ_root at a = 2``: the count's formula where it depends on a ("" where it does not)."""
        formula = self.volume.formula
        if "a" not in formula.replace("Ψ_root", ""):
            return ""
        return f"{formula} at a = {self.micro_batches}"

    def total_words(self) -> str:
        """``(2a + 1)Ψ − aΨ_root at a = 2 = 4.92Ψ``: the formula (where it depends on a) and the value."""
        value = f"{self.psi_multiple:.3g}Ψ"
        return f"{self.formula_words()} = {value}" if self.formula_words() else value

    def markdown(self) -> str:
        n, m = self.ranks, self.micro_batches
        parts = " + ".join(f"{c.name} of {c.purpose} × {c.times_per_step}" for c in self.volume.collectives)
        strategy = self.strategy_words or self.volume.strategy
        root = ""
        if self.root_bytes:
            root = (
                f", Ψ_root = {self.root_bytes / GIB:.2f} GiB ({100 * self.root_share:.1f} % of Ψ: the embedding, "
                "final norm and head, the root unit, which FSDP does not reshard after forward)"
            )
        text = (
            f"**{self.exp_id}** ({strategy}), {m} micro-batch{'es' if m > 1 else ''} per optimizer step "
            f"on each of {n} GPUs: {parts} = {self.formula_words() + ' = ' if self.formula_words() else ''}"
            f"**{self.psi_multiple:.3g}Ψ per optimizer step**, Ψ = {self.psi_gib:.1f} GiB (the weights in the "
            f"training precision){root}; with ring collectives each GPU sends at least "
            f"**{self.per_gpu_gib:.1f} GiB** per step over its GPU-to-GPU link (a lower bound)"
        )
        if self.host_device is not None:
            text += (
                f"; the optimizer offload also copies {self.host_device.device_to_host_bytes / GIB:.1f} GiB of "
                f"gradients GPU→host and {self.host_device.host_to_device_bytes / GIB:.1f} GiB of updated weights "
                "host→GPU per GPU and step, over PCIe (a lower bound too)"
            )
        return text


def _strategy_words(strategy: str, options: Mapping[str, Any], fsdp_impl: str | None) -> str:
    if strategy == "ddp":
        return "DDP"
    if strategy != "fsdp":
        return {"deepspeed-zero2": "DeepSpeed ZeRO-2", "deepspeed-zero3": "DeepSpeed ZeRO-3"}.get(strategy, strategy)
    sharding = "FULL_SHARD" if options["sharding"] != "grad-op" else "SHARD_GRAD_OP"
    units = "wrapped per block" if options["wrap"] == "block" else "one unit"
    where = "Lightning's FSDPStrategy" if fsdp_impl == "fsdp1" else "fully_shard under ModelParallelStrategy"
    return f"{fsdp_impl.upper()} {sharding}, {units}, {where}"


def communication(
    exp_id: str,
    *,
    profile: str = "gpu",
    ranks: int = 4,
    micro_batches: int | None = None,
    fsdp_impl: str | None = None,
) -> Communication:
    """On ``ranks`` GPUs (LAB.md's reference: 4) at the recipe's accumulation there unless ``micro_batches`` is given;
    ``fsdp_impl`` defaults to what the profile runs: FSDP1 on ``gpu``, FSDP2 on ``ci``."""
    from lab_helpers.config.experiments import gradient_accumulation_steps, resolve, resolve_path
    from lab_helpers.config.recipe_defaults import resolve_fsdp_impl

    run = resolve(exp_id, profile, check_files=False)
    strategy = run.experiment.strategy
    if strategy == "single" or not run.experiment.distributed:
        raise ValueError(f"{exp_id} runs {strategy!r}: no communication between GPUs to count")
    counts = count_params(str(resolve_path(run.recipe["checkpoint_dir"])))
    bytes_per = precision_bytes(str(run.recipe.get("precision") or "bf16-true"))
    if micro_batches is None:
        micro_batches = gradient_accumulation_steps(run.recipe, world_size=ranks)
    fsdp = strategy == "fsdp"
    impl = (fsdp_impl or resolve_fsdp_impl(run.options["fsdp_impl"], on_cuda=profile != "ci")) if fsdp else None
    per_block = fsdp and run.options["wrap"] == "block"
    volume = communication_per_optimizer_step(
        strategy=strategy,
        parameter_count=counts.total,
        bytes_per_parameter=bytes_per,
        world_size=ranks,
        micro_batches_per_step=micro_batches,
        sharding=run.options["sharding"] if fsdp else None,
        trainable_parameter_count=counts.trainable,
        wrapping=run.options["wrap"] if fsdp else None,
        root_parameter_count=counts.outside_blocks if per_block else 0,
        fsdp_impl=impl,
    )
    host_device = None
    if run.options["offload_optimizer"]:
        host_device = host_device_bytes_per_optimizer_step(
            trainable_parameter_count=counts.trainable,
            bytes_per_parameter=bytes_per,
            world_size=ranks,
            micro_batches_per_step=micro_batches,
        )
    root = counts.outside_blocks * bytes_per if per_block and run.options["sharding"] != "grad-op" else 0
    return Communication(exp_id, volume, host_device, _strategy_words(strategy, run.options, impl), root)


def show_communication(*exp_ids: str, profile: str = "gpu", ranks: int = 4) -> None:
    _display("\n\n".join(communication(e, profile=profile, ranks=ranks).markdown() for e in exp_ids))


def offload_host_gib(exp_id: str, *, profile: str = "gpu") -> float:
    return model_states(exp_id, profile=profile).counts.trainable * OFFLOAD_HOST_BYTES_PER_PARAM / GIB


def show(exp_id: str, *, profile: str = "gpu", overrides: Mapping[str, Any] | None = None) -> None:
    """``overrides`` are the node's (``node_plan.decide``): on a V100 the bf16 experiments run in 16-mixed, whose
    frozen LoRA base is fp32."""
    _display(model_states(exp_id, profile=profile, overrides=overrides).markdown())


def _display(text: str) -> None:
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        print(text)


REFERENCE_GPU_NAMES = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
"""GPUs whose peaks are quoted when this node has none (or one the lab's peak table does not know)."""


def bf16_over_fp32_text(node: Mapping[str, Any] | None = None) -> str:
    """fp32 matmuls run on TF32 tensor cores (litgpt sets ``float32_matmul_precision("high")``), so the ratio is about
    2x, not plain fp32's 10x+. The reference GPUs stand in where this node has none."""
    from lab_helpers.hardware.gpu_peaks import find_gpu

    names = [g.get("name") for g in (node or {}).get("gpus") or []][:1]
    here = [peak for peak in (find_gpu(n) for n in names) if peak]
    if here and not here[0].bf16 and here[0].fp16 and here[0].fp32_matmul:  # a V100: no bf16, the fp16 route
        p = here[0]
        return (
            f"{p.model}: no bf16 (the bf16 experiments run in 16-mixed here): fp16 {p.fp16:g} vs FP32 "
            f"{p.fp32_matmul:g} dense TFLOP/s (no TF32 before Ampere) = {p.fp16 / p.fp32_matmul:.1f}x"
        )
    rows = [peak for peak in here if peak.bf16 and peak.fp32_matmul]
    if not rows:
        rows = [peak for peak in (find_gpu(n) for n in REFERENCE_GPU_NAMES) if peak]
    return "; ".join(
        f"{p.model}: bf16 {p.bf16:g} vs TF32 {p.fp32_matmul:g} dense TFLOP/s = {p.bf16 / p.fp32_matmul:.1f}x"
        for p in rows
    )


def activation_ratio(plan: Any, other: Any, *, names: tuple[str, str] = ("this run", "the other")) -> str:
    """Whether activations scale exactly with the batch is read here, never typed."""
    mine, theirs = (p.breakdown_gib.get("activations") or 0.0 for p in (plan, other))
    if not theirs or not other.micro_batch_size:
        return f"no predicted activations for {names[1]}: no ratio"
    return (
        f"activations {names[0]} {mine:.4g} GiB (micro batch {plan.micro_batch_size}) / {names[1]} {theirs:.4g} GiB "
        f"(micro batch {other.micro_batch_size}) = {mine / theirs:.3f}; "
        f"micro batches {plan.micro_batch_size / other.micro_batch_size:.3f}"
    )


# ------------------------------------------------------------------------------ activation checkpointing's peak

STEP_SETTINGS: dict[str, dict[str, bool]] = {
    "foreach": {"optimizer.foreach": True},
    "for-loop": {"optimizer.foreach": False},
    "fused": {"optimizer.fused": True},
}
"""Spelled as ``--set`` spells them."""

_STEP_WHAT = {
    "foreach": "updates every parameter in one op, so each intermediate is the size of all parameters at once",
    "for-loop": "updates one parameter at a time, so its intermediates are the size of one parameter",
    "fused": "updates every parameter in place in one kernel, with no intermediates",
}


def step_lever(plan: Any) -> dict[str, bool]:
    """The other optimizer step: the for-loop where it is foreach (a GPU's default) or fused, foreach where it is the
    for-loop, so a CPU shows what a GPU's default costs; {} for a step that is not torch's."""
    step = getattr(plan, "optimizer_step", None)
    if step is None:
        return {}
    return dict(STEP_SETTINGS["foreach" if step == "for-loop" else "for-loop"])


def setting_words(step: str) -> str:
    return ", ".join(f"{key}={str(value).lower()}" for key, value in STEP_SETTINGS[step].items())


def phase_words(phase: str | None) -> str:
    if not phase:
        return "an unknown phase"
    for suffix, words in (("-step", "the optimizer step"), ("-backward", "backward"), ("-forward", "forward")):
        if phase.endswith(suffix):
            return words
    return "the optimizer step" if phase == "optimizer step" else phase


def _off(measured: float, predicted: float) -> str:
    pct = 100 * (measured / predicted - 1)
    return "within 0.01%" if abs(pct) < 0.005 else f"{pct:+.2f}%"


def _gib(value: float) -> str:
    return f"{value:.1f} GiB" if abs(value) >= 10 else f"{value:.3g} GiB"


def checkpointing_words(checkpointed: Any, plain: Any, *, names: tuple[str, str] = ("act-ckpt", "full-7b")) -> str:
    """What activation checkpointing bought, computed from two plans: the activations, the peak and its phase, and
    the step's temporaries where the peak is inside the optimizer step."""
    ckpt, pair = names
    act_with, act_without = (p.breakdown_gib.get("activations") or 0.0 for p in (checkpointed, plain))
    lines = []
    if act_without:
        lines.append(
            f"Activations (predicted): {pair} {_gib(act_without)}, {ckpt} {_gib(act_with)}: checkpointing keeps "
            f"{100 * act_with / act_without:.2g}% of them."
        )
    drop = plain.peak_alloc_gib - checkpointed.peak_alloc_gib
    before, after = phase_words(plain.peak_phase), phase_words(checkpointed.peak_phase)
    lines.append(
        f"Peak (predicted): {pair} {_gib(plain.peak_alloc_gib)} in {before}, {ckpt} "
        f"{_gib(checkpointed.peak_alloc_gib)} in {after}: {_gib(drop)} lower, of the "
        f"{_gib(act_without - act_with)} the activations fell."
        + (f" The peak moved from {before} to {after}." if before != after else "")
    )
    step = checkpointed.optimizer_step
    if step is not None and after == "the optimizer step":
        temporaries = checkpointed.breakdown_gib.get("temporaries") or 0.0
        params = checkpointed.breakdown_gib.get("parameters") or 0.0
        lines.append(
            f"At that peak the {step} step ({setting_words(step)}) holds {_gib(temporaries)} of temporaries, "
            f"{temporaries / params:.2f}x the parameters' {_gib(params)}: it {_STEP_WHAT[step]}."
            if params
            else f"At that peak the {step} step holds {_gib(temporaries)} of temporaries."
        )
    return "\n".join(lines)


def step_lever_words(checkpointed: Any, other_step: Any, *, records: Any = None, name: str = "act-ckpt") -> str:
    """``other_step`` is ``checkpointed`` with ``step_lever``; ``records`` add both as measured where they hold an ok
    run of exactly that prediction."""
    step, other = checkpointed.optimizer_step, other_step.optimizer_step
    if step is None or other is None or step == other:
        return f"{name}: no other optimizer step to compare (the step is {step or 'not a torch optimizer'}'s)"
    change = other_step.peak_alloc_gib - checkpointed.peak_alloc_gib
    lines = [
        f"The {other} step ({setting_words(other)}) {_STEP_WHAT[other]}: the planner predicts "
        f"{_gib(other_step.peak_alloc_gib)} in {phase_words(other_step.peak_phase)}, {change:+.3g} GiB against "
        f"the {step} step's {_gib(checkpointed.peak_alloc_gib)} in {phase_words(checkpointed.peak_phase)}."
    ]
    plans = (checkpointed, other_step)
    measured = [_measured(name, p, records) for p in plans]
    if any(measured):
        lines.append(
            "Measured: "
            + "; ".join(
                f"{p.optimizer_step} step {_gib(m[0])} in {phase_words(m[1])} (predicted {_gib(p.peak_alloc_gib)}, "
                f"{_off(m[0], p.peak_alloc_gib)})"
                if m
                else f"{p.optimizer_step} step not run yet"
                for p, m in zip(plans, measured, strict=True)
            )
            + "."
        )
    return "\n".join(lines)


def _measured(exp_id: str, plan: Any, records: Any) -> tuple[float, str | None] | None:
    """The latest ok rank-0 run predicted as ``plan`` (same peak, same step): ``peak_alloc_gib`` on a GPU,
    ``peak_tensor_gib`` on a CPU."""
    from lab_helpers.planning.planner.spec import step_implementation

    if records is None:
        return None
    rows = records.to_dict("records") if hasattr(records, "to_dict") else list(records)
    found = None
    for row in rows:
        predicted = _finite(row.get("predicted_peak_alloc_gib"))
        if row.get("experiment") != exp_id or row.get("status") != "ok" or predicted is None:
            continue
        if _finite(row.get("rank")) not in (None, 0) or abs(predicted - plan.peak_alloc_gib) > 1e-6 * max(predicted, 1):
            continue
        config = row.get("config") if isinstance(row.get("config"), Mapping) else {}
        optimizer = config.get("optimizer") if isinstance(config.get("optimizer"), Mapping) else {}
        args = optimizer.get("init_args") if isinstance(optimizer.get("init_args"), Mapping) else {}
        device = "cpu" if str(row.get("device_name") or "cpu").startswith("cpu") else "cuda"
        if step_implementation(args.get("foreach"), args.get("fused"), device) != plan.optimizer_step:
            continue
        peak = _finite(row.get("peak_alloc_gib"))
        peak = peak if peak is not None else _finite(row.get("peak_tensor_gib"))
        if peak is not None:
            phase = row.get("peak_phase")
            found = (peak, phase if isinstance(phase, str) else None)
    return found


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and number not in (float("inf"), float("-inf")) else None
