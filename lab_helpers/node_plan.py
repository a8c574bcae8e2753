"""What the notebooks do with each experiment on *this* node: run it as defined, run it with overrides, or skip it.

Why a module of its own: LAB.md's matrix assumes one 80 GB GPU with native bf16 (and 4 of them for section 02).
Other nodes need other choices, and they must be the same choice in the cell that runs an experiment, in the
sentence the student reads and in the notebook's final check. This module makes them once, from the node as
:func:`lab_helpers.node.describe_node` reports it (a plain dict, so tests can give recorded nodes: an H200, an
A10G, a V100, four H100s, none) and from the planner's predictions for "does it fit":

* **no GPU** -- the ``ci`` profile: every experiment on tiny CPU stand-ins; QLoRA and 8-bit AdamW are skipped
  (bitsandbytes' kernels need CUDA);
* **one GPU** -- section 02 runs what one GPU can show (``one-gpu``, DeepSpeed offload); DDP and FSDP on one
  rank would only measure ``one-gpu`` plus overhead, so they are skipped and say why;
* **GPUs smaller than 80 GB** -- an experiment that does not fit is offered with a smaller micro batch (the
  global batch, and so the optimizer step, unchanged; small-batch, defined without accumulation, shrinks both);
  where no batch fits, a substitute keeps the lesson (QLoRA for LoRA-13B; act-ckpt, 8-bit AdamW and SGD on the
  largest model that fits); what has none (full-3b, full-7b) is skipped naming the experiments that train its
  model here;
* **OOM demonstrations** -- run as the course defines them wherever that is predicted not to fit; only on a GPU
  that holds the course's batch does :func:`lab_helpers.predict.oom_demo_overrides` raise the batch (baseline)
  or, where a bigger batch would change the lesson (full-13b on a GPU that holds 13B's states), run a precision
  whose model states alone do not fit; the sentence says which and why;
* **no native bf16** (V100) -- bf16 experiments run in ``16-mixed``: fp16 autocast with dynamic loss scaling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lab_helpers.node import gpu_memory_gib  # noqa: F401  (the notebooks call node_plan.gpu_memory_gib)
from lab_helpers.predict import COURSE_GPU_GIB

MULTI_RANK_STRATEGIES = ("ddp", "fsdp")
LAB_GPU_GIB = COURSE_GPU_GIB  # the GPU LAB.md's expectations are written for, used where this node has none
HOST_RAM_HEADROOM = 1.1  # pinned buffers and the processes themselves, above the offloaded optimizer state
FP16_ROUTE = "16-mixed"
LOSS_SCALING = (
    "fp16 autocast with fp32 master weights and dynamic loss scaling: Lightning's GradScaler multiplies the "
    "loss so that small fp16 gradients do not underflow to 0, unscales them before the step, and skips a step "
    "whose gradients overflowed"
)


class PlanLike(Protocol):
    gpu_used_gib: float
    peak_alloc_gib: float


Predict = Callable[[str, Mapping[str, Any]], PlanLike]
OomOverrides = Callable[[str], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class Step:
    """One experiment on this node: whether it runs, with which overrides, what status to expect, and why."""

    exp_id: str
    profile: str
    runs: bool
    overrides: dict[str, Any] = field(default_factory=dict)
    expected_status: str = "ok"  # ok | oom | skipped
    sentence: str = ""

    def run(self, **kwargs: Any) -> list[dict[str, Any]]:
        """``lab.run_experiment`` with this step's overrides, or a ``skipped`` record saying why."""
        from lab_helpers import lab

        if self.runs:
            return lab.run_experiment(self.exp_id, profile=self.profile, overrides=self.overrides, **kwargs)
        return lab.record_skipped(self.exp_id, profile=self.profile, reason=self.sentence, overrides=self.overrides)


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
    from lab_helpers.paths import reference_dir

    shipped = sorted(p.stem for p in reference_dir().glob("*.jsonl")) if reference_dir().is_dir() else []
    have = ", ".join(shipped) if shipped else "none yet"
    return f"reference results: 03_compare with USE_REFERENCE = True (shipped today: {have}; REFERENCE_NAME picks one)"


# ----------------------------------------------------------------------------------------------- deciding


