"""``python -m lab_helpers plan RECIPE.yaml|EXPERIMENT [...]``: print a memory plan, or one clear line on bad input.

An experiment id is planned exactly as it runs: its recipe for the profile, its ``set`` and its options, through
``predict.planner_inputs``, the translation ``lab.predict_experiment`` uses; with ``--time`` its micro-batches are one
pass of quick mode's sampler in its batch order, padded as its ``pad_multiple`` says, and its levers (compiled blocks,
CUDA graphs, the attention backend) reach the time model (``planner.levers``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab_helpers.config.config_error import LabConfigError, did_you_mean
from lab_helpers.config.experiments import PROFILES
from lab_helpers.config.recipe_defaults import BATCH_ORDERS
from lab_helpers.config.record_schema import BREAKDOWN_PARTS
from lab_helpers.config.secrets import for_terminal
from lab_helpers.planning.cost import PRICE_FLAG, RunCost, checked_price
from lab_helpers.planning.planner.errors import PlanError, PlannerUnavailable
from lab_helpers.planning.planner.spec import STRATEGIES, TrainingSpec, load_recipe, spec_from_recipe

if TYPE_CHECKING:
    from lab_helpers.config.experiments import ResolvedRun
    from lab_helpers.planning.planner.levers import Levers
    from lab_helpers.planning.planner.timing import TimePlan
    from lab_helpers.training.data_lengths import BatchPadding

MAX_GPU_MEMORY_GIB = 100_000  # the largest GPU of 2026 has 288 GiB: beyond this, a typo (1e308 overflowed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recipe",
        help="a litgpt finetune_full / finetune_lora recipe (YAML), or an experiment id (planned as it runs on --profile)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="an experiment's profile (default: $LAB_PROFILE, else gpu with CUDA, ci without)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key, dotted for nested ones (train.micro_batch_size=2); repeatable",
    )
    parser.add_argument("--devices", type=int, default=None, help="GPUs (default: the recipe's devices)")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None, help="default: litgpt's own choice")
    parser.add_argument("--offload-optimizer", action="store_true", help="DeepSpeed ZeRO-3 optimizer offload")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="memory of the GPU to judge 'fits'")
    parser.add_argument("--data-max-len", type=int, default=None, help="longest sample in the data, in tokens")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="cpu: the live tensor bytes of the step on a CPU (the ci profile), no CUDA context or cuBLAS workspace "
        "(default: cuda; an experiment: where its profile runs)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--fit",
        action="store_true",
        help="what fits this GPU (or --gpu-memory-gib): largest micro batch, longest sequence, and the cheapest "
        "change when nothing fits",
    )
    parser.add_argument("--margin", type=float, default=None, help="--fit: fraction of GPU memory kept free (0.05)")
    parser.add_argument(
        "--max-micro-batch", type=int, default=None, help="--fit: search limit (default: the per-GPU global batch)"
    )
    parser.add_argument(
        "--time", action="store_true", help="also predict step time and tokens/s (lab_helpers.planning.planner.timing)"
    )
    parser.add_argument(
        "--gpu-name",
        default=None,
        help="GPU to predict step time for (default: this node's; e.g. 'NVIDIA A100-SXM4-80GB')",
    )
    parser.add_argument(
        "--link-gbs",
        type=float,
        default=None,
        help="--time: bus bandwidth between the GPUs in GB/s (nccl-tests' busbw; NVLink A100 ~200, PCIe ~10-20); "
        "default: what `python -m lab_helpers bandwidth` measured on this node",
    )
    parser.add_argument(
        "--sample-lengths",
        default=None,
        metavar="FILE",
        help="--time: the data's sample lengths in tokens (a JSON list, or one number a line); default: the "
        "recipe's data, tokenized as litgpt does, where it is on this machine",
    )
    parser.add_argument(
        "--batch-order",
        choices=BATCH_ORDERS,
        default=None,
        help="--time: time the micro-batches quick mode's sampler makes in this order (length-grouped: the "
        "length-grouped experiment's), at their mean padded length; default: a micro-batch of random samples "
        "(the expected longest of micro-batch-size samples)",
    )
    parser.add_argument(
        PRICE_FLAG,
        dest="usd_per_gpu_hour",
        default=None,
        metavar="PRICE",
        help="--time: also the run's predicted cost: its optimizer steps x the predicted step time x the GPUs it "
        "holds x PRICE, your lease's US dollars per GPU-hour (no default: without it, no cost)",
    )


def _print_table(plan) -> None:
    print(plan.summary())
    print(
        f"  {plan.model_name}: {plan.method}, {plan.precision}, micro-batch {plan.micro_batch_size} x "
        f"{plan.seq_len} tokens, {plan.strategy} on {plan.devices} GPU(s); peak in {plan.peak_phase}"
    )
    for key in BREAKDOWN_PARTS:
        print(f"  {key:<22} {plan.breakdown_gib[key]:8.2f} GiB")
    print(f"  {'host memory':<22} {plan.host_gib:8.2f} GiB")
    phases = ", ".join(f"{k} {v:.2f}" for k, v in plan.peaks_by_phase_gib.items())
    print(
        f"  whole run: {plan.whole_run_peak_alloc_gib:.2f} GiB allocated, in {plan.whole_run_peak_phase} ({phases} GiB)"
    )
    for note in plan.notes:
        print(f"  note: {note}")


def run(args: argparse.Namespace, *, default_profile: Callable[[], str] | None = None) -> int:
    """``default_profile`` gives an experiment's profile where ``--profile`` does not."""
    try:
        if args.devices is not None and args.devices < 1:
            raise PlanError(f"--devices must be at least 1, got {args.devices}")
        # nan, inf, 0, negatives and 1e308: one line naming the flag, not a traceback (a 0 GiB GPU holds nothing)
        gpu_gib = getattr(args, "gpu_memory_gib", None)
        if gpu_gib is not None and not (math.isfinite(gpu_gib) and 0 < gpu_gib <= MAX_GPU_MEMORY_GIB):
            raise PlanError(
                f"--gpu-memory-gib must be a number of GiB above 0 and at most {MAX_GPU_MEMORY_GIB:,} (e.g. 79), "
                f"got {gpu_gib:g}"
            )
        margin = getattr(args, "margin", None)
        if margin is not None and not 0 <= margin < 1:  # nan fails the comparison too
            raise PlanError(f"--margin must be a fraction from 0 up to (not including) 1 (e.g. 0.05), got {margin:g}")
        if not getattr(args, "fit", False) and (
            getattr(args, "margin", None) is not None or getattr(args, "max_micro_batch", None) is not None
        ):
            raise PlanError("--margin and --max-micro-batch belong to --fit")
        for flag in ("gpu_name", "link_gbs", "sample_lengths", "batch_order", "usd_per_gpu_hour"):
            if getattr(args, flag, None) is not None and not getattr(args, "time", False):
                raise PlanError(f"--{flag.replace('_', '-')} is an input of the time prediction: add --time")
        price = _price(args)
        experiment = _experiment_run(args, default_profile)
        if experiment is not None:
            recipe, spec = _experiment_spec(experiment, args)
        else:
            strategy = args.strategy
            if args.offload_optimizer and strategy is None:
                strategy = "deepspeed-zero3"
            recipe, devices = _checked_recipe(args, strategy)
            spec = spec_from_recipe(
                recipe,
                devices=devices,
                strategy=strategy,
                offload_optimizer=args.offload_optimizer,
                gpu_memory_gib=_gpu_memory_gib(args),
                data_max_len=args.data_max_len,
                device=args.device or "cuda",
            )
        if getattr(args, "fit", False):
            return _run_fit(spec, args)
        from lab_helpers.planning.planner.plan import predict  # torch: imported once there is something to trace

        plan = predict(spec)
        time_plan, time_note, batches = (None, "", None)
        if getattr(args, "time", False):
            time_plan, time_note, batches = _time(spec, args, recipe, experiment)
        cost = None if price is None else run_cost(time_plan, recipe, experiment, spec.devices, price)
        if cost is not None and time_plan is None:
            cost = (None, f"not priced: the step time was {time_note}")
    except (PlanError, PlannerUnavailable, LabConfigError) as err:
        print(f"error: {for_terminal(str(err))}", file=sys.stderr)
        return 2
    if args.json:
        extra = {"time": time_plan.to_dict() if time_plan else None} if getattr(args, "time", False) else {}
        if experiment is not None:
            extra["experiment"] = {"id": experiment.experiment.id, "profile": experiment.profile,
                                   "options": _lever_options(experiment), "batches": batches}  # fmt: skip
        if price is not None:  # no price given: nothing about cost
            extra["cost"] = cost[0].to_dict() if cost[0] else {"usd_per_gpu_hour": price, "cost_usd": None,
                                                               "why_not": cost[1]}  # fmt: skip
        print(json.dumps({**plan.to_dict(), **extra}))
    else:
        if experiment is not None:
            print(f"{experiment.experiment.id} on the {experiment.profile} profile, as it runs: {experiment.recipe_path}"
                  f"{_words(_lever_options(experiment))}")  # fmt: skip
        _print_table(plan)
        if getattr(args, "time", False):
            _print_time(time_plan, time_note, batches)
        if price is not None:
            print(f"  cost: {cost[0].words() if cost[0] else cost[1]}")
    return 0


