"""Run an experiment of the lab and record it: the one call each notebook cell makes,
``run_experiment("grad-accum", profile="ci")``. Bad input fails before any process starts.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lab_helpers import launch
from lab_helpers.config.experiments import LabConfigError, ResolvedRun, check_run_files, parse_set_args, resolve
from lab_helpers.config.lazy_exports import attach
from lab_helpers.config.paths import absolute_locations, check_locations, lab_home, results_dir
from lab_helpers.launch.run_lock import one_run_at_a_time
from lab_helpers.launch.runner import run_command, say
from lab_helpers.launch.warm_start import WARM_START_ENV
from lab_helpers.launch.warm_start import setting_for as warm_start_setting
from lab_helpers.planning import predict
from lab_helpers.planning.decision import blocked, section_decisions
from lab_helpers.planning.predict import OOM_DEMO_MARGIN, predict_experiment
from lab_helpers.planning.profile_choice import default_profile, profile_problem
from lab_helpers.record.records import append_record
from lab_helpers.record.records import results_path as results_file
from lab_helpers.record.recovery import holding_run, recover_orphans, write_launch
from lab_helpers.record.results_folder import check_results_folder, make_run_folder, remove_if_empty
from lab_helpers.record.run_record import base_record, one_line, records_from, relative_to_results
from lab_helpers.record.store import store_records
from lab_helpers.training.quick_mode import QUICK_ENV, quick_from_env, quick_overrides

__all__ = [  # the module's own names, then the notebooks' names from the layers below (_NOTEBOOK_API)
    "default_profile",
    "run_experiment",
    "run_all",
    "record_skipped",
    "predict_experiment",
    "filled_overrides",
    "OOM_DEMO_MARGIN",
    "LabConfigError",
    "results_dir",
]

# ----------------------------------------------------------------------------------------------- running


def run_experiment(
    exp_id: str,
    *,
    profile: str | None = None,
    overrides: Mapping[str, Any] | list[str] | None = None,
    results_path: Path | None = None,
    echo: bool = True,
    summary: bool = True,
    quick: bool | None = None,
    time_limit_s: float | None = None,
    simulate_world: int | None = None,
    trace_steps: int | None = None,
    **renamed: Any,
) -> list[dict[str, Any]]:
    """``simulate_world=N``: rank 0 of a world of N alone on this device, its memory measured, its time without
    communication. ``quick`` (default ``$LAB_QUICK``) runs until the peak memory and a steady step time are measured.
    ``trace_steps=N`` traces N optimizer steps after warm-up (``torch_trace``).

    A failed or OOM run is a result, not an exception; KeyboardInterrupt comes only once the run is recorded."""
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.launch.interrupts import InterruptShield
    from lab_helpers.launch.time_limit import time_limit_s as run_time_limit_s

    trace_steps = _renamed_trace_steps(trace_steps, renamed)
    # first, creating nothing: a full disk must be one line before resolve() imports what needs a temporary folder
    check_locations()  # LAB_RESULTS, LAB_CHECKPOINTS, LAB_DATA: a file, /proc, a byte litgpt cannot read
    check_results_folder(results_file(results_path), create=False)
    recover_orphans(results_path)  # runs whose launcher died before recording them (once per process)
    node = describe_node()  # once per run: the profile check, the hardware check and the record all use it
    profile = profile or default_profile(node)
    if isinstance(overrides, list):
        overrides = parse_set_args(overrides)
    if problem := profile_problem(profile, node):
        raise LabConfigError(problem)
    asked = resolve(exp_id, profile, overrides, check_files=False, simulate_world=simulate_world)  # files: below
    check_results_folder(results_file(results_path))  # read-only, full, special: one line, nothing created
    quick = quick_from_env() if quick is None else quick
    trace_steps = _trace_steps(trace_steps, asked)
    settled, why = settled_overrides(asked, quick=quick, trace_steps=trace_steps)
    if why and (echo or summary):
        print(why, flush=True)
    run = asked  # what runs: what was asked with every setting the lab adds, resolved once more where it adds one
    if settled != asked.overrides:
        run = resolve(exp_id, profile, settled, check_files=False, simulate_world=simulate_world)
    base = base_record(run, node)
    base["mode"] = "quick" if quick else "full"
    if reason := blocked(run, node):  # the decision's own checks, before a checkpoint is asked for
        return _skip(base, reason, results_path, summary)
    limit_s = run_time_limit_s(profile, run.total_iterations, time_limit_s)
    base.update(predict.prediction_fields(run))
    base["time_limit_s"] = limit_s
    check_run_files(run)
    with one_run_at_a_time(exp_id, results_dir()):  # a run beside another would share its GPUs: refused
        run_dir = make_run_folder(base["run_id"])  # runs/ a real folder, never a link to elsewhere
        command = launch.command(run, run_dir)
        ranks = launch.ranks(run)
        with InterruptShield() as shield, holding_run(run_dir):  # the lock: no recovery takes a live run
            try:
                write_launch(run_dir, base, ranks)  # what a recovery needs, should this launcher die before recording
                outcome = run_command(
                    command,
                    run_dir=run_dir,
                    # the lab's folders made absolute: the child runs in lab_home(), not in this working directory
                    env={
                        QUICK_ENV: "1" if quick else "0",
                        WARM_START_ENV: warm_start_setting(profile),
                        **absolute_locations(),
                        **_trace_env(trace_steps, run_dir),
                    },
                    cwd=lab_home(),
                    total_iters=run.total_iterations,
                    label=exp_id,
                    echo=echo,
                    time_limit_s=limit_s,
                    shield=shield,
                )
            except OSError as exc:  # the run folder or its log could not be made: nothing has started
                remove_if_empty(run_dir)
                raise LabConfigError(f"the run could not start in {run_dir}: {exc.strerror or exc}") from None
            # the disk filled up: the log or the timeline is cut short, the record says so
            base["log_error"] = "; ".join(e for e in (outcome.log_error, outcome.timeline.error) if e) or None
            try:
                records = records_from(run, base, outcome, run_dir, ranks)
            except Exception as exc:  # noqa: BLE001 -- a bug here must not cost a paid-for run its record
                records = [{**base, "status": "error", "reason": f"the lab could not build the record: {exc!r}",
                            "returncode": outcome.returncode, "wall_s": outcome.wall_s,
                            "log_path": relative_to_results(outcome.log_path)}]  # fmt: skip
            try:
                with contextlib.suppress(Exception):  # an earlier run's trouble must not cost this one its record
                    recover_orphans(results_path, once=False)  # what the index lacks goes in first: it ran before
                store_records(records, path=results_path, run_dir=run_dir)  # the run folder, then the index
            finally:  # stored or not, the result was measured: show it (stdout may be gone, `| head`)
                if summary:
                    for record in records:
                        say(one_line(record))
    if outcome.interrupted:
        raise KeyboardInterrupt(f"{exp_id} interrupted; recorded as 'interrupted'")
    if shield.count:
        raise KeyboardInterrupt(f"{exp_id} ended as the interrupt came; recorded as {records[0]['status']!r}")
    return records


RENAMED = {"profile_steps": "trace_steps"}
"""Old keyword -> new: ``profile`` names the hardware profile only; a torch.profiler trace is ``trace``."""


def _renamed_trace_steps(trace_steps: Any, renamed: Mapping[str, Any]) -> Any:
    for old, value in renamed.items():
        if old not in RENAMED:
            raise TypeError(f"run_experiment() got an unexpected keyword argument {old!r}")
        say(f"lab: {old}= is now {RENAMED[old]}= (profile= is the hardware profile)", file=sys.stderr)
        trace_steps = value if trace_steps is None else trace_steps
    return trace_steps


def _trace_steps(steps: Any, run: ResolvedRun) -> int | None:
    from lab_helpers.training.torch_trace import check_steps

    try:
        steps = check_steps(steps)
    except ValueError as exc:
        raise LabConfigError(str(exc)) from None
    if steps and not launch.traces(run):
        raise LabConfigError(f"--trace-steps traces the single-GPU section's runs; {run.experiment.id} runs one "
                             "process per rank under Lightning")  # fmt: skip
    return steps


def settled_overrides(
    asked: ResolvedRun, *, quick: bool = False, trace_steps: int | None = None
) -> tuple[dict[str, Any], str | None]:
    """What was asked plus what the lab adds, each read from the ``train`` section the one before leaves: fill-gpu's
    micro batch, quick mode's shorter run, and ``trace_steps`` + 1 more steps for a profiled run, as the profiled
    steps and the one that stops the profiler are not timed."""
    settled, why = _filled(asked, dict(asked.overrides))
    train = asked.train_with(settled)
    if quick:
        short = quick_overrides(train, asked.world_size, stopping_rule=not asked.experiment.distributed)
        settled = {**settled, **short}
        train = asked.train_with(settled)
    if trace_steps and train.get("max_steps"):
        settled["train.max_steps"] = train["max_steps"] + trace_steps + 1
    return settled, why


def _filled(run: ResolvedRun, given: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``given`` with fill-gpu's micro batch where ``run`` fills the GPU and no micro batch is given, and why."""
    if not run.options.get("fill_gpu"):
        return given, None
    if "train.micro_batch_size" in given:
        return given, f"{run.experiment.id}: micro batch {given['train.micro_batch_size']} as given (not filled)"
    fill, why = predict.fill_gpu_for(run)
    return {**given, **fill}, why