def decide(
    exp_id: str,
    node: Mapping[str, Any],
    *,
    profile: str,
    predict: Predict | None = None,
    oom_overrides: OomOverrides | None = None,
) -> Step:
    """What this node does with ``exp_id`` on ``profile``. ``predict`` (exp_id, overrides) -> a plan with
    ``gpu_used_gib`` and ``oom_overrides`` default to the lab's planner; tests pass recorded plans."""
    from lab_helpers import predict as plans
    from lab_helpers.arithmetic import resolved

    defined = resolved(exp_id, profile)
    experiment = defined.experiment
    gpus = node.get("gpus") or []
    if profile == "ci":
        return _decide_ci(exp_id, experiment, node, profile)
    if not gpus:
        return Step(exp_id, profile, False, {}, "skipped", "no GPU: the gpu profile needs one; use LAB_PROFILE=ci")
    # the planner is asked about this node's GPU (its size as the node reports it), as the run will use it
    memory = gpu_memory_gib(node)
    predict = _advice(
        predict
        or (
            lambda e, o: plans.predict_experiment(
                e, profile=profile, overrides=dict(o), gpu_memory_gib=memory, device="cuda"
            )
        )
    )
    oom_overrides = oom_overrides or (
        lambda e: plans.oom_demo_overrides(e, profile=profile, gpu_memory_gib=memory, device="cuda")
    )
    recipe = defined.recipe
    notes: list[str] = []

    overrides, blocked = _precision_route(exp_id, recipe, node, notes)
    if blocked is None:
        blocked = _missing_hardware(experiment, node, profile, overrides, notes)
    if blocked is not None:
        return _skip(exp_id, profile, overrides, blocked)
    try:
        if experiment.expect == "oom":
            return _oom_demo(exp_id, profile, node, overrides, notes, predict, oom_overrides)
        return _fit(exp_id, experiment, recipe, profile, node, overrides, notes, predict)
    except NoPrediction as exc:
        status = "oom" if experiment.expect == "oom" else "ok"
        return Step(exp_id, profile, True, overrides, status, _join(notes, str(exc)))


class NoPrediction(Exception):
    """The planner could not answer; the step runs as defined and says why (a prediction is advice)."""


def _advice(predict: Predict) -> Predict:
    def ask(exp_id: str, overrides: Mapping[str, Any]) -> PlanLike:
        try:
            return predict(exp_id, overrides)
        except Exception as exc:  # noqa: BLE001 - any planner failure: run anyway, say why
            raise NoPrediction(f"no prediction ({type(exc).__name__}: {exc}): runs as defined") from exc

    return ask


def _decide_ci(exp_id: str, experiment: Any, node: Mapping[str, Any], profile: str) -> Step:
    from lab_helpers.arithmetic import resolved
    from lab_helpers.experiments import bitsandbytes_use, check_profile

    stand_in = check_profile(profile)["models"][experiment.model]
    if "cuda" in experiment.needs and not node.get("gpus"):
        bnb = bitsandbytes_use(experiment.method, resolved(exp_id, profile).recipe)
        kernels = {"QLoRA": "bitsandbytes 4-bit kernels", "8-bit AdamW": "bitsandbytes 8-bit optimizer kernels"}
        why = kernels.get(bnb or "", f"bitsandbytes {bnb}" if bnb else "a CUDA GPU")
        return Step(exp_id, profile, True, {}, "skipped", f"needs CUDA ({why}): recorded as skipped")
    where = "2 CPU processes over gloo play the GPUs" if experiment.section == "multi" else "on the CPU"
    return Step(
        exp_id,
        profile,
        True,
        {},
        "ok",
        f"ci profile: the same recipe on {stand_in}, a tiny random-weight stand-in, {where} -- the code path "
        "is real, the numbers are small",
    )


def _precision_route(
    exp_id: str, recipe: Mapping[str, Any], node: Mapping[str, Any], notes: list[str]
) -> tuple[dict[str, Any], str | None]:
    """Overrides that replace bf16 on a GPU without it (V100), or why the experiment has no such route."""
    precision = str(recipe.get("precision") or "")
    if not precision.startswith("bf16") or bf16_native(node):
        return {}, None
    gpu = (node.get("gpus") or [{}])[0]
    why = f"no native bf16 on {gpu.get('name')} (compute capability {gpu.get('compute_capability')})"
    if exp_id == "bf16-true":
        return {}, (
            f"{why}; its fp16 counterpart, 16-true, has no loss scaling, so small gradients underflow to 0 -- "
            f"this GPU's route is {FP16_ROUTE}, in the bf16-mixed experiment"
        )
    if recipe.get("quantize"):
        notes.append(
            f"{why}: runs in 16-true (litgpt refuses quantization with mixed precision): fp16 adapters without "
            "loss scaling, valid for memory and time, watch the loss"
        )
        return {"precision": "16-true"}, None
    notes.append(f"{why}: runs in {FP16_ROUTE} (fp16 autocast with loss scaling)")
    return {"precision": FP16_ROUTE}, None