def _price(args: argparse.Namespace) -> float | None:
    value = getattr(args, "usd_per_gpu_hour", None)
    if value is None:
        return None
    try:
        return checked_price(value)
    except ValueError as err:
        raise PlanError(str(err)) from None


def run_steps(recipe: Mapping[str, Any], run: ResolvedRun | None, *, quick: bool | None = None) -> tuple[int | None, str]:
    """An experiment's steps as the lab settles them (``lab.settled_overrides``), else the recipe's ``max_steps``."""
    from lab_helpers.training.quick_mode import quick_from_env, quick_overrides

    if run is None:
        steps = (recipe.get("train") or {}).get("max_steps")
        return (int(steps), "the recipe's max_steps") if steps else (None, "the recipe sets no max_steps")
    quick = quick_from_env() if quick is None else quick
    train = run.train_with(dict(run.overrides))
    words = "the recipe's max_steps"
    stopping_rule = not run.experiment.distributed
    short = quick_overrides(train, run.world_size, stopping_rule=stopping_rule) if quick else {}
    if short:  # {}: the recipe's run is already as short as a quick one
        train = run.train_with({**run.overrides, **short})
        words = ("at most: quick mode's cap; its stopping rule usually ends the run sooner" if stopping_rule
                 else "quick mode's fixed count")  # fmt: skip
    steps = train.get("max_steps") or (1 if run.experiment.distributed else None)  # the Lightning script: or 1
    return (int(steps), words) if steps else (None, "the run trains by epochs (no max_steps)")