def _trace_env(steps: int | None, run_dir: Path) -> dict[str, str]:
    from lab_helpers.training.torch_trace import DIR_ENV, STEPS_ENV

    return {STEPS_ENV: str(steps), DIR_ENV: str(run_dir / "profile")} if steps else {STEPS_ENV: ""}


def run_all(
    *,
    section: str = "single",
    profile: str | None = None,
    results_path: Path | None = None,
    only: Iterable[str] | None = None,
    echo: bool = True,
    quick: bool | None = None,
) -> list[dict[str, Any]]:
    """A failing experiment is recorded and the next one runs; what runs, and how, is what the notebooks' cells
    decide on this node (``decision.decide``)."""
    from lab_helpers.hardware.node import describe_node

    node = describe_node()
    profile = profile or default_profile(node)
    records: list[dict[str, Any]] = []
    for exp_id, step in section_decisions(section, node, profile=profile, only=only):
        print(f"{exp_id}: {step.sentence}", flush=True)
        if step.runs:
            records.extend(run_experiment(exp_id, profile=profile, overrides=step.overrides,
                                          results_path=results_path, echo=echo, quick=quick,
                                          simulate_world=step.simulate_world))  # fmt: skip
        else:
            records.extend(record_skipped(exp_id, reason=step.sentence, profile=profile, overrides=step.overrides,
                                          results_path=results_path))  # fmt: skip
    return records