def _missing_hardware(
    experiment: Any, node: Mapping[str, Any], profile: str, overrides: dict[str, Any], notes: list[str]
) -> str | None:
    """Why this node cannot run the experiment at all (too few GPUs, a package, host RAM), or None.

    May add a smaller model to ``overrides`` for DeepSpeed offload when the host cannot hold the 13B's states.
    """
    from lab_helpers.arithmetic import resolved
    from lab_helpers.experiments import bitsandbytes_use

    gpus = node.get("gpus") or []
    packages = node.get("packages") or {}
    bnb = bitsandbytes_use(experiment.method, resolved(experiment.id, profile).recipe)
    if bnb and not packages.get("bitsandbytes"):
        return f"bitsandbytes is not installed (pip install 'lab_helpers[qlora]'): {bnb} is skipped"
    if not experiment.distributed:
        return None
    ranks = (len(gpus) if experiment.devices == "all" else int(experiment.devices)) * experiment.num_nodes
    if ranks > len(gpus) or (experiment.strategy in MULTI_RANK_STRATEGIES and ranks < 2):
        return (
            f"needs at least 2 GPUs, this node has {len(gpus)} ({experiment.strategy} on one rank would only "
            f"measure one-gpu plus overhead); the ci profile shows it on 2 CPU processes; {reference_hint()}"
        )
    if experiment.options.get("offload_optimizer"):
        return _offload_host(experiment, node, profile, overrides, notes)
    return None


def _offload_host(
    experiment: Any, node: Mapping[str, Any], profile: str, overrides: dict[str, Any], notes: list[str]
) -> str | None:
    """DeepSpeed offload keeps 16 B/param on the host: the 13B where RAM allows, else the 7B, else skip."""
    from lab_helpers.arithmetic import offload_host_gib

    if not (node.get("packages") or {}).get("deepspeed"):
        return "deepspeed is not installed (pip install deepspeed): skipped"
    ram = (node.get("host") or {}).get("ram_total_gib")
    need = offload_host_gib(experiment.id, profile=profile)
    if isinstance(ram, (int, float)) and ram >= need * HOST_RAM_HEADROOM:
        notes.append(f"host RAM {ram:.0f} GiB holds the offloaded optimizer ({need:.0f} GiB)")
        return None
    smaller = _smaller_model_checkpoint(profile, "7b")
    need_small = _offload_need_with(experiment.id, profile, smaller)
    if isinstance(ram, (int, float)) and ram >= need_small * HOST_RAM_HEADROOM:
        overrides["checkpoint_dir"] = smaller
        notes.append(
            f"host RAM {ram:.0f} GiB cannot hold the 13B's offloaded optimizer ({need:.0f} GiB): runs the 7B "
            f"({need_small:.0f} GiB on the host)"
        )
        return None
    return f"host RAM ({ram} GiB) is too small for the offloaded optimizer ({need_small:.0f} GiB even for the 7B)"


def _smaller_model_checkpoint(profile: str, model: str) -> str:
    import yaml

    from lab_helpers.experiments import check_profile
    from lab_helpers.paths import configs_dir

    folder = check_profile(profile)["models"][model]
    recipe = yaml.safe_load((configs_dir() / profile / folder / "full.yaml").read_text())
    return str(recipe["checkpoint_dir"])


def _offload_need_with(exp_id: str, profile: str, checkpoint_dir: str) -> float:
    from lab_helpers.arithmetic import GIB, OFFLOAD_HOST_BYTES_PER_PARAM, count_params
    from lab_helpers.experiments import resolve_path

    return count_params(str(resolve_path(checkpoint_dir))).trainable * OFFLOAD_HOST_BYTES_PER_PARAM / GIB


