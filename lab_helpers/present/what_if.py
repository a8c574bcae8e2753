"""The "what if" explorer of notebook 04: change a run and see the planner's memory against this GPU, the largest
micro batch that fits and the step time. ``explore``, the widgets' callback, is a plain function, so nbval and the
tests run it without a browser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lab_helpers.config.experiments import METHODS
from lab_helpers.config.paths import configs_dir
from lab_helpers.config.record_schema import BREAKDOWN_PARTS
from lab_helpers.record.time_bound import GPU_BOUND_BUSY_PCT, HOST_BOUND_BUSY_PCT, band

PRECISIONS = ("bf16-true", "bf16-mixed", "32-true", "16-true", "16-mixed")
STRATEGIES = ("single", "ddp", "fsdp", "deepspeed")
OPTIMIZERS: dict[str, str | None] = {
    "AdamW": None,  # the recipe's own torch.optim.AdamW, with its init_args
    "SGD": "SGD",  # as full-13b-sgd sets it (configs/experiments/single.yaml)
    "AdamW8bit": "bitsandbytes.optim.AdamW8bit",  # as adamw-8bit sets it
    "PagedAdamW8bit": "bitsandbytes.optim.PagedAdamW8bit",  # the same, its moments in CUDA managed memory
}
"""Each with the recipe's ``optimizer`` value a run sets for it; QLoRA's recipes keep their own paged AdamW."""
FSDP_SHARDINGS = ("full", "grad-op")  # FULL_SHARD (ZeRO-3) | SHARD_GRAD_OP (ZeRO-2): an experiment's `sharding`
DEEPSPEED_STAGES = (2, 3)  # ZeRO-2 (gradients and optimizer states sharded) | ZeRO-3 (parameters too)
CI_PRETEND_GPU_GIB = 0.05
"""For the tiny ci models (tens of MiB), a memory a bigger batch can run out of: a CPU has none to exhaust."""
NO_GPU_GIB = 80.0  # gpu profile on a machine without a GPU: ask for an 80 GB card, as notebook 00 does
NO_GPU_NAME = "NVIDIA H100 80GB HBM3"  # ... and predict its time for the lab's reference GPU (an H100 SXM)


@dataclass
class Answer:
    """One explorer answer: the memory plan, the time plan (or why none) and the largest micro batch."""

    values: dict[str, Any]
    plan: Any  # planner.MemoryPlan
    gpu_memory_gib: float
    largest_micro_batch: int | None
    micro_batch_limit: int
    time: Any = None  # planner.TimePlan or None
    notes: list[str] = field(default_factory=list)
    figure: Any = None

    def text(self) -> str:
        used, gpu = self.plan.gpu_used_gib, self.gpu_memory_gib
        lines = [
            f"predicted peak {self.plan.peak_alloc_gib:.3g} GiB allocated, {used:.3g} GiB used of {gpu:g} GiB "
            f"({used / gpu:.0%}): {'fits' if used <= gpu else 'will OOM'}"
        ]
        if self.largest_micro_batch is None:
            lines.append("largest micro batch that fits: none (try LoRA, QLoRA, bf16-true, more GPUs or offload)")
        else:
            limit = " (the whole per-GPU global batch)" if self.largest_micro_batch == self.micro_batch_limit else ""
            lines.append(f"largest micro batch that fits: {self.largest_micro_batch}{limit}")
        lines.append(self.time.summary() if self.time is not None else "time: not predicted")
        if self.time is not None and self.time.split():
            lines.append(self.time.split())
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def models(profile: str) -> list[str]:
    if not isinstance(profile, str) or not profile:  # None was a TypeError from the path join
        raise ValueError(f"unknown profile {profile!r}: ci or gpu")
    folder = configs_dir() / profile
    names = [p.name for p in folder.iterdir() if (p / "full.yaml").is_file()] if folder.is_dir() else []
    if not names:
        raise ValueError(f"no recipes under {folder}: unknown profile {profile!r}")
    return sorted(names, key=_size_order)


def _size_order(name: str) -> tuple[float, str]:
    """ci stand-ins by their size tag (xs < s < m < l), real models by their parameter count in the name."""
    import re

    tags = {"xs": 0, "s": 1, "m": 2, "l": 3}
    tag = name.rsplit("-", 1)[-1]
    if name.startswith("ci-") and tag in tags:
        return tags[tag], name
    billions = re.search(r"(\d+(?:\.\d+)?)b$", name.lower())
    return (float(billions.group(1)) if billions else math.inf), name


def defaults(profile: str) -> dict[str, Any]:
    """The explorer's starting point: the smallest model's LoRA recipe as written, on one device."""
    from lab_helpers.planning.planner.spec import load_recipe

    model = models(profile)[0]
    recipe = load_recipe(configs_dir() / profile / model / "lora.yaml")
    train = recipe.get("train") or {}
    return {
        "model": model,
        "method": "lora",
        "precision": str(recipe.get("precision") or "bf16-true"),
        "lora_r": int(recipe.get("lora_r", 8)),
        "micro_batch_size": int(train.get("micro_batch_size", 1)),
        "seq_len": int(train.get("max_seq_length") or 512),
        "devices": 1,
        "strategy": "single",
        "optimizer": "AdamW",
        "sharding": "full",
        "deepspeed_stage": 3,
        "offload": False,
        "activation_checkpointing": False,
        "gpu_memory_gib": default_gpu_memory_gib(profile),
    }


def default_gpu_memory_gib(profile: str) -> float:
    if profile == "ci":
        return CI_PRETEND_GPU_GIB
    from lab_helpers.hardware.node import this_gpu_memory_gib

    return this_gpu_memory_gib() or NO_GPU_GIB


def planner_strategy(values: dict[str, Any]) -> str:
    """CPU offload is modelled under DeepSpeed only: offload ticked under another strategy means DeepSpeed."""
    strategy = str(values["strategy"])
    if strategy.startswith("deepspeed-zero"):
        return strategy
    if strategy == "deepspeed" or values.get("offload"):
        stage = int(values.get("deepspeed_stage", 3))
        if stage not in DEEPSPEED_STAGES:
            raise ValueError(f"DeepSpeed stage {stage}: the lab runs ZeRO stage 2 or 3")
        return f"deepspeed-zero{stage}"
    return strategy


def spec_for(values: dict[str, Any], profile: str):
    """The optimizer, sharding and offload reach the planner as a run sets them (``predict.planner_inputs``)."""
    from lab_helpers.config.experiments import apply_overrides, resolve_path
    from lab_helpers.config.recipe_defaults import launch_options
    from lab_helpers.planning.planner.spec import load_recipe, spec_from_recipe

    recipe = load_recipe(configs_dir() / profile / values["model"] / f"{values['method']}.yaml")
    optimizer = str(values.get("optimizer") or "AdamW")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r}: one of {', '.join(OPTIMIZERS)}")
    if OPTIMIZERS[optimizer] is not None:
        recipe = apply_overrides(recipe, {"optimizer": OPTIMIZERS[optimizer]})
    recipe["checkpoint_dir"] = str(resolve_path(recipe["checkpoint_dir"]))
    train = recipe.setdefault("train", {})
    micro, devices = int(values["micro_batch_size"]), int(values["devices"])
    if micro < 1 or devices < 1:  # the recipe reader takes 0 as "not given": micro batch 0 'fitted' in 0.01 GiB
        raise ValueError(f"micro batch {micro}, devices {devices}: each a whole number >= 1")
    train["micro_batch_size"] = micro
    train["global_batch_size"] = max(int(train.get("global_batch_size") or 16), micro * devices)
    train["max_seq_length"] = int(values["seq_len"])
    recipe["precision"] = values["precision"]
    if values["method"] != "full":
        recipe["lora_r"] = int(values["lora_r"])
    strategy = planner_strategy(values)
    sharding = str(values.get("sharding") or "full")
    if sharding not in FSDP_SHARDINGS:
        raise ValueError(f"FSDP sharding {sharding!r}: one of {', '.join(FSDP_SHARDINGS)}")
    options = launch_options(strategy, {"offload_optimizer": bool(values["offload"]), "sharding": sharding})
    return spec_from_recipe(
        recipe,
        devices=devices,
        strategy=None if strategy == "single" else strategy,
        offload_optimizer=bool(options["offload_optimizer"]),
        # SHARD_GRAD_OP is an FSDP setting: under another strategy the choice has no meaning and is not passed
        fsdp_reshard_after_forward=strategy != "fsdp" or options["sharding"] != "grad-op",
        activation_checkpointing=bool(values["activation_checkpointing"]) or None,
        gpu_memory_gib=float(values["gpu_memory_gib"]),
        device="cpu" if profile == "ci" else "cuda",
    )


def explore(*, profile: str, draw: bool = True, **values: Any) -> Answer:
    from lab_helpers.planning.planner import PlanError, fit, predict
    from lab_helpers.present.plan_command import predict_step_time

    start = defaults(profile)
    if unknown := sorted(set(values) - set(start)):  # micro_batch=8 was ignored: the defaults' answer, unchanged
        from lab_helpers.config.config_error import did_you_mean

        raise ValueError(f"what_if: no setting {unknown[0]!r}{did_you_mean(unknown[0], start)}")
    values = {**start, **values}
    spec = spec_for(values, profile)
    plan = predict(spec)
    per_device = spec.micro_batch_size * spec.gradient_accumulation_iters
    found = fit(spec, sequence=False, alternatives=False, max_micro_batch_size=per_device)
    answer = Answer(
        values=values,
        plan=plan,
        gpu_memory_gib=float(values["gpu_memory_gib"]),
        largest_micro_batch=found.max_micro_batch_size,
        micro_batch_limit=found.micro_batch_limit,
    )
    if values["offload"] and not str(values["strategy"]).startswith("deepspeed"):
        answer.notes.append(f"CPU offload is a DeepSpeed setting: predicted as {spec.strategy} with offload")
    gpu_name = None
    if spec.device == "cuda" and not _has_gpu():
        gpu_name = NO_GPU_NAME
        answer.notes.append(f"no GPU here: time predicted for an {NO_GPU_NAME}")
    try:
        answer.time = predict_step_time(spec, gpu_name=gpu_name)
    except PlanError as err:
        answer.notes.append(f"no time prediction: {err}")
    if profile == "ci":
        answer.notes.append(
            f"ci profile: live tensor bytes of a CPU step against a pretend {answer.gpu_memory_gib} GiB device"
        )
    if draw:
        answer.figure = draw_answer(answer, budget_gib=found.budget_gib)
    return answer


def _has_gpu() -> bool:
    from lab_helpers.hardware.node import describe_node

    return bool(describe_node().get("gpus"))


def draw_answer(answer: Answer, *, budget_gib: float | None = None):
    """One horizontal stacked bar of the predicted breakdown, with this GPU's memory (and the fit margin) marked."""
    from lab_helpers.present.figure_display import breakdown_colors, new_figure

    figure, ax = new_figure(8.0, 2.4)
    colors = breakdown_colors()
    left = 0.0
    for part in BREAKDOWN_PARTS:
        value = float(answer.plan.breakdown_gib.get(part) or 0.0)
        if value > 0:
            ax.barh(0, value, left=left, color=colors[part], label=part.replace("_", " "))
            left += value
    ax.axvline(
        answer.gpu_memory_gib, color="#b00020", linewidth=2, label=f"device memory {answer.gpu_memory_gib:g} GiB"
    )
    if budget_gib is not None:
        ax.axvline(budget_gib, color="#b00020", linestyle=":", linewidth=1, label="fit limit (margin kept free)")
    ax.set_yticks([])
    ax.set_xlim(0, max(left, answer.gpu_memory_gib, answer.plan.gpu_used_gib) * 1.1)
    ax.set_xlabel("GiB (2^30 bytes)")
    ax.set_title(f"{_setup_line(answer.values)}: {'fits' if answer.plan.fits else 'will OOM'}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def _setup_line(values: dict[str, Any]) -> str:
    strategy = planner_strategy(values)
    if strategy == "fsdp":
        strategy = f"fsdp ({values.get('sharding', 'full')} shard)"
    if values.get("offload"):
        strategy += " + CPU offload"
    return (
        f"{values['model']} {values['method']} {values['precision']}, micro batch {values['micro_batch_size']} x "
        f"{values['seq_len']} tokens, {values.get('optimizer', 'AdamW')}, {strategy} on {values['devices']}"
    )


def show(*, profile: str, **values: Any) -> Answer:
    answer = explore(profile=profile, **values)
    print(answer.text())
    try:
        from IPython.display import display

        display(answer.figure)
    except ImportError:
        pass
    return answer

# ------------------------------------------------------------------------------------------------ cost

COST_EXPERIMENT = "lora-1b"
"""The run 04's cost cell prices alone: the smallest model's LoRA run, the one the notebook starts from."""
PATH_NOTEBOOKS = ("01_single_gpu", "02_multi_gpu")
"""The notebooks whose runs 04's path cost prices (the experiments their cells decide: ``lease.decided_experiments``)."""


@dataclass
class PathCost:
    """One run's training steps and every run the notebooks make here, at the user's price or in GPU-hours."""

    profile: str
    usd_per_gpu_hour: float | None
    run: tuple[str, Any, str]  # (experiment, its RunCost or None, why not)
    runs: dict[str, Any] = field(default_factory=dict)  # experiment -> RunCost, every run the path makes here
    not_priced: dict[str, str] = field(default_factory=dict)  # experiment -> why (not run here)

    @property
    def gpu_hours(self) -> float:
        return sum(cost.gpu_hours for cost in self.runs.values())

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else sum(cost.usd for cost in self.runs.values())

    def text(self) -> str:
        from lab_helpers.planning.cost import usd_text
        from lab_helpers.present.lease import COSTS_FILE

        exp_id, run, why = self.run
        lines = [f"{exp_id}'s training steps on the {self.profile} profile: {run.words() if run else why}"]
        seconds = sum(cost.seconds for cost in self.runs.values())
        gpu_seconds = sum(cost.seconds * cost.gpus for cost in self.runs.values())
        price = "" if self.usd is None else f" x ${self.usd_per_gpu_hour:g} per GPU-hour = {usd_text(self.usd)}"
        notebooks = " and ".join(nb[:2] for nb in PATH_NOTEBOOKS)
        lines.append(
            f"the notebook path ({notebooks}: {len(self.runs)} runs here, {len(self.not_priced)} not run here): "
            f"{seconds / 60:,.1f} min of runs, launch to record: {gpu_seconds:,.0f} GPU-seconds (a run on N GPUs "
            f"counts N times) = {self.gpu_hours:.2g} GPU-hours{price}"
        )
        lines.append(f"each run at its measured cost ({COSTS_FILE}), in full mode plus the course's micro-batches at "
                     "the time model's step: the minutes each notebook prints at its top; reading time is not in it")  # fmt: skip
        if self.profile == "ci":
            lines.append("ci profile: the CPU stands in for the GPU, so this is the arithmetic, not a bill")
        if self.usd_per_gpu_hour is None:
            lines.append("no price set: put your lease's price per GPU-hour in USD_PER_GPU_HOUR; the cost is the "
                         "GPU-hours above x that price")  # fmt: skip
        return "\n".join(lines)


def path_cost(profile: str, usd_per_gpu_hour: float | None = None, node: Any = None) -> PathCost:
    """The path's seconds are the lease's, so 04's cost and the notebooks' minutes are one prediction."""
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.planning.cost import RunCost, checked_price
    from lab_helpers.present.lease import notebook_minutes
    from lab_helpers.present.plan_command import experiment_cost

    price = None if usd_per_gpu_hour is None else checked_price(usd_per_gpu_hour, source="USD_PER_GPU_HOUR")
    node = describe_node() if node is None else node
    answer = PathCost(profile, price, (COST_EXPERIMENT, *experiment_cost(COST_EXPERIMENT, profile=profile,
                                                                         usd_per_gpu_hour=price)))  # fmt: skip
    for notebook in PATH_NOTEBOOKS:
        minutes = notebook_minutes(notebook, node, profile=profile)
        for exp_id, seconds in minutes.run_s.items():
            answer.runs[exp_id] = RunCost(seconds, minutes.gpus[exp_id], "launch to record", price)
        answer.not_priced.update((exp_id, "not run here") for exp_id in minutes.skipped)
    return answer


# ------------------------------------------------------------------------------------------------ host or device

COMPARED_GPUS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
"""NVML names in the lab's peak and bandwidth tables."""
LORA_TARGETS = ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp", "lora_head")
FEWER_LORA_TARGETS = {"lora_key": False, "lora_projection": False, "lora_mlp": False, "lora_head": False}
"""LoRA on the query and value alone (litgpt's defaults), against a recipe that adapts more layers."""


def predicted_busy_pct(plan: Any) -> float:
    """The host runs ahead until the queue is full, so a micro-batch takes the longer of the two."""
    device, host = plan.device_ms_per_micro_batch, plan.host_ms_per_micro_batch
    return 100 * device / max(device, host) if max(device, host) > 0 else 0.0


@dataclass
class Variant:
    """One change to the run and the traced time model's answer for it (``plan`` a TimePlan)."""

    change: str
    plan: Any
    fits: bool | None = None  # the memory plan's verdict, where the change can run out of memory

    def line(self) -> str:
        p = self.plan
        fits = "" if self.fits is None else (", fits in memory" if self.fits else ", will OOM")
        busy = predicted_busy_pct(p)
        return (
            f"{self.change}: host {p.host_ms_per_micro_batch:.0f} ms, device {p.device_ms_per_micro_batch:.0f} ms per "
            f"micro-batch -> {p.time_bound}-bound (GPU busy {busy:.0f} %: `{band(busy)}`); "
            f"{p.tokens_per_s_padded:,.0f} tokens/s, step {p.step_s:.3g} s for "
            f"{p.gradient_accumulation_iters} x {p.micro_batch_size} samples{fits}"
        )


@dataclass
class HostOrDevice:
    """Which of host and device bounds a GPU step (the traced time model), and what would change that."""

    setup: str
    base: Any  # TimePlan of the run as asked
    variants: list[Variant] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def changed(self) -> list[Variant]:
        return [v for v in self.variants if v.plan.time_bound != self.base.time_bound]

    def text(self) -> str:
        if self.base is None or self.base.time_bound is None:
            return "\n".join([f"{self.setup}: no host/device split predicted", *self.notes])
        changed = ", ".join(v.change for v in self.changed()) or "none of these"
        lines = [
            f"{self.setup}:",
            f"  {Variant('as asked', self.base).line()}",
            f"  ({self.base.split()})",
            "changed one way at a time (the same host, the same fitted figures):",
            *(f"  {v.line()}" for v in self.variants),
            f"what turns it {'device' if self.base.time_bound == 'host' else 'host'}-bound: {changed}",
            f"(GPU busy = device / the longer of the two; a run's measured `bound` reads it: gpu at >= "
            f"{GPU_BOUND_BUSY_PCT:.0f} %, host at <= {HOST_BOUND_BUSY_PCT:.0f} %, both between: neither alone sets "
            "the pace)",
        ]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def host_or_device(profile: str, values: dict[str, Any] | None = None, **time_options: Any) -> HostOrDevice:
    """A CPU has no split (one core is host and device), so on ``ci`` this asks about the ``gpu`` profile's default
    recipe. ``time_options`` go to the planner as given: nothing is fitted to records."""
    import copy
    import dataclasses

    from lab_helpers.planning.planner import PlanError, predict
    from lab_helpers.planning.planner.calibration import DeviceEfficiency, device_key
    from lab_helpers.present.plan_command import predict_step_time

    notes: list[str] = []
    if profile == "ci":
        profile = "gpu"
        notes.append("a CPU has no host/device split: asked about the gpu profile's recipe")
    values = {**defaults(profile), **(values or {})}
    gpu_name = _this_gpu_name()
    if gpu_name is None:
        gpu_name = NO_GPU_NAME
        notes.append(f"no GPU here: predicted for an {NO_GPU_NAME}, the lab's reference GPU")
    spec = spec_for(values, profile)
    setup = f"{_setup_line(values)}, on an {gpu_name}"
    if spec.devices == 1:
        setup = (
            f"{values['model']} {values['method']} {values['precision']}, micro batch {spec.micro_batch_size} x "
            f"{spec.seq_len} tokens, {values.get('optimizer', 'AdamW')}, on one {gpu_name}"
        )
    try:
        base = predict_step_time(spec, gpu_name=gpu_name, **time_options)
    except PlanError as err:
        return HostOrDevice(setup, None, notes=[*notes, f"not predicted: {err}"])
    if base.time_bound is None:
        return HostOrDevice(setup, base, notes=[*notes, f"the FLOPs model, not the traced one ({base.mfu_source})"])
    fixed = {
        **time_options,
        "launch_cost_s": base.launch_cost_us / 1e6,
        "launch_cost_source": base.launch_cost_source,
        "device_efficiency": DeviceEfficiency(
            base.matmul_efficiency, base.bandwidth_efficiency, base.efficiency_source
        ),
    }
    answer = HostOrDevice(setup, base, notes=notes)

    def time(changed, gpu: str = gpu_name):
        return predict_step_time(changed, gpu_name=gpu, **fixed)

    micro = spec.micro_batch_size
    while base.time_bound == "host" and micro < MAX_MICRO_BATCH_TRIED:
        micro *= 2
        bigger = spec_for({**values, "micro_batch_size": micro}, profile)
        fits = predict(bigger).fits
        plan = time(bigger)
        answer.variants.append(Variant(f"micro batch {micro}", plan, fits))
        if plan.time_bound != "host" or not fits:
            break
    if spec.method != "full" and any(spec.lora.get(key) for key in FEWER_LORA_TARGETS):
        config = copy.deepcopy(spec.model_config)  # a LoRA config carries the targets the trace builds
        for key, value in FEWER_LORA_TARGETS.items():
            if hasattr(config, key):
                setattr(config, key, value)
        fewer = dataclasses.replace(spec, model_config=config, lora={**spec.lora, **FEWER_LORA_TARGETS})
        targets = ", ".join(key[5:] for key in LORA_TARGETS if spec.lora.get(key))
        answer.variants.append(Variant(f"LoRA on query and value only (the recipe: {targets})", time(fewer)))
    others = [name for name in COMPARED_GPUS if device_key(name) != device_key(gpu_name)]
    if others:
        plans = {name: time(spec, name) for name in others}
        best = min(plans, key=lambda name: plans[name].device_ms_per_micro_batch)
        faster = plans[best].device_ms_per_micro_batch < base.device_ms_per_micro_batch
        same_step = abs(plans[best].step_s - base.step_s) <= 0.005 * base.step_s
        change = f"{'a faster' if faster else 'another'} GPU, an {best} (same host)"
        answer.variants.append(Variant(change + (", the same step" if same_step else ""), plans[best]))
    return answer


MAX_MICRO_BATCH_TRIED = 256
"""``host_or_device`` doubles the micro batch up to this (each double is a trace and a memory plan)."""


def _this_gpu_name() -> str | None:
    from lab_helpers.hardware.node import describe_node

    gpus = describe_node().get("gpus") or []
    return gpus[0].get("name") if gpus else None


def widgets(profile: str):
    """The explorer's widgets (ipywidgets), answering when "Run" is pressed: each answer takes seconds."""
    import ipywidgets as w

    start = defaults(profile)
    controls = {
        "model": w.Dropdown(options=models(profile), value=start["model"], description="model"),
        "method": w.Dropdown(options=METHODS, value=start["method"], description="method"),
        "precision": w.Dropdown(options=PRECISIONS, value=start["precision"], description="precision"),
        "lora_r": w.Dropdown(options=(4, 8, 16, 32, 64, 128), value=start["lora_r"], description="LoRA rank"),
        "micro_batch_size": w.BoundedIntText(
            value=start["micro_batch_size"], min=1, max=4096, description="micro batch"
        ),
        "seq_len": w.BoundedIntText(value=start["seq_len"], min=2, max=1 << 20, description="seq length"),
        "devices": w.Dropdown(options=(1, 2, 4, 8), value=1, description="GPUs"),
        "strategy": w.Dropdown(options=STRATEGIES, value="single", description="strategy"),
        "optimizer": w.Dropdown(options=tuple(OPTIMIZERS), value=start["optimizer"], description="optimizer"),
        "sharding": w.Dropdown(options=FSDP_SHARDINGS, value=start["sharding"], description="FSDP sharding"),
        "deepspeed_stage": w.Dropdown(
            options=DEEPSPEED_STAGES, value=start["deepspeed_stage"], description="ZeRO stage"
        ),
        "offload": w.Checkbox(value=False, description="CPU offload (DeepSpeed)"),
        "activation_checkpointing": w.Checkbox(value=False, description="activation checkpointing"),
        "gpu_memory_gib": w.FloatText(value=start["gpu_memory_gib"], description="GPU GiB"),
    }
    for control in controls.values():  # ipywidgets' default label width cut "FSDP sharding" to "FSDP shar…"
        if not isinstance(control, w.Checkbox):
            control.style.description_width = "initial"

    def answer(**values: Any) -> None:
        try:
            show(profile=profile, **values)
        except Exception as err:  # noqa: BLE001 - a bad combination is one line, not a traceback
            print(f"cannot predict this: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")

    return w.interactive(answer, {"manual": True, "manual_name": "Run"}, **controls)
