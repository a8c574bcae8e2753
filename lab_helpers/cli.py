"""``python -m lab_helpers``: the command line over the same API the notebooks call.

prepare  --profile ci|gpu [--random-weights]   build (ci) or download/check (gpu) what a profile needs
run      ID --profile P [--set key=value ...]    run one experiment and record it
run-all  --section single|multi --profile P     every experiment of a section, then the comparison
results  [--format json|csv]                    every record
plan     RECIPE.yaml|ID [--profile P] [...]     predict memory before a run (--time: step time)
bandwidth [--ranks N]                           measure the bus bandwidth between GPUs (gloo on a CPU)
launch-cost [--device cuda|cpu]                 measure the host's cost per kernel launch (plan --time)
doctor   [--json]                               what this node can run
compare  [--out DIR] [--reference NAME] [--markdown] [--wide] [--pairs] [--usd-per-gpu-hour PRICE]
                                                the comparison table and figure files (PRICE: a cost column)
answers  --reference NAME [--notebook NN]         every notebook question answered from a reference (instructors)
wheelhouse --python 3.12 --dest DIR [--with qlora|notebooks]  the wheels an offline GPU node needs
"""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from collections.abc import Sequence

from lab_helpers.config.experiments import PROFILES, SECTIONS, LabConfigError
from lab_helpers.record.records import RecordWriteError


def _add_profile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="hardware profile (default: $LAB_PROFILE, else gpu with CUDA, ci without)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab_helpers", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prepare = sub.add_parser("prepare", help="build (ci) or download and check (gpu) the models and data")
    _add_profile(prepare)
    prepare.add_argument(
        "--random-weights",
        action="store_true",
        help="gpu profile without hub access: random-weight checkpoints of the real architectures and generated data",
    )
    prepare.add_argument("--force", action="store_true", help="rebuild even if already built")
    prepare.add_argument(
        "--models",
        default=None,
        metavar="KEYS",
        help="gpu profile: only these models, comma-separated (1b,3b,7b,13b); default: all four (~49 GB)",
    )

    _add_run_command(sub)

    run_all = sub.add_parser("run-all", help="run every experiment of a section, then write the comparison")
    run_all.add_argument("--section", choices=SECTIONS, default="single")
    _add_profile(run_all)
    run_all.add_argument("--quiet", action="store_true")
    run_all.add_argument("--quick", action="store_true", help="each run only until its peak memory and a steady step time")

    results = sub.add_parser("results", help="print every record")
    results.add_argument("--format", choices=("json", "csv"), default="json")

    merge = sub.add_parser("merge-records")  # no help: unlisted, the old name of what every command does now
    merge.add_argument("file", nargs="?", help=argparse.SUPPRESS)

    export = sub.add_parser("export-reference", help="add records to the reference results, one file per GPU")
    export.add_argument(
        "name",
        nargs="?",
        default=None,
        help="reference_results/NAME.jsonl (default: named after the records' GPU, e.g. h100-80gb, h200-141gb; "
        "needed for records without a GPU, e.g. ci-cpu)",
    )
    _add_profile(export)
    export.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="FILE",
        help="every record of FILE (e.g. the runs.jsonl a GPU chunk brought back) instead of the latest of $LAB_RESULTS",
    )
    export.add_argument("--note", default="", help="how the runs were made (command, GPU, random weights)")
    export.add_argument(
        "--force",
        action="store_true",
        help="add records to a file that holds another profile's or GPU's (refused otherwise: ci records never "
        "land in the shipped h100-80gb.jsonl by a mistyped NAME)",
    )

    compare = sub.add_parser("compare", help="write the comparison table and plots")
    compare.add_argument("--out", default=None, help="folder for the figure files (default: results/figures)")
    compare.add_argument("--reference", default=None, metavar="NAME",
                         help="compare a shipped reference file (reference_results/NAME.jsonl) instead of your runs")
    compare.add_argument("--markdown", action="store_true", help="print the headline columns as a Markdown table")
    compare.add_argument("--wide", action="store_true", help="print every column (default: what fits the terminal)")
    compare.add_argument("--pairs", action="store_true",
                         help="the lesson pairs side by side: steady times, first-seen lengths, change, noise, verdict")
    compare.add_argument("--usd-per-gpu-hour", default=None, metavar="PRICE",
                         help="add cost_usd: each run's wall_s (launch to exit) x the GPUs it held x PRICE, your "
                         "lease's US dollars per GPU-hour (no default: without it, no cost)")

    answers = sub.add_parser("answers", help="instructors: every notebook question, answered from a reference's records")
    answers.add_argument("--reference", required=True, metavar="NAME", help="reference_results/NAME.jsonl, e.g. h100-80gb")
    answers.add_argument("--notebook", default=None, metavar="NN", help="only this notebook's questions, e.g. 01")
    answers.add_argument("--markdown", action="store_true", help="Markdown headings and bold labels")

    minutes = sub.add_parser("minutes", help="each notebook's predicted minutes on this node, and the whole path's")
    minutes.add_argument("--profile", default=None, help="gpu or ci (default: $LAB_PROFILE, else what this node runs)")
    minutes.add_argument("--path", default=None, choices=("all", "core"),
                         help="which runs 01 makes (default: $LAB_PATH, else all); the table shows both")  # fmt: skip

    plan = sub.add_parser("plan", help="predict peak memory of a litgpt recipe before running it")
    try:
        from lab_helpers.present.plan_command import add_arguments as add_plan_arguments

        add_plan_arguments(plan)
    except ImportError:  # the planner is optional at import time; the subcommand then says so
        pass

    bandwidth = sub.add_parser(
        "bandwidth",
        help="measure all-reduce and all-gather bus bandwidth between this node's GPUs (NCCL), or over gloo on a "
        "CPU; plan --time uses it here",
    )
    bandwidth.add_argument("--ranks", type=int, default=None, help="processes (default: every GPU; 2 on a CPU)")
    bandwidth.add_argument("--size-mib", type=float, default=None, help="tensor size per collective (256 GPU, 16 CPU)")

    launch_cost = sub.add_parser(
        "launch-cost",
        help="measure this node's host cost per kernel launch (a tiny model's training steps); plan --time uses it here",
    )
    launch_cost.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where there is one")

    doctor = sub.add_parser("doctor", help="what this node has and which lab sections it can run")
    from lab_helpers.present.doctor import add_arguments as add_doctor_arguments

    add_doctor_arguments(doctor)

    wheelhouse = sub.add_parser("wheelhouse", help="collect the wheels an offline GPU node needs beyond its torch")
    from lab_helpers.assets.wheelhouse import add_arguments as add_wheelhouse_arguments

    add_wheelhouse_arguments(wheelhouse)
    return parser