def _oom_demo(
    exp_id: str,
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    notes: list[str],
    predict: Predict,
    oom_overrides: OomOverrides,
) -> Step:
    """An OOM demonstration keeps the course's lesson here (``predict.oom_demo_overrides`` decides: the course's
    batch where it does not fit, else a raised batch or, for a model-states lesson, a precision that does not
    fit); the step expects the OOM the planner predicts for what runs."""
    memory = gpu_memory_gib(node)
    demo, why = oom_overrides(exp_id)
    chosen = {**demo, **overrides}
    plan = predict(exp_id, chosen)
    notes.append(why)
    fits = memory is not None and plan.gpu_used_gib <= memory
    return Step(exp_id, profile, True, chosen, "ok" if fits else "oom", _join(notes))


SMALLER_MODEL_SUBSTITUTES = ("act-ckpt", "adamw-8bit", "full-13b-sgd")
"""Experiments whose lesson is a technique (checkpointing, 8-bit AdamW, SGD), not a model size: where their model
does not fit, the same technique on the largest model that does keeps the lesson."""


def _fit(
    exp_id: str,
    experiment: Any,
    recipe: Mapping[str, Any],
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    notes: list[str],
    predict: Predict,
) -> Step:
    """Run as defined where the planner says it fits; else a smaller micro batch; else a named substitute that
    keeps the lesson (QLoRA for LoRA, the same technique on a smaller model); else skip, naming what runs."""
    memory = gpu_memory_gib(node)
    if memory is None:
        return Step(exp_id, profile, True, overrides, "ok", _join(notes, "GPU memory unknown: runs as defined"))
    fitted, why_not = _largest_micro_batch(exp_id, experiment, profile, node, overrides, predict)
    if fitted is not None:
        return Step(exp_id, profile, True, fitted, "ok", _join(notes, why_not))
    substitute = _substitute(exp_id, experiment, recipe, profile, node, overrides, predict)
    if substitute is not None:
        trial, what, fit_note = substitute
        return Step(exp_id, profile, True, trial, "ok", _join(notes, f"{why_not}; runs instead {what}: {fit_note}"))
    return _skip(exp_id, profile, overrides, f"{why_not}; {_named_elsewhere(experiment)}{reference_hint()}")


def _largest_micro_batch(
    exp_id: str,
    experiment: Any,
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    predict: Predict,
) -> tuple[dict[str, Any] | None, str]:
    """(overrides, how it fits) at the largest micro batch that fits, halving from the recipe's; (None, why not).

    An experiment defined without accumulation (global batch = micro batch: small-batch) shrinks both, so it still
    teaches a small batch; one defined with it keeps its global batch and accumulates more micro-batches.
    """
    from lab_helpers.arithmetic import model_states, resolved

    memory = gpu_memory_gib(node)
    where = f"this {gpu_words(node)}"
    if experiment.strategy in ("single", "ddp"):
        states = model_states(exp_id, profile=profile, overrides=overrides)
        if states.gib > memory:
            return None, f"its model states alone are {states.gib:.1f} GiB, more than {where} holds"
    train = dict(resolved(exp_id, profile, overrides).recipe.get("train") or {})
    micro = first = int(train.get("micro_batch_size") or 1)
    no_accumulation = int(train.get("global_batch_size") or first) == first
    while True:
        shrink = {"train.micro_batch_size": micro} if micro != first else {}
        if shrink and no_accumulation:
            shrink["train.global_batch_size"] = micro
        trial = {**overrides, **shrink}
        plan = predict(exp_id, trial)
        if plan.gpu_used_gib <= memory:
            break
        if micro == 1:
            return None, f"does not fit {where} even at micro batch 1 (predicted {plan.gpu_used_gib:.1f} GiB used)"
        micro //= 2
    used = f"predicted {plan.gpu_used_gib:.1f} GiB used"
    if micro == first:
        return trial, f"fits {where} as defined: {used}"
    if no_accumulation:
        return trial, (
            f"micro and global batch {first} -> {micro} so that it fits {where} ({used}), without accumulation, "
            "as the course defines it"
        )
    return trial, (
        f"micro batch {first} -> {micro} so that it fits {where} ({used}); the global batch stays "
        f"{train.get('global_batch_size')}, so the optimizer step is unchanged and gradient accumulation takes "
        "more micro-batches"
    )


