"""What fits on this GPU: the largest micro batch, the longest sequence and, where nothing fits, the cheapest change
that does. A search, not a formula: the peak moves between phases and the allocator rounds, so only the planner
says what fits; memory is monotonic and close to affine in batch and sequence, so a secant search asks 2-5
predictions. "Fits": ``MemoryPlan.worst_gpu_used_gib`` (a run that dies loading is an OOM too) stays under the
GPU's memory less ``margin`` (5 %: the planner's error on litgpt's published LoRA and full rows is under 3 %).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import PlanError, PlannerUnavailable
from .plan import MemoryPlan, predict
from .spec import TrainingSpec

DEFAULT_MARGIN = 0.05
FSDP_DEVICES = (2, 4, 8)
LAB_LORA = {
    "lora_r": 32,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    **dict.fromkeys(("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head"), True),
}
"""LAB.md's LoRA (r32 on all linear layers) for the "switch to LoRA" alternative of a full recipe."""


@dataclass
class Alternative:
    """At micro batch 1, with its predicted peak or why it was not predicted."""

    change: str
    fits: bool | None
    gpu_used_gib: float | None = None
    peak_alloc_gib: float | None = None
    note: str = ""


@dataclass
class FitResult:
    gpu_memory_gib: float
    margin: float
    budget_gib: float  # gpu_memory_gib x (1 - margin): what a prediction must stay under
    recipe_micro_batch_size: int
    recipe_seq_len: int
    recipe_used_gib: float
    recipe_fits: bool
    max_micro_batch_size: int | None  # None: not even micro batch 1 fits
    max_micro_batch_used_gib: float | None
    micro_batch_limit: int  # the search stopped here (the recipe's per-device global batch unless told otherwise)
    max_seq_len: int | None  # at the recipe's micro batch; None: not even the shortest fits
    max_seq_used_gib: float | None
    seq_len_limit: int
    seq_searched: bool = True
    alternatives: list[Alternative] = field(default_factory=list)
    predictions: int = 0

    @property
    def cheapest(self) -> Alternative | None:
        return next((alt for alt in self.alternatives if alt.fits), None)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "cheapest": self.cheapest.change if self.cheapest else None}

    def lines(self) -> list[str]:
        out = [
            f"GPU memory {_gib(self.gpu_memory_gib)} GiB, margin {self.margin:.0%} kept free: a run fits under "
            f"{_gib(self.budget_gib)} GiB predicted used",
            f"as written (micro batch {self.recipe_micro_batch_size}, {self.recipe_seq_len} tokens): "
            f"{_gib(self.recipe_used_gib)} GiB, {'fits' if self.recipe_fits else 'does not fit'}",
        ]
        if self.max_micro_batch_size is None:
            out.append("largest micro batch: none, not even 1 fits")
        else:
            limit = (
                " (the search limit: the per-device global batch)"
                if (self.max_micro_batch_size == self.micro_batch_limit)
                else ""
            )
            out.append(
                f"largest micro batch: {self.max_micro_batch_size}{limit}, {_gib(self.max_micro_batch_used_gib)} GiB "
                f"({self.max_micro_batch_used_gib / self.gpu_memory_gib:.0%} of the GPU)"
            )
        if self.max_seq_len is None and self.seq_searched:
            out.append(f"longest sequence at micro batch {self.recipe_micro_batch_size}: none fits")
        elif self.max_seq_len is not None:
            limit = " (the model's block size)" if self.max_seq_len == self.seq_len_limit else ""
            out.append(
                f"longest sequence at micro batch {self.recipe_micro_batch_size}: {self.max_seq_len} tokens{limit}, "
                f"{_gib(self.max_seq_used_gib)} GiB"
            )
        if self.alternatives:
            out.append("nothing fits as written; changes at micro batch 1, cheapest first:")
            for alt in self.alternatives:
                verdict = "not predicted" if alt.fits is None else ("fits" if alt.fits else "does not fit")
                gib = (
                    f" {_gib(alt.gpu_used_gib)} GiB used ({_gib(alt.peak_alloc_gib)} allocated),"
                    if (alt.gpu_used_gib is not None)
                    else ""
                )
                out.append(f"  {alt.change:<34}{gib} {verdict}{'; ' + alt.note if alt.note else ''}")
            out.append(f"cheapest change that fits: {self.cheapest.change if self.cheapest else 'none of these'}")
        out.append(f"({self.predictions} predictions)")
        return out


