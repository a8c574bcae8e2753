"""What runs on a node: one decision, asked by every entry point (``run-all``, the notebooks, ``run``, the doctor),
so the cell, ``scripts/run-lab.sh``, the student's sentence and the notebook's final check agree. LAB.md's matrix
assumes one 80 GB GPU with native bf16 (four for section 02); :func:`decide` adapts it to the node
(``describe_node``'s plain dict, so tests give recorded nodes) and to the planner's "does it fit":

* no GPU: the ``ci`` profile on tiny CPU stand-ins; QLoRA and 8-bit AdamW skipped (bitsandbytes needs CUDA);
* too few GPUs for DDP or FSDP: rank 0 of a simulated world (``simulated_world_here``);
* a GPU under 80 GB: a smaller micro batch at the same global batch, else a substitute that keeps the lesson
  (QLoRA for LoRA-13B, the same technique on a smaller model), else skipped naming what runs instead;
* OOM demonstrations: as the course defines them wherever they do not fit (``predict.oom_demo_overrides``);
* pairs: one micro batch wherever both run on one model (:func:`_paired`);
* no native bf16 (V100): ``16-mixed``, fp16 autocast with dynamic loss scaling;
* optimizer offload: the planner's host RAM against the node's cgroup-aware RAM, else the largest model that fits.

:func:`blocked` makes the same checks for a run already resolved, so a direct ``run`` and the decision never
disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab_helpers.hardware.node import NodeFacts, bitsandbytes_install_command, gpu_memory_gib
from lab_helpers.planning.decision_types import Decision, OomOverrides, PlanLike, Predict
from lab_helpers.planning.micro_batch import fitted_micro_batch, lesson_substitute, named_elsewhere
from lab_helpers.planning.node_limits import (
    bf16_native,
    node_ranks,
    offload_fit,
    reference_hint,
)
from lab_helpers.planning.pairs import at_micro, can_run_at, moved_words, pair_clause, pair_settings
from lab_helpers.planning.predict import COURSE_GPU_GIB
from lab_helpers.planning.profile_choice import MODELS_ENV, models_here

MULTI_RANK_STRATEGIES = ("ddp", "fsdp")
SIMULATED_WORLD = 4
"""The world a node too small for a multi-GPU experiment plays as a simulated rank 0: LAB.md's reference 4 GPUs."""
SIMULATED_WORDS = (
    "memory is what each of the {n} GPUs would hold (torch's fake process group: the collectives return at once); "
    "time has no communication in it and no communication is measured"
)
LAB_GPU_GIB = COURSE_GPU_GIB  # the GPU LAB.md's expectations are written for, used where this node has none
FP16_ROUTE = "16-mixed"
LOSS_SCALING = (
    "fp16 autocast with fp32 master weights and dynamic loss scaling: Lightning's GradScaler multiplies the "
    "loss so that small fp16 gradients do not underflow to 0, unscales them before the step, and skips a step "
    "whose gradients overflowed"
)
OFFLOAD_EXPERIMENT = "deepspeed-offload"
"""The experiment whose host RAM the doctor checks (LAB.md: the 13B with its optimizer offloaded to the CPU)."""


# ----------------------------------------------------------------------------------------------- the gate


def blocked(run: Any, node: NodeFacts) -> str | None:
    """``run_experiment``'s gate: :func:`decide`'s checks without the planner, so a run it chose always passes and one
    asked for directly is skipped with the fix the decision would have made."""
    reason = _hardware_gap(run, node)
    if reason is not None or not run.experiment.options.get("offload_optimizer"):
        return reason
    fit = offload_fit(run, node)
    if fit.fits:
        return None
    if fit.smaller is None:
        return f"{fit.words()}; no model of profile {run.profile!r} fits"
    key, checkpoint_dir, gib = fit.smaller
    return f"{fit.words()}; the {key} model fits (~{gib:.0f} GiB): --set checkpoint_dir={checkpoint_dir}"