def _add_run_command(sub) -> None:
    """The ``run`` command: one experiment, its overrides, and how it runs (quick, simulated, limited, profiled)."""
    run = sub.add_parser(
        "run",
        help="run one experiment and record it",
        epilog=_experiment_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("experiment", metavar="ID", help="an experiment id (listed below)")
    _add_profile(run)
    run.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE", help="override a recipe key")
    run.add_argument("--quiet", action="store_true", help="progress bar and result only, no training output")
    run.add_argument("--quick", action="store_true", help="only until the peak memory and a steady step time are measured")
    run.add_argument(
        "--simulate-world",
        type=int,
        metavar="N",
        default=None,
        help="multi-GPU experiments: run rank 0 of N ranks alone on this one device (torch's fake process group): "
        "its memory measured, its time without communication",
    )
    run.add_argument(
        "--time-limit",
        metavar="SECONDS",
        default=None,
        help="end the run as `timeout` after this many seconds (0: no limit; default: from the recipe, or $LAB_TIME_LIMIT_S)",
    )
    run.add_argument(
        "--trace-steps",
        type=int,
        default=None,
        metavar="N",
        help="a torch.profiler trace of N optimizer steps after warm-up, with a summary (off by default; the run "
        "gets N + 1 more steps)",
    )
    run.add_argument("--profile-steps", type=int, default=None, dest="old_profile_steps", help=argparse.SUPPRESS)


def _experiment_list(width: int = 100) -> str:
    """The experiment ids by section, each with what it teaches, for ``run --help``: the ids live in
    configs/experiments/*.yaml, so ``--help`` is where a user finds them without opening a file. A broken
    experiment file still leaves ``--help`` working: the error is what the run itself would say."""
    from lab_helpers.config.experiments import load_experiments

    try:
        experiments = load_experiments()
    except (LabConfigError, OSError, ValueError) as exc:
        return f"experiments: cannot list them ({exc})"
    lines = ["experiments (ID), by section (configs/experiments/<section>.yaml):"]
    pad = max((len(e) for e in experiments), default=0) + 2
    for section in SECTIONS:
        ids = [e for e in experiments.values() if e.section == section]
        if ids:
            lines.append(f"  {section}:")
        for experiment in ids:
            teaches = " ".join(str(experiment.teaches).split())
            room = width - pad - 4
            line = experiment.id.ljust(pad) + (teaches if len(teaches) <= room else teaches[: room - 3] + "...")
            lines.append(f"    {line}".rstrip())
    return "\n".join(lines)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from lab_helpers.assets.prepare import prepare
    from lab_helpers.lab import default_profile

    models = [key.strip() for key in args.models.split(",") if key.strip()] if args.models else None
    prepare(args.profile or default_profile(), random_weights=args.random_weights, force=args.force, models=models)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from lab_helpers.lab import run_experiment
    from lab_helpers.launch.time_limit import parse_time_limit

    limit_s = None if args.time_limit is None else parse_time_limit(args.time_limit)
    renamed = {} if args.old_profile_steps is None else {"profile_steps": args.old_profile_steps}
    records = run_experiment(
        args.experiment,
        profile=args.profile,
        overrides=args.overrides or [],
        echo=not args.quiet,
        quick=True if args.quick else None,
        time_limit_s=limit_s,
        simulate_world=args.simulate_world,
        trace_steps=args.trace_steps,
        **renamed,  # --profile-steps: the old name of --trace-steps, said once
    )
    return 0 if all(r["status"] in ("ok", "skipped", "oom") for r in records) else 1


def _cmd_run_all(args: argparse.Namespace) -> int:
    from lab_helpers.lab import default_profile, run_all

    profile = args.profile or default_profile()
    records = run_all(section=args.section, profile=profile, echo=not args.quiet, quick=True if args.quick else None)
    _print_comparison(None, profile)
    failed = [r["experiment"] for r in records if r["status"] in ("error", "interrupted", "timeout")]
    if failed:
        print(f"failed: {', '.join(sorted(set(failed)))}", file=sys.stderr)
    return 1 if failed else 0


def _print_comparison(
    out_dir: str | None,
    profile: str | None = None,
    *,
    reference: str | None = None,
    markdown: bool = False,
    wide: bool = False,
    usd_per_gpu_hour: float | None = None,
) -> None:
    """The comparison table on stdout, the figures (and a CSV of the table) in the figures folder; with
    ``usd_per_gpu_hour``, its measured cost column (``tables.comparison_table``) in all three."""
    from lab_helpers.present import figure_files, figures, tables
    from lab_helpers.record.records import load_results

    frame = load_results() if reference is None else tables.load_reference(reference)
    out_dir = figures.figures_folder(out_dir, frame)  # one line and exit 2 before anything is printed
    if reference is not None:
        print(tables.reference_label(frame))
    table = tables.comparison_table(frame, profile=profile, usd_per_gpu_hour=usd_per_gpu_hour)
    if markdown:
        print(tables.markdown_table(table))
    else:
        from lab_helpers.present.table_display import terminal_table

        print(terminal_table(table, wide=wide) if len(table) else "no runs recorded yet")
        if note := tables.steady_notes(table):
            print(note)
        if usd_per_gpu_hour is not None and len(table):
            print(tables.cost_note(usd_per_gpu_hour))
    paths = figures.save_all(frame, out_dir, profile=profile)
    if len(table) and paths:
        paths.insert(0, figure_files.save_table(table, out_dir))
    for path in paths:
        print(f"wrote {path}")


def _cmd_results(args: argparse.Namespace) -> int:
    from lab_helpers.record.records import load_results, write_records_json

    if args.format == "json":
        write_records_json(sys.stdout)  # json.dumps(read_records(), indent=1), a record at a time
        print()
    else:
        load_results().to_csv(sys.stdout, index=False)
    return 0


def _cmd_merge_records(args: argparse.Namespace) -> int:
    from lab_helpers.launch.runner import say
    from lab_helpers.record.store import INDEX_COMMAND

    say(f"lab: merge-records is now `{INDEX_COMMAND}`: every lab command adds to runs.jsonl what it lacks, from the "
        "run folders and their copies off a failed disk (done above, if anything was missing)", file=sys.stderr)  # fmt: skip
    return 0


def _compare_price(args: argparse.Namespace) -> float | None:
    """compare's ``--usd-per-gpu-hour`` checked (``cost.checked_price``: one line naming the flag), or None."""
    if args.usd_per_gpu_hour is None:
        return None
    from lab_helpers.planning.cost import checked_price

    try:
        price = checked_price(args.usd_per_gpu_hour)
    except ValueError as exc:
        raise LabConfigError(str(exc)) from None
    if args.pairs:
        raise LabConfigError("--usd-per-gpu-hour prices the comparison table's runs; --pairs compares step times")
    return price


def _cmd_compare(args: argparse.Namespace) -> int:
    price = _compare_price(args)
    if args.reference is not None:
        from lab_helpers.config.experiments import LabConfigError
        from lab_helpers.config.paths import reference_dir
        from lab_helpers.present.tables import reference_stem, shipped_references

        shipped = shipped_references()
        if reference_stem(args.reference) not in shipped:
            raise LabConfigError(f"--reference {args.reference}: no such file in {reference_dir()}; shipped: "
                                 + (", ".join(shipped) or "none"))  # fmt: skip
    if args.pairs:
        from lab_helpers.present.speed_pairs import pairs_text
        from lab_helpers.present.tables import load_reference
        from lab_helpers.record.records import load_results

        frame = load_results() if args.reference is None else load_reference(args.reference)
        print(pairs_text(frame.to_dict("records"), markdown=args.markdown))
        return 0
    _print_comparison(args.out, reference=args.reference, markdown=args.markdown, wide=args.wide,
                      usd_per_gpu_hour=price)  # fmt: skip
    return 0


def _cmd_minutes(args: argparse.Namespace) -> int:
    from lab_helpers import node_plan
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.lab import default_profile
    from lab_helpers.present import lease

    node, profile = describe_node(), args.profile or default_profile()
    print("predicting each notebook's runs on this node...", file=sys.stderr, flush=True)
    print(node_plan.lease_table(node, profile=profile, path=args.path).to_string(index=False))
    print(lease.table_note(profile))
    return 0


def _cmd_answers(args: argparse.Namespace) -> int:
    from lab_helpers.present.answers import report

    print(report(args.reference, notebook=args.notebook, markdown=args.markdown))
    return 0


def _cmd_export_reference(args: argparse.Namespace) -> int:
    from lab_helpers.lab import default_profile
    from lab_helpers.record.reference import export_references

    profile = args.profile or (None if args.source else default_profile())  # --from: the file's one profile
    for exported in export_references(args.name, profile=profile, note=args.note, source=args.source, force=args.force):
        print(exported.line())
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from lab_helpers.lab import default_profile
    from lab_helpers.present.plan_command import run as run_plan

    return run_plan(args, default_profile=default_profile)


def _cmd_bandwidth(args: argparse.Namespace) -> int:
    from lab_helpers.config.paths import results_dir
    from lab_helpers.hardware.bandwidth import measure, save
    from lab_helpers.launch.run_lock import one_run_at_a_time

    size = None if args.size_mib is None else int(args.size_mib * 2**20)
    try:
        with one_run_at_a_time("bandwidth", results_dir()):  # a run beside it would share the GPUs' links
            result = measure(world_size=args.ranks, size_bytes=size)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    print(f"recorded in {save(result)}")
    return 0


def _cmd_launch_cost(args: argparse.Namespace) -> int:
    from lab_helpers.config.paths import results_dir
    from lab_helpers.launch.run_lock import one_run_at_a_time
    from lab_helpers.planning.launch_cost import measure, save

    with one_run_at_a_time("launch-cost", results_dir()):  # a run beside it would share the host's cores
        result = measure(device=args.device)
    print("\n".join(result.lines()))
    print(f"recorded in {save(result)}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from lab_helpers.present.doctor import run as run_doctor

    return run_doctor(args)


def _cmd_wheelhouse(args: argparse.Namespace) -> int:
    from lab_helpers.assets.wheelhouse import run as run_wheelhouse

    return run_wheelhouse(args)


COMMANDS = {
    "prepare": _cmd_prepare,
    "run": _cmd_run,
    "run-all": _cmd_run_all,
    "results": _cmd_results,
    "merge-records": _cmd_merge_records,
    "compare": _cmd_compare,
    "export-reference": _cmd_export_reference,
    "answers": _cmd_answers,
    "minutes": _cmd_minutes,
    "plan": _cmd_plan,
    "bandwidth": _cmd_bandwidth,
    "launch-cost": _cmd_launch_cost,
    "doctor": _cmd_doctor,
    "wheelhouse": _cmd_wheelhouse,
}


RECOVERING = ("results", "compare", "export-reference", "run-all", "merge-records")
"""The commands that first add to the index what it lacks (``recovery``); ``run`` does so in ``lab.run_experiment``."""

LOCATIONS = {
    "prepare": ("LAB_CHECKPOINTS", "LAB_DATA"),
    "run": ("LAB_RESULTS", "LAB_CHECKPOINTS", "LAB_DATA"),
    "run-all": ("LAB_RESULTS", "LAB_CHECKPOINTS", "LAB_DATA"),
    "results": ("LAB_RESULTS",),
    "merge-records": ("LAB_RESULTS",),
    "compare": ("LAB_RESULTS",),
    "export-reference": ("LAB_RESULTS",),
}
"""The lab folders (``paths.LOCATION_ENV``) each command reads or writes: each one the user set is checked before
the command starts (``paths.check_locations``: a file, a dangling link, /proc, a name too long, a byte that is not
UTF-8 is one line and exit 2, never a traceback or a late ``litgpt exited with 2``)."""


class OutputError(OSError):
    """Standard output could not take what a command printed (``> /dev/full``, a closed pipe)."""


class _CheckedOutput:
    """sys.stdout, whose failed writes raise OutputError: told apart from any other OSError, so that a full
    ``/dev/full`` is one line and exit 2 while a bug elsewhere still shows its traceback."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _open_standard_streams() -> bool:
    """Point a closed stdin, stdout or stderr at /dev/null -- else the next file the lab opens (runs.jsonl) would
    get its number and take what is printed -- and say whether stdout was open."""
    import os

    stdout_open = True
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            stdout_open = stdout_open and fd != 1
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    return stdout_open and sys.stdout is not None


def main(argv: Sequence[str] | None = None) -> int:
    from lab_helpers.launch.interrupts import end_runs_on_signals
    from lab_helpers.launch.runner import say, silence_stdout

    stdout_open = _open_standard_streams()
    args = build_parser().parse_args(argv)
    if not stdout_open:  # `>&-`: what the command says would go nowhere (or into the next file opened)
        say("error: standard output is closed (>&-): nothing was done; send it to a file or to /dev/null instead",
            file=sys.stderr)  # fmt: skip
        return 2
    sys.stdout = _CheckedOutput(sys.stdout)
    shown_warning, warnings.formatwarning = warnings.formatwarning, _warning_line
    end_runs_on_signals()  # `kill`, a dropped SSH terminal (SIGHUP), ...: the run is ended and recorded
    try:
        from lab_helpers.config.paths import check_locations

        check_locations(LOCATIONS.get(args.command, ()))
        if args.command in RECOVERING:
            from lab_helpers.record.recovery import recover_orphans

            recover_orphans()  # runs whose launcher died before recording them: recorded now, said on stderr
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, not at exit: a full /dev/full is then one line, not "Exception ignored"
        return code
    except LabConfigError as exc:
        from lab_helpers.config.secrets import for_terminal  # a --set value's escape sequence is shown, never acted on

        say(f"error: {for_terminal(str(exc))}", file=sys.stderr)
        return 2
    except RecordWriteError as exc:  # a full disk: the results file is as it was; say so in one line
        say(f"error: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        say(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
        return 130  # the run is recorded, with the signal that ended it
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) or exc.errno in (errno.EPIPE, errno.EIO):
            silence_stdout()  # stdout went away while printing (`| head`): nothing left to say
            return 1
        if isinstance(exc, OutputError):  # `> /dev/full`: what was printed is lost; say so in one line
            silence_stdout()
            say(f"error: standard output could not be written: {exc.strerror}", file=sys.stderr)
            return 2
        raise
    finally:
        warnings.formatwarning = shown_warning
        if isinstance(sys.stdout, _CheckedOutput):
            sys.stdout = sys.stdout._stream


def _warning_line(message, category, filename, lineno, line=None) -> str:  # noqa: ARG001 -- formatwarning's signature
    """A warning on the command line: one line, escaped as errors are, not Python's file, line and source."""
    from lab_helpers.config.secrets import for_terminal

    return f"warning: {for_terminal(str(message))}\n"