def run_cost(
    time_plan: TimePlan | None, recipe: Mapping[str, Any], run: ResolvedRun | None, gpus: int,
    usd_per_gpu_hour: float | None, *, quick: bool | None = None,
) -> tuple[RunCost | None, str]:
    """The training steps only: launch, loading and the record are not predicted. A simulated rank sends nothing."""
    if time_plan is None:
        return None, "not predicted (no step time)"
    steps, words = run_steps(recipe, run, quick=quick)
    if steps is None:
        return None, f"not predicted: {words} (the cost of one optimizer step: {time_plan.step_s:.3g} s)"
    step_s = time_plan.step_s
    simulated = ""
    if run is not None and run.simulated_world_size:
        step_s, simulated = step_s - time_plan.communication_s, ", a simulated rank: no communication"
    what = (f"predicted: {steps} optimizer steps ({words}) x {step_s:.3g} s{simulated}; the training steps only, "
            "launch and loading not predicted")  # fmt: skip
    return RunCost(steps * step_s, gpus, what, usd_per_gpu_hour), ""


def _print_time(time_plan: TimePlan | None, time_note: str, batches: dict[str, Any] | None) -> None:
    print(f"  time: {time_plan.summary() if time_plan else time_note}")
    if time_plan is None:
        return
    if time_plan.split():
        print(f"  time: {time_plan.split()}")
    print(f"  time: {time_plan.terms()}")
    if batches:
        print(f"  batches: {batches['words']}")
    for note in time_plan.notes:
        print(f"  time note: {note}")
    for part, source in time_plan.sources.items():
        print(f"  source: {part}: {source}")


def _words(options: dict[str, Any]) -> str:
    return " with " + ", ".join(f"{key} {value}" for key, value in options.items()) if options else ""


# ------------------------------------------------------------------------------------------------ experiments


REFUSED_WITH_EXPERIMENT = ("devices", "strategy", "offload_optimizer", "data_max_len", "batch_order")
"""An experiment is planned as it runs; ``--set`` changes it the way ``run --set`` does."""