def _hardware_gap(run: Any, node: Mapping[str, Any]) -> str | None:
    """CUDA, bitsandbytes, deepspeed, native bf16 and enough GPUs for ``run`` on ``node``, or why not."""
    from lab_helpers.config.experiments import bitsandbytes_use

    experiment = run.experiment
    gpus = node.get("gpus") or []
    packages = node.get("packages") or {}
    bnb = bitsandbytes_use(experiment.method, run.recipe)
    if "cuda" in experiment.needs and not gpus:
        what = f"bitsandbytes {bnb}" if bnb else "this experiment"
        return f"needs CUDA: {what} cannot run on a CPU"
    if bnb and gpus and not packages.get("bitsandbytes"):
        return f"bitsandbytes is not installed ({bitsandbytes_install_command()}): {bnb} is skipped"
    if gpus and str(run.recipe.get("precision") or "").startswith("bf16") and not bf16_native(node):
        gpu = gpus[0]
        return (
            f"no native bf16 on {gpu.get('name')} (compute capability {gpu.get('compute_capability')}); "
            f"this GPU's route is precision={FP16_ROUTE} ({LOSS_SCALING.split(':')[0]})"
        )
    if not gpus or not experiment.distributed:
        return None
    if experiment.options.get("offload_optimizer") and not packages.get("deepspeed"):
        return "deepspeed is not installed (pip install deepspeed): skipped"
    if run.simulated_world_size:
        return None  # rank 0 of the world, alone on one device
    ranks = node_ranks(run, node)
    if ranks > len(gpus) or (experiment.strategy in MULTI_RANK_STRATEGIES and ranks < 2):
        return (
            f"needs at least 2 GPUs, this node has {len(gpus)} ({experiment.strategy} on one rank would only "
            f"measure one-gpu plus overhead); the ci profile shows it on 2 CPU processes; {reference_hint()}"
        )
    return None


# ----------------------------------------------------------------------------------------------- deciding


def decide(
    exp_id: str,
    node: NodeFacts,
    *,
    profile: str,
    predict: Predict | None = None,
    oom_overrides: OomOverrides | None = None,
) -> Decision:
    """Run as defined, with overrides, or skip, each with why. ``predict`` and ``oom_overrides`` default to the planner
    asked about this node's GPU; tests pass recorded plans. A paired experiment is decided with its group from the
    same alone-decisions, so the answer does not depend on which one the notebook asks first."""
    from lab_helpers.config.experiments import get_experiment, pair_group

    how = {"profile": profile, "predict": predict, "oom_overrides": oom_overrides}
    mine = _decide_alone(exp_id, node, **how)
    group = pair_group(exp_id)
    if len(group) == 1:
        return mine
    if not mine.runs:  # nothing to run at its pair's settings; its comparison is in the shipped records
        pair = get_experiment(exp_id).pair
        where = "in the reference results (03_compare with USE_REFERENCE = True)"
        return mine if pair is None else _with_notes(mine, mine.overrides, [f"compare it with its pair {pair} {where}"])
    alone = {e: mine if e == exp_id else _decide_alone(e, node, **how) for e in group}
    return _paired(exp_id, alone, node)