def _gib(value: float) -> str:
    """2 decimals for GPU-sized numbers, 3 significant digits for the ci profile's tiny ones."""
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


class _Judge:
    def __init__(self, budget_gib: float) -> None:
        self.budget_gib = budget_gib
        self.asked: dict[str, MemoryPlan] = {}

    def plan(self, spec: TrainingSpec) -> MemoryPlan:
        key = repr(spec)
        if key not in self.asked:
            self.asked[key] = predict(spec)
        return self.asked[key]

    def fits(self, spec: TrainingSpec) -> bool:
        return self.plan(spec).worst_gpu_used_gib <= self.budget_gib


def largest(
    used: Callable[[int], float], budget: float, *, start: int, low: int, high: int, step: int = 1
) -> int | None:
    """Over the grid (``low``, the multiples of ``step``, ``high``); None where not even ``low`` fits; ``used`` must be
    monotonic. After two answers the secant through the two nearest the budget guesses the crossing, after one
    ``_proportional`` does; a wrong guess bisects, so it never asks more than doubling and bisection would
    (about 2 x log2(high / low))."""
    if low > high:
        raise PlanError(f"empty search range [{low}, {high}]")
    seen: dict[int, float] = {}

    def snap(value: float) -> int:
        value = min(high, max(low, value))  # before int(): a guess of inf (a budget of 1e308 GiB) is `high`
        return int(min(high, max(low, int(value) // step * step)))

    def up(value: int) -> int:  # the next grid value above
        return min(high, (value // step + 1) * step)

    def ask(value: int) -> None:
        if value not in seen:
            seen[value] = used(value)

    ask(snap(start))
    for _ in range(4 * max(1, (high - low).bit_length() + 2)):
        good = max((v for v, u in seen.items() if u <= budget), default=None)
        bad = min((v for v, u in seen.items() if u > budget and (good is None or v > good)), default=None)
        if good == high:
            return good
        if bad == low:
            return None
        if good is not None and bad is not None and up(good) >= bad:
            return good
        floor_ = good if good is not None else low - 1  # the answer lies in (floor_, ceiling_)
        ceiling_ = bad if bad is not None else high + 1
        guess = _secant(seen, budget, good, bad)
        if guess is not None:
            guess = snap(guess)
            if guess <= floor_:  # the secant says `good` is the answer: check the value above it
                guess = up(good)
            elif guess >= ceiling_:
                guess = snap(bad - 1)
        if guess is None or guess in seen or not floor_ < guess < ceiling_:
            if good is None:
                guess = snap(bad // 2) if snap(bad // 2) < bad else low
            elif bad is None:  # memory proportional to the value: for an affine memory, below the crossing
                guess = snap(max(_proportional(good, seen[good], budget), up(good)))
            else:
                guess = snap((good + bad) // 2)
            if guess in seen or not floor_ < guess < ceiling_:
                guess = up(good) if good is not None else low
        ask(guess)
    raise PlanError("the search did not converge: is memory monotonic in this value?")


def largest_micro_batch(
    used: Callable[[int], float], budget: float, *, candidates: Sequence[int], start: int | None = None
) -> int | None:
    """The lab's one search for the largest micro batch that fits: the largest of ``candidates`` whose ``used`` is
    within ``budget``, None where not even the smallest is; ``keeping_global_batch`` gives the candidates that keep a
    global batch. Contiguous candidates are searched by value (the secant's proportional guess holds), others by
    position; ``used`` must grow with the micro batch."""
    ordered = sorted(set(candidates))
    if not ordered or ordered[0] < 1:
        raise PlanError(f"micro batches are whole numbers >= 1; got {list(candidates)[:5]}")
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return largest(used, budget, start=start or ordered[0], low=ordered[0], high=ordered[-1])
    at = max(0, bisect.bisect_right(ordered, start) - 1) if start is not None else 0
    index = largest(lambda i: used(ordered[i]), budget, start=at, low=0, high=len(ordered) - 1)
    return None if index is None else ordered[index]


def keeping_global_batch(per_device_batch: int, limit: int | None = None) -> list[int]:
    """The micro batches (up to ``limit``) that divide the per-device global batch: accumulation x micro batch is
    that batch exactly, so the optimizer step is the same."""
    top = per_device_batch if limit is None else min(limit, per_device_batch)
    return [b for b in range(1, top + 1) if per_device_batch % b == 0]


def _proportional(value: int, used: float, budget: float) -> float:
    """Memory is ``c + a v`` with c > 0 (the weights), so ``v (budget / used)`` never overshoots the crossing
    ``(budget - c) / a``: the guess fits and gives the secant its second point."""
    return value * 2 if used <= 0 else value * budget / used


def _secant(seen: dict[int, float], budget: float, good: int | None, bad: int | None) -> float | None:
    """None without a rising line."""
    if good is not None and bad is not None:
        a, b = good, bad
    else:
        ordered = sorted(seen)
        if len(ordered) < 2:
            return None
        a, b = (ordered[-2], ordered[-1]) if bad is None else (ordered[0], ordered[1])
    slope = (seen[b] - seen[a]) / (b - a)
    if slope <= 0:
        return None
    return a + (budget - seen[a]) / slope


def _with_micro_batch(spec: TrainingSpec, micro: int, per_device_batch: int) -> TrainingSpec:
    return dataclasses.replace(
        spec, micro_batch_size=micro, gradient_accumulation_iters=max(1, per_device_batch // micro)
    )


def fit(
    spec: TrainingSpec,
    *,
    gpu_memory_gib: float | None = None,
    margin: float = DEFAULT_MARGIN,
    max_micro_batch_size: int | None = None,
    seq_multiple: int = 8,
    sequence: bool = True,
    alternatives: bool = True,
    keep_global_batch: bool = False,
) -> FitResult:
    """``max_micro_batch_size`` defaults to the per-device global batch; ``keep_global_batch`` asks only its divisors,
    so accumulation x micro batch stays that batch exactly (else accumulation rounds down); the sequence goes in
    multiples of ``seq_multiple`` up to the block size; alternatives only where micro batch 1 does not fit."""
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else spec.gpu_memory_gib
    if gpu_gib is None:
        raise PlanError("no GPU memory to fit into: pass --gpu-memory-gib G (no GPU found on this machine)")
    if gpu_gib <= 0:
        raise PlanError(f"GPU memory must be positive, got {gpu_gib} GiB")
    if not 0 <= margin < 1:
        raise PlanError(f"margin must be in [0, 1), got {margin}")
    if seq_multiple < 1:
        raise PlanError(f"seq_multiple must be >= 1, got {seq_multiple}")
    spec.validate()
    spec = dataclasses.replace(spec, gpu_memory_gib=float(gpu_gib))
    judge = _Judge(gpu_gib * (1 - margin))
    per_device_batch = spec.micro_batch_size * spec.gradient_accumulation_iters
    batch_limit = int(max_micro_batch_size or per_device_batch)
    if batch_limit < 1:
        raise PlanError(f"max_micro_batch_size must be >= 1, got {batch_limit}")

    recipe_plan = judge.plan(spec)
    best_batch = largest_micro_batch(
        lambda b: judge.plan(_with_micro_batch(spec, b, per_device_batch)).worst_gpu_used_gib,
        judge.budget_gib,
        candidates=keeping_global_batch(per_device_batch, batch_limit) if keep_global_batch else range(1, batch_limit + 1),
        start=min(spec.micro_batch_size, batch_limit),
    )
    seq_limit = int(spec.model_config.block_size)
    best_seq = None
    if sequence:  # off: one question fewer to ask (the what-if explorer asks only for the batch)
        best_seq = largest(
            lambda t: judge.plan(dataclasses.replace(spec, seq_len=t)).worst_gpu_used_gib,
            judge.budget_gib,
            # where not even micro batch 1 fits, the model states alone may not: one question at the shortest says so
            start=spec.seq_len if best_batch is not None else 2,
            low=2,
            high=seq_limit,
            step=seq_multiple,
        )
    result = FitResult(
        gpu_memory_gib=float(gpu_gib),
        margin=margin,
        budget_gib=judge.budget_gib,
        recipe_micro_batch_size=spec.micro_batch_size,
        recipe_seq_len=spec.seq_len,
        recipe_used_gib=recipe_plan.worst_gpu_used_gib,
        recipe_fits=recipe_plan.worst_gpu_used_gib <= judge.budget_gib,
        max_micro_batch_size=best_batch,
        max_micro_batch_used_gib=None
        if best_batch is None
        else judge.plan(_with_micro_batch(spec, best_batch, per_device_batch)).worst_gpu_used_gib,
        micro_batch_limit=batch_limit,
        max_seq_len=best_seq,
        max_seq_used_gib=None
        if best_seq is None
        else judge.plan(dataclasses.replace(spec, seq_len=best_seq)).worst_gpu_used_gib,
        seq_len_limit=seq_limit,
        seq_searched=sequence,
    )
    if best_batch is None and alternatives:
        result.alternatives = alternatives_for(_with_micro_batch(spec, 1, per_device_batch), judge)
    result.predictions = len(judge.asked)
    return result


def alternatives_for(spec: TrainingSpec, judge: _Judge) -> list[Alternative]:
    """In order of what each costs a student: bf16-true (no extra time), activation checkpointing (~1/3 more compute),
    LoRA (adapters, not the model), QLoRA (slower, a little less accurate), FSDP over N GPUs, ZeRO-3 with CPU offload
    (N GPUs and a host-bound step). FSDP and offload stop at the first N that fits."""
    out: list[Alternative] = []

    def ask(change: str, make: Callable[[], TrainingSpec]) -> bool:
        try:
            candidate = make()
            candidate.validate()
            plan = judge.plan(candidate)
        except (PlanError, PlannerUnavailable) as err:
            out.append(Alternative(change, None, note=f"not modelled: {err}"))
            return False
        fits = plan.worst_gpu_used_gib <= judge.budget_gib
        out.append(Alternative(change, fits, plan.worst_gpu_used_gib, plan.peak_alloc_gib))
        return fits

    if spec.precision != "bf16-true":
        ask("precision bf16-true", lambda: dataclasses.replace(spec, precision="bf16-true"))
    if not any(f.name == "activation_checkpointing" for f in dataclasses.fields(spec)):
        out.append(Alternative("activation checkpointing", None, note="not modelled by this planner"))
    elif not spec.activation_checkpointing:
        ask("activation checkpointing", lambda: dataclasses.replace(spec, activation_checkpointing=True))
    if spec.method == "full":
        ask("LoRA r32, all linear layers", lambda: _as_lora(spec, LAB_LORA))
    if spec.method != "qlora":
        ask("QLoRA (bnb.nf4, bf16-true)", lambda: _as_qlora(spec))
    for devices in FSDP_DEVICES:
        if ask(f"FSDP over {devices} GPUs", lambda n=devices: _sharded(spec, "fsdp", n, offload=False)):
            break
    for devices in FSDP_DEVICES:
        if ask(
            f"ZeRO-3 + CPU offload over {devices} GPUs",
            lambda n=devices: _sharded(spec, "deepspeed-zero3", n, offload=True),
        ):
            break
    return out


def _as_lora(spec: TrainingSpec, lora: dict) -> TrainingSpec:
    from litgpt.lora import Config as LoRAConfig

    fields = {f.name: getattr(spec.model_config, f.name) for f in dataclasses.fields(spec.model_config) if f.init}
    fields.update(lora)
    return dataclasses.replace(spec, method="lora", lora=dict(lora), model_config=LoRAConfig(**fields))


def _as_qlora(spec: TrainingSpec) -> TrainingSpec:
    lora = spec.lora or LAB_LORA
    base = spec if spec.method != "full" else _as_lora(spec, lora)
    return dataclasses.replace(
        base, method="qlora", quantize="bnb.nf4", precision="bf16-true", optimizer="AdamW", devices=1, strategy="single"
    )


def _sharded(spec: TrainingSpec, strategy: str, devices: int, *, offload: bool) -> TrainingSpec:
    if spec.method == "qlora":
        raise PlanError("litgpt does not support quantization on more than one device")
    per_device = max(1, spec.gradient_accumulation_iters // devices)
    litgpt_cli = strategy == "fsdp" and spec.loop == "litgpt"  # what `litgpt finetune_* --devices N` runs
    return dataclasses.replace(
        spec,
        # litgpt finetune_full wraps and checkpoints every Block under FSDP (as spec_from_recipe says)
        activation_checkpointing=spec.activation_checkpointing or (litgpt_cli and spec.method == "full"),
        loop="litgpt" if litgpt_cli else "lightning",
        include_validation=litgpt_cli,
        # Fabric's no_backward_sync (litgpt) and the Trainer's under FSDP1 both run FSDP1's no_sync
        fsdp_unsharded_grad_accumulation=litgpt_cli or spec.fsdp_impl == "fsdp1",
        strategy=strategy,
        devices=devices,
        gradient_accumulation_iters=per_device,
        offload_optimizer=offload,
        optimizer="DeepSpeedCPUAdam" if offload else spec.optimizer,
    )