def _experiment_run(
    args: argparse.Namespace, default_profile: Callable[[], str] | None, *, simulate_world: int | None = None
) -> ResolvedRun | None:
    from lab_helpers.config.experiments import load_experiments, parse_set_args, resolve

    name = args.recipe
    if Path(name).is_file():
        if getattr(args, "profile", None):
            raise PlanError(f"--profile picks an experiment's recipe; {name} is a recipe file")
        return None
    known = load_experiments()
    if name not in known and (Path(name).suffix in (".yaml", ".yml") or "/" in name):
        raise PlanError(f"recipe file not found: {name}")
    if name not in known:
        raise PlanError(f"{name!r} is neither a recipe file nor an experiment id{did_you_mean(name, known)}")
    for flag in REFUSED_WITH_EXPERIMENT:
        if getattr(args, flag, None) not in (None, False):
            raise PlanError(f"--{flag.replace('_', '-')} belongs to a recipe file: {name} is planned as it runs")
    profile = getattr(args, "profile", None) or (default_profile() if default_profile else "ci")
    return resolve(name, profile, parse_set_args(args.overrides), check_files=False, simulate_world=simulate_world)


def experiment_time(
    exp_id: str, *, profile: str, sets: Sequence[str] = (), gpu_name: str | None = None
) -> tuple[TimePlan | None, str, dict[str, Any] | None]:
    """``plan EXPERIMENT --time`` for a notebook; ``sets`` are ``--set`` pairs."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    gpu = ["--gpu-name", gpu_name] if gpu_name else []
    args = parser.parse_args([exp_id, "--profile", profile, "--time", *gpu, *(f"--set={pair}" for pair in sets)])
    run = _experiment_run(args, None)
    recipe, spec = _experiment_spec(run, args)
    return _time(spec, args, recipe, run)


def experiment_cost(
    exp_id: str, *, profile: str, sets: Sequence[str] = (), simulate_world: int | None = None,
    usd_per_gpu_hour: float | None = None, quick: bool | None = None,
) -> tuple[RunCost | None, str]:
    """``plan EXPERIMENT --time --usd-per-gpu-hour`` for a notebook; without a price, the GPU-hours only."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([exp_id, "--profile", profile, "--time", *(f"--set={pair}" for pair in sets)])
    run = _experiment_run(args, None, simulate_world=simulate_world)
    recipe, spec = _experiment_spec(run, args)
    time_plan, why, _ = _time(spec, args, recipe, run)
    cost = run_cost(time_plan, recipe, run, run.ranks_run, usd_per_gpu_hour, quick=quick)
    return cost if cost[0] else (None, why or cost[1])


def _experiment_spec(run: ResolvedRun, args: argparse.Namespace) -> tuple[dict[str, Any], TrainingSpec]:
    """On the device the profile trains on, unless ``--device``."""
    from lab_helpers.config.experiments import check_profile
    from lab_helpers.planning.predict import planner_inputs

    device = args.device
    if device is None:
        import torch

        device = "cuda" if check_profile(run.profile).get("needs_cuda") or torch.cuda.is_available() else "cpu"
    inputs = planner_inputs(run, _gpu_memory_gib(args), device=device)
    recipe = inputs.pop("recipe")
    return recipe, spec_from_recipe(recipe, **inputs)


def _lever_options(run: ResolvedRun) -> dict[str, Any]:
    keys = ("compile", "compile_mode", "pad_multiple", "attention_backend", "batch_order")
    return {key: run.options[key] for key in keys if run.options.get(key) not in (None, "default", "shuffle")}


def experiment_levers(run: ResolvedRun, device: str) -> Levers:
    """Compiled blocks' launches are measured on the experiment's ci model on this CPU, and kept on disk."""
    from lab_helpers.config.experiments import resolve
    from lab_helpers.config.recipe_defaults import CUDA_GRAPH_MODES
    from lab_helpers.planning.compile_launches import compiled_block
    from lab_helpers.planning.planner.levers import Levers
    from lab_helpers.planning.predict import planner_inputs

    options = run.options
    compiled = None
    if options.get("compile"):
        twin = resolve(run.experiment.id, "ci", run.overrides, check_files=False)  # the ci profile's model
        inputs = planner_inputs(twin, None, device="cpu")
        try:
            compiled = compiled_block(spec_from_recipe(inputs.pop("recipe"), **inputs))
        except PlanError as err:
            raise PlanError(f"the compile factor is measured on the ci profile's model: {err} "
                            "(python -m lab_helpers prepare --profile ci)") from None  # fmt: skip
    return Levers(
        compiled=compiled,
        cuda_graphs=compiled is not None and options.get("compile_mode") in CUDA_GRAPH_MODES and device == "cuda",
        attention_backend=options.get("attention_backend"),
    )