def _decide_alone(
    exp_id: str,
    node: NodeFacts,
    *,
    profile: str,
    predict: Predict | None = None,
    oom_overrides: OomOverrides | None = None,
) -> Decision:
    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning import predict as plans

    predict_given = predict
    defined = resolve(exp_id, profile, check_files=False)
    experiment = defined.experiment
    if (sizes := models_here(profile)) is not None and experiment.model not in sizes:
        return Decision(exp_id, profile, False, {}, "skipped",
                        f"not prepared on this node: {MODELS_ENV}={','.join(sorted(sizes))} runs only those model "
                        f"sizes, and this experiment's model is {experiment.model}")  # fmt: skip
    gpus = node.get("gpus") or []
    if profile == "ci":
        return _decide_ci(exp_id, node, profile)
    if not gpus:
        return Decision(exp_id, profile, False, {}, "skipped", "no GPU: the gpu profile needs one; use LAB_PROFILE=ci")
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

    overrides, why_not = _precision_route(exp_id, recipe, node, notes)
    if why_not is None and (world := simulated_world_here(experiment, node)):
        return _simulated(exp_id, profile, overrides, notes, world, memory, predict_given)
    if why_not is None:
        why_not = _hardware_gap(resolve(exp_id, profile, overrides, check_files=False), node)
    if why_not is None and experiment.options.get("offload_optimizer"):
        why_not = _offload_host(resolve(exp_id, profile, overrides, check_files=False), node, overrides, notes)
    if why_not is not None:
        return _skip(exp_id, profile, overrides, why_not)
    try:
        if experiment.expect == "oom":
            return _oom_demo(exp_id, profile, node, overrides, notes, predict, oom_overrides)
        return _fit(exp_id, experiment, recipe, profile, node, overrides, notes, predict)
    except NoPrediction as exc:
        status = "oom" if experiment.expect == "oom" else "ok"
        return Decision(exp_id, profile, True, overrides, status, _join(notes, str(exc)))


def _paired(exp_id: str, alone: Mapping[str, Decision], node: Mapping[str, Any]) -> Decision:
    """Experiments linked by ``pair`` on one model run at the smallest micro batch each fits alone, which fits them all
    (memory grows with it): the one that fits more moves down, keeping its global batch unless it is defined without
    accumulation. ``fill_gpu`` never moves its pair: the difference is its lesson. Where the two cannot compare so,
    the sentence says what to compare instead."""
    from lab_helpers.config.experiments import get_experiment, linked, load_experiments

    mine = alone[exp_id]
    section = load_experiments(get_experiment(exp_id).section)
    settings = {e: pair_settings(d) for e, d in alone.items()}
    eligible = {e for e, s in settings.items() if s.runs and s.ok and not s.fills}
    links = [(e, p) for e in alone if (p := section[e].pair) in eligible and e in eligible
             and settings[e].model == settings[p].model]  # fmt: skip
    micro = {e: s.micro for e, s in settings.items()}
    notes: list[str] = []
    if exp_id in eligible:
        group = linked(exp_id, links)
        target = min(settings[e].micro for e in group)
        for e in group:
            micro[e] = target if can_run_at(settings[e], target, alone[e], node) else settings[e].micro
        if micro[exp_id] < settings[exp_id].micro:
            setter = next(e for e in alone if e in group and settings[e].micro == target)
            others = [e for e in alone if e in group and e != exp_id]
            notes.append(moved_words(settings[exp_id], target, others, setter))
    overrides = at_micro(mine.overrides, settings[exp_id], micro[exp_id])
    pair = section[exp_id].pair
    if pair is not None and pair in alone:
        if clause := pair_clause(exp_id, pair, alone, settings, micro):
            notes.append(clause)
    return _with_notes(mine, overrides, notes)


def _with_notes(step: Decision, overrides: Mapping[str, Any], notes: list[str]) -> Decision:
    from dataclasses import replace

    return replace(step, overrides=dict(overrides), sentence=_join([step.sentence, *notes])) if notes else step


class NoPrediction(Exception):
    """A prediction is advice: the step runs as defined and says why."""


def _advice(predict: Predict) -> Predict:
    def ask(exp_id: str, overrides: Mapping[str, Any]) -> PlanLike:
        try:
            return predict(exp_id, overrides)
        except Exception as exc:  # noqa: BLE001 - any planner failure: run anyway, say why
            raise NoPrediction(f"no prediction ({type(exc).__name__}: {exc}): runs as defined") from exc

    return ask