def record_skipped(
    exp_id: str,
    *,
    reason: str,
    profile: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    results_path: Path | None = None,
    simulate_world: int | None = None,
) -> list[dict[str, Any]]:
    """A skip is a result like any other: the tables show its reason."""
    run = resolve(exp_id, profile or default_profile(), overrides, check_files=False, simulate_world=simulate_world)
    return _skip({**base_record(run), "mode": "full"}, reason, results_path, summary=True)


def _skip(base: dict[str, Any], reason: str, results_path: Path | None, summary: bool) -> list[dict[str, Any]]:
    record = {**base, "status": "skipped", "reason": reason}
    append_record(record, path=results_path)
    if summary:
        print(f"{record['experiment']}: skipped ({reason})")
    return [record]


# ----------------------------------------------------------------------------------------------- predicting


def filled_overrides(
    exp_id: str, *, profile: str | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str | None]:
    """The notebook asks this before predicting, so the prediction it shows is of the batch the run will use."""
    given = dict(overrides or {})
    return _filled(resolve(exp_id, profile or default_profile(), given, check_files=False), given)


# ---------------------------------------------------------------------------------------------------------------
# The notebooks' one namespace: what their cells call from the layers below, as ``lab.NAME`` or
# ``from lab_helpers.lab import NAME``. Each is imported on first use (PEP 562, as ``planner``'s names are): the CLI
# imports this module for every run and must not pay for pandas or matplotlib.

_NOTEBOOK_API = {
    "activations_missed": "lab_helpers.planning.activations_by_hand.misses",
    "activations_summary": "lab_helpers.planning.activations_by_hand.summary",
    "check_records": "lab_helpers.present.multi_gpu.check_records",
    "closing_text": "lab_helpers.present.commands.closing_text",
    "compare_with_planner": "lab_helpers.planning.activations_by_hand.compare_with_planner",
    "describe_node": "lab_helpers.hardware.node.describe_node",
    "experiment_terms": "lab_helpers.planning.activations_by_hand.experiment_terms",
    "format_report": "lab_helpers.present.doctor.format_report",
    "get_experiment": "lab_helpers.config.experiments.get_experiment",
    "gpu_memory_gib": "lab_helpers.hardware.node.gpu_memory_gib",
    "guess_table": "lab_helpers.present.guesses.guess_table",
    "latest_record": "lab_helpers.present.padding.latest_record",
    "load_experiments": "lab_helpers.config.experiments.load_experiments",
    "load_results": "lab_helpers.record.records.load_results",
    "padding_words": "lab_helpers.present.padding.padding_words",
    "plot_step": "lab_helpers.present.step_memory.plot_step",
    "prepare": "lab_helpers.assets.prepare.prepare",
    "reference_hint": "lab_helpers.planning.node_limits.reference_hint",
    "rank_rows": "lab_helpers.present.multi_gpu.rank_rows",
    "sections_runnable": "lab_helpers.planning.sections.sections_runnable",
    "show_commands": "lab_helpers.present.commands.show_commands",
    "show_prediction": "lab_helpers.present.multi_gpu.show_prediction",
    "summary_lines": "lab_helpers.training.torch_trace.summary_lines",
}


__all__ += sorted(_NOTEBOOK_API)
__getattr__, __dir__ = attach(__name__, _NOTEBOOK_API)