def padded_pass(batches: BatchPadding, pad_multiple: int | str | None, limit: int) -> tuple[list[int], int]:
    """Padded as the training process pads (``recipe_defaults.padded_length``)."""
    from lab_helpers.config.recipe_defaults import padded_length

    lengths = [padded_length(n, pad_multiple, limit) for n in batches.batch_lengths]
    samples = [padded // n for padded, n in zip(batches.batch_tokens_padded, batches.batch_lengths, strict=True)]
    return lengths, sum(k * n for k, n in zip(samples, lengths, strict=True))


def _batches(batches: BatchPadding, pad_multiple: int | str | None, limit: int) -> tuple[list[int], dict[str, Any]]:
    lengths, padded = padded_pass(batches, pad_multiple, limit)
    how = f", padded to a multiple of {pad_multiple}" if isinstance(pad_multiple, int) else (
        ", padded to the longest sample" if pad_multiple else "")  # fmt: skip
    summary = {
        "batch_order": batches.batch_order,
        "pad_multiple": pad_multiple,
        "micro_batches": len(lengths),
        "distinct_lengths": len(set(lengths)),
        "tokens": batches.tokens,
        "tokens_padded": padded,
        "padding_pct": 100 * (padded - batches.tokens) / padded,
    }
    summary["words"] = (
        f"one pass of the sampler ({batches.batch_order}{how}): {len(lengths)} micro-batches of "
        f"{len(set(lengths))} distinct lengths, {padded:,} padded tokens for {batches.tokens:,} real "
        f"({summary['padding_pct']:.1f} % padding)"
    )
    return lengths, summary


def _checked_recipe(args: argparse.Namespace, strategy: str | None) -> tuple[dict[str, Any], int]:
    """Checked as ``run`` checks an experiment's: one message for one mistake, whichever command meets it."""
    from lab_helpers.config.experiments import apply_overrides, parse_set_args
    from lab_helpers.config.recipe_check import check_recipe, recipe_command

    as_written = load_recipe(args.recipe)
    recipe = apply_overrides(as_written, parse_set_args(args.overrides))
    devices = args.devices if args.devices is not None else recipe.get("devices", 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise PlanError(f"recipe says devices: {devices}; pass --devices N so the plan knows how many GPUs")
    num_nodes = recipe.get("num_nodes", 1)
    check_recipe(
        recipe,
        recipe_command(recipe),
        devices=devices,
        num_nodes=num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else 1,
        examples=as_written,
        litgpt_script=strategy in (None, "single"),
    )
    return recipe, devices


def _gpu_memory_gib(args: argparse.Namespace) -> float | None:
    """--gpu-memory-gib, else the size of the GPU --gpu-name names, else None: this node's GPU."""
    from lab_helpers.hardware.gpu_peaks import find_gpu, known_gpus, nominal_memory_gib

    name = getattr(args, "gpu_name", None)
    if name is not None and find_gpu(name) is None:
        raise PlanError(f"--gpu-name {name!r}: the lab has no dense peak for it; it knows: {', '.join(known_gpus())}")
    if args.gpu_memory_gib is not None or name is None:
        return args.gpu_memory_gib
    return nominal_memory_gib(name)


def predict_step_time(spec: TrainingSpec, *, gpu_name: str | None = None, **options: Any) -> TimePlan:
    """With what the time model cannot know itself: this GPU, the records to fit MFU to, this CPU's rates."""
    from lab_helpers.hardware.cpu_speed import measure_cpu_rates
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.planning.launch_cost import measured_launch_cost
    from lab_helpers.planning.planner.timing import predict_time
    from lab_helpers.record.records import lab_and_reference_records

    this_node = None
    if spec.device != "cpu":
        gpus = describe_node().get("gpus") or []
        this_node = gpus[0].get("name") if gpus else None
        gpu_name = gpu_name or this_node
    needs_cpu = spec.device == "cpu" or spec.offload_optimizer
    if spec.device != "cpu" and gpu_name and gpu_name == this_node and "launch_cost_s" not in options:
        cost, source = measured_launch_cost(gpu_name)  # this node's own figure, where it was measured
        if cost is not None:
            options = {**options, "launch_cost_s": cost, "launch_cost_source": source}
    return predict_time(
        spec,
        gpu_name=gpu_name,
        records=lab_and_reference_records(),
        cpu_rates=measure_cpu_rates() if needs_cpu else None,
        **options,
    )


def _time(
    spec: TrainingSpec, args: argparse.Namespace, recipe: dict[str, Any], run: ResolvedRun | None = None
) -> tuple[TimePlan | None, str, dict[str, Any] | None]:
    """A plan without a known GPU still prints its memory. An experiment's micro-batches are those quick mode's
    sampler makes (``data_lengths.batch_padding``), each timed at its own padded length."""
    from lab_helpers.hardware.bandwidth import measured_link_gbs
    from lab_helpers.training.data_lengths import batch_padding, read_sample_lengths, recipe_sample_lengths

    gpu_name = getattr(args, "gpu_name", None)
    link_gbs, link_source = getattr(args, "link_gbs", None), "--link-gbs"
    if link_gbs is None and spec.devices > 1:
        link_gbs, link_source = measured_link_gbs("cpu" if spec.device == "cpu" else gpu_name)
    path = getattr(args, "sample_lengths", None)
    if path:
        lengths, lengths_note = read_sample_lengths(path), ""
    else:
        lengths, lengths_note = recipe_sample_lengths(recipe)
    order = getattr(args, "batch_order", None) or (run.options.get("batch_order") or "shuffle" if run else None)
    batches, summary, padded = None, None, None
    if order and lengths:
        batches = batch_padding(lengths, micro_batch_size=spec.micro_batch_size, batch_order=order,
                                max_seq_length=spec.seq_len)  # fmt: skip
        padded = list(batches.batch_lengths)
        if run is not None:
            limit = min(max(lengths), spec.seq_len)  # the longest training sample, as litgpt cuts it
            padded, summary = _batches(batches, run.options.get("pad_multiple"), limit)
    gpu_note = ""
    if run is not None and gpu_name is None and spec.device == "cuda":
        gpu_name, gpu_note = _gpu_for_experiment()
    try:
        levers = experiment_levers(run, spec.device) if run is not None else None
        plan = predict_step_time(
            spec, gpu_name=gpu_name, sample_lengths=lengths, link_gbs=link_gbs, link_gbs_source=link_source or "",
            batch_lengths=padded, levers=levers,
        )  # fmt: skip
    except PlanError as err:
        return None, f"not predicted ({err})", None
    if batches and run is None:
        lengths_note = (
            f"mean padded length {plan.seq_len} tokens over the {batches.micro_batches} {order} micro-batches quick "
            f"mode makes of {len(lengths)} samples: {batches.padding_pct:.1f}% of their padded tokens are padding"
        )
    elif summary:
        lengths_note = f"mean padded length {plan.seq_len} tokens over the pass's micro-batches (batches)"
    plan.notes.append(lengths_note or f"mean padded length {plan.seq_len} tokens from {len(lengths)} samples' lengths")
    if gpu_note:
        plan.notes.append(gpu_note)
    return plan, "", summary


def _gpu_for_experiment() -> tuple[str | None, str]:
    """Without a GPU here, the one most records ran on, whose figures the time model is fitted to."""
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.record.records import lab_and_reference_records

    if describe_node().get("gpus"):
        return None, ""
    profiled = Counter(
        record.get("device_name") for record in lab_and_reference_records() if record.get("torch_profile_summary")
    )
    profiled.pop(None, None)
    if not profiled:
        return None, ""
    gpu = profiled.most_common(1)[0][0]
    return gpu, f"no GPU here: timed on the {gpu}, the GPU of the records with profiles (--gpu-name names another)"


def _run_fit(spec: TrainingSpec, args: argparse.Namespace) -> int:
    from lab_helpers.planning.planner.fit import DEFAULT_MARGIN, fit

    gpu_memory_gib = _gpu_memory_gib(args)
    if gpu_memory_gib is None and spec.gpu_memory_gib is None:  # the planner probes nothing: this node's GPU
        from lab_helpers.hardware.node import this_gpu_memory_gib

        gpu_memory_gib = this_gpu_memory_gib()
    result = fit(
        spec,
        gpu_memory_gib=gpu_memory_gib,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        max_micro_batch_size=args.max_micro_batch,
    )
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print("\n".join(result.lines()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_helpers plan", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