def simulated_world_here(experiment: Any, node: Mapping[str, Any]) -> int | None:
    """On a CPU every multi-rank experiment; on one GPU, DDP and FSDP, which one rank cannot show. DeepSpeed's offload
    runs for real on its one rank, and a multi-node experiment is never simulated."""
    multi_rank = experiment.strategy != "single" and experiment.devices == "all"
    if not experiment.distributed or not multi_rank or experiment.num_nodes > 1:
        return None
    gpus = len(node.get("gpus") or [])
    if gpus == 0 or (gpus == 1 and experiment.strategy in MULTI_RANK_STRATEGIES):
        return SIMULATED_WORLD
    return None


def _simulated(
    exp_id: str, profile: str, overrides: dict[str, Any], notes: list[str], world: int, memory: float | None,
    predict: Predict | None,
) -> Decision:  # fmt: skip
    """Expected to run out of memory where the planner says rank 0 of ``world`` does not fit this GPU."""
    from lab_helpers.planning import predict as plans

    note = f"this node has 1 GPU: rank 0 of {world} runs alone on it; " + SIMULATED_WORDS.format(n=world)
    try:
        plan = (
            predict(exp_id, overrides)
            if predict is not None
            else plans.predict_experiment(
                exp_id, profile=profile, overrides=overrides, gpu_memory_gib=memory, device="cuda",
                simulate_world=world,
            )
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a prediction is advice
        return Decision(exp_id, profile, True, overrides, "ok", _join([*notes, note], f"no prediction ({exc})"), world)
    fits = memory is None or plan.gpu_used_gib <= memory
    verdict = f"predicted {plan.gpu_used_gib:.1f} GiB used of {memory or 0:.1f} GiB per GPU" if memory else ""
    status = "ok" if fits else "oom"
    return Decision(exp_id, profile, True, overrides, status, _join([*notes, note], verdict or None), world)


def ci_simulated_global_batch(run: Any, world: int) -> int:
    """The ci recipes' batches are sized for 2 CPU ranks: as rank 0 of ``world``, the global batch grows with the
    world, so that each simulated rank runs the micro-batches per step that each of 2 ranks runs."""
    from lab_helpers.config.experiments import count_devices

    return int(run.recipe["train"]["global_batch_size"]) * world // count_devices("all")


def _decide_ci(exp_id: str, node: Mapping[str, Any], profile: str) -> Decision:
    from lab_helpers.config.experiments import check_profile, resolve

    run = resolve(exp_id, profile, check_files=False)
    if reason := blocked(run, node):
        return Decision(exp_id, profile, False, {}, "skipped", reason)  # the record's reason, as run_experiment's
    stand_in = check_profile(profile)["models"][run.experiment.model]
    if world := simulated_world_here(run.experiment, node):
        global_batch = ci_simulated_global_batch(run, world)
        return Decision(
            exp_id, profile, True, {"train.global_batch_size": global_batch}, "ok",
            f"ci profile: the same recipe on {stand_in}, a tiny random-weight stand-in; no GPU here, so rank 0 of "
            f"{world} runs alone on the CPU (global batch {global_batch}: each rank's micro-batches per step as on "
            f"2 CPU ranks); {SIMULATED_WORDS.format(n=world)}",
            world,
        )  # fmt: skip
    where = "2 CPU processes over gloo play the nodes" if run.experiment.num_nodes > 1 else "on the CPU"
    return Decision(
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


def _offload_host(run: Any, node: Mapping[str, Any], overrides: dict[str, Any], notes: list[str]) -> str | None:
    """DeepSpeed offload keeps 16 B/param on the host: the defined model where RAM allows, else the largest
    model that fits (added to ``overrides``), else why not."""
    fit = offload_fit(run, node)
    ram = "unknown" if fit.ram_gib is None else f"{fit.ram_gib:.0f} GiB"
    if fit.fits:
        notes.append(f"host RAM {ram} holds the offloaded optimizer ({fit.need_gib:.0f} GiB)")
        return None
    if fit.smaller is None:
        return f"{fit.words()}; no model of profile {run.profile!r} fits"
    key, checkpoint_dir, gib = fit.smaller
    overrides["checkpoint_dir"] = checkpoint_dir
    notes.append(
        f"host RAM {ram} cannot hold the {fit.model}'s offloaded optimizer ({fit.need_gib:.0f} GiB): runs the "
        f"{key.upper()} ({gib:.0f} GiB on the host)"
    )
    return None


def _oom_demo(
    exp_id: str,
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    notes: list[str],
    predict: Predict,
    oom_overrides: OomOverrides,
) -> Decision:
    memory = gpu_memory_gib(node)
    demo, why = oom_overrides(exp_id)
    chosen = {**demo, **overrides}
    plan = predict(exp_id, chosen)
    notes.append(why)
    fits = memory is not None and plan.gpu_used_gib <= memory
    return Decision(exp_id, profile, True, chosen, "ok" if fits else "oom", _join(notes))


def _fit(
    exp_id: str,
    experiment: Any,
    recipe: Mapping[str, Any],
    profile: str,
    node: Mapping[str, Any],
    overrides: dict[str, Any],
    notes: list[str],
    predict: Predict,
) -> Decision:
    memory = gpu_memory_gib(node)
    if memory is None:
        return Decision(exp_id, profile, True, overrides, "ok", _join(notes, "GPU memory unknown: runs as defined"))
    fitted, why_not = fitted_micro_batch(exp_id, experiment, profile, node, overrides, predict)
    if fitted is not None:
        return Decision(exp_id, profile, True, fitted, "ok", _join(notes, why_not))
    substitute = lesson_substitute(exp_id, experiment, recipe, profile, node, overrides, predict)
    if substitute is not None:
        trial, what, fit_note = substitute
        return Decision(exp_id, profile, True, trial, "ok", _join(notes, f"{why_not}; runs instead {what}: {fit_note}"))
    return _skip(exp_id, profile, overrides, f"{why_not}; {named_elsewhere(experiment)}{reference_hint()}")


def _skip(exp_id: str, profile: str, overrides: Mapping[str, Any], why: str) -> Decision:
    """A skipped step; the sentence names the precision it would have run in when that was changed."""
    where = f"in {overrides['precision']}, " if "precision" in overrides else ""
    return Decision(exp_id, profile, False, dict(overrides), "skipped", f"skipped here: {where}{why}")


def _join(notes: list[str], last: str | None = None) -> str:
    parts = [*notes, *([last] if last else [])]
    return "; ".join(parts)


def _chosen(only: Any, section: str, experiments: Mapping[str, Any]) -> set[str] | None:
    """``only`` as a set of this section's experiment ids (one id alone counts as one, not as its letters); a name
    the section does not have is one line before anything runs, not a run-all that quietly runs nothing."""
    from lab_helpers.config.config_error import LabConfigError, did_you_mean
    from lab_helpers.config.experiments import load_experiments

    if not only:
        return None
    chosen = {only} if isinstance(only, str) else set(only)
    for name in sorted(chosen - set(experiments), key=str):
        elsewhere = load_experiments().get(name) if isinstance(name, str) else None
        where = (f": it is in section {elsewhere.section!r} (section={elsewhere.section!r})" if elsewhere
                 else did_you_mean(str(name), experiments))  # fmt: skip
        raise LabConfigError(f"only: {name!r} is not an experiment of section {section!r}{where}")
    return chosen


def section_decisions(
    section: str,
    node: NodeFacts,
    *,
    profile: str,
    only: Any = None,
    predict: Predict | None = None,
    oom_overrides: OomOverrides | None = None,
):
    """Decided as each is reached, so the first run does not wait for the last decision: what ``run-all`` runs."""
    from lab_helpers.config.experiments import load_experiments

    experiments = load_experiments(section)
    chosen = _chosen(only, section, experiments)
    for exp_id in experiments:
        if chosen is None or exp_id in chosen:
            yield exp_id, decide(exp_id, node, profile=profile, predict=predict, oom_overrides=oom_overrides)