def _substitute(
    exp_id: str,
    experiment: Any,
    recipe: Mapping[str, Any],
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    predict: Predict,
) -> tuple[dict[str, Any], str, str] | None:
    """A run that keeps the experiment's lesson on this node: (overrides, what it is, how it fits), or None."""
    candidates: list[tuple[dict[str, Any], str]] = []
    has_bnb = bool((node.get("packages") or {}).get("bitsandbytes"))
    if experiment.method == "lora" and not recipe.get("quantize") and has_bnb and "precision" not in overrides:
        qlora = f"QLoRA-{experiment.model.upper()} (the same LoRA with the frozen weights in 4-bit NF4)"
        candidates.append(({**overrides, "quantize": "bnb.nf4"}, qlora))
    if exp_id in SMALLER_MODEL_SUBSTITUTES:
        for model in reversed(_smaller_models(profile, experiment.model)):
            smaller = {**overrides, "checkpoint_dir": _smaller_model_checkpoint(profile, model)}
            candidates.append((smaller, f"{exp_id} on the {model.upper()} model, the largest that fits"))
    for trial, what in candidates:
        fitted, how = _largest_micro_batch(exp_id, experiment, profile, node, trial, predict)
        if fitted is not None:
            return fitted, what, how
    return None


def _smaller_models(profile: str, model: str) -> list[str]:
    """The profile's models smaller than ``model``, smallest first (profiles list them so)."""
    from lab_helpers.experiments import check_profile

    models = list(check_profile(profile)["models"])
    return models[: models.index(model)]


def _named_elsewhere(experiment: Any) -> str:
    """For a skipped experiment: which experiments of its section train the same model here (their cells say
    how), so the sentence names what ran instead."""
    from lab_helpers.experiments import load_experiments

    section = load_experiments(experiment.section).items()
    others = [e for e, x in section if x.model == experiment.model and x.method != experiment.method]
    if not others:
        return ""
    return f"the {experiment.model.upper()} model is trained here by {' and '.join(others)} (its substitutes); "


def _skip(exp_id: str, profile: str, overrides: Mapping[str, Any], why: str) -> Step:
    """A skipped step; the sentence names the precision it would have run in when that was changed."""
    where = f"in {overrides['precision']}, " if "precision" in overrides else ""
    return Step(exp_id, profile, False, dict(overrides), "skipped", f"skipped here: {where}{why}")


def _join(notes: list[str], last: str | None = None) -> str:
    parts = [*notes, *([last] if last else [])]
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------- overviews


def overview(node: Mapping[str, Any], *, profile: str = "gpu"):
    """00_check_node's table: per single-GPU experiment, its model states (arithmetic, no planner) against this
    node's GPU -- a quick first answer; 01 asks the planner, activations included, before each run."""
    import pandas as pd

    from lab_helpers.arithmetic import model_states
    from lab_helpers.experiments import load_experiments

    memory = gpu_memory_gib(node)
    where = f"on {gpu_words(node)}"
    if memory is None:  # no GPU here: answer for the GPU LAB.md is written for
        memory, where = LAB_GPU_GIB, f"on an {LAB_GPU_GIB:.0f} GiB GPU (none here)"
    rows = []
    for exp_id in load_experiments("single"):
        states = model_states(exp_id, profile=profile)
        if states.gib > memory:
            verdict = "no: model states alone exceed the GPU"
        else:
            verdict = f"model states use {100 * states.gib / memory:.0f} %; 01 asks the planner"
        rows.append((exp_id, states.precision, round(states.gib, 1), verdict))
    return pd.DataFrame(rows, columns=["experiment", "precision", "model states GiB", where])


def section_note(node: Mapping[str, Any], *, section: str, profile: str) -> str:
    """The sentence at the top of 01 / 02: what this node runs of the section, and why."""
    gpus = node.get("gpus") or []
    if profile == "ci":
        return (
            "ci profile: every experiment runs on tiny CPU stand-ins (QLoRA and 8-bit AdamW, bitsandbytes' CUDA "
            "kernels, are skipped); "
            f"{reference_hint()}"
        )
    if section == "multi" and len(gpus) < 2:
        return (
            f"{gpu_words(node)}: this section runs what one GPU can show (one-gpu, DeepSpeed offload); DDP, FSDP "
            f"and the two-node run need at least 2 GPUs and are recorded as skipped. {reference_hint()}"
        )
    route = "" if bf16_native(node) else f"; no native bf16: bf16 experiments run in {FP16_ROUTE}, {LOSS_SCALING}"
    return f"{gpu_words(node)}{route}: each cell says whether its experiment runs as defined, smaller, or not"
