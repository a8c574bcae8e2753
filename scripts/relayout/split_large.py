#!/usr/bin/env python3
"""Step 5 of issue 44's relayout: no module over 600 lines. Seven modules split at their natural seams.

Each moves whole top-level definitions, found by name, into a new sibling module; a definition main adds later stays
where it is unless named here. Callers (the package, tests, notebooks, benchmarks, monkeypatch targets) import each
name from the module that defines it: no re-exports.

- ``assets/wheelhouse`` (709): the pure functions that decide what a wheelhouse holds -- the lab's requirements and
  pins, the target node, pip's command lines, pip's report and litgpt's caps, what the node already has -- go to
  ``assets/wheel_plan``; the builder that runs pip, trims bitsandbytes and writes the folder, and its CLI, stay.
- ``record/records`` (646): the fallback when the results file takes no record (``store_records``, its places) and
  ``merge_records``, which brings such a file back, go to ``record/fallback``; the results file itself (append
  under a lock, read, the runs' frame) stays. The helpers fallback uses get public names.
- ``launch/warm_start`` (610): the warm server's side (``python -m``, its imports, the fork of each run) goes to
  ``launch/warm_server``; the launcher's side (``WarmStarter``, ``start_process``) stays.
- ``planning/planner/timing`` (950): what the time model takes from measured records -- MFU per device and method
  (the FLOPs model) and the traced model's fitted launch cost and efficiencies -- goes to ``planner/calibration``;
  the model itself (``TimePlan``, ``predict_time``) and ``predicted_vs_measured`` stay.
- ``planning/decision`` (736 on main after issue 43's pairs, once split_decision has run): what a pair compares goes
  to ``planning/pairs`` (added on main after 02bc781: where it is not there, nothing moves) and the micro batch
  search and substitutes to ``planning/micro_batch``.
- ``present/figures`` (599 on main after issue 45's file rule): how the figures are written (``write_figure_file``,
  ``save_table``, the checked folder) goes to ``present/figure_files``; which folder (``figures_dir``, which the
  notebooks call) stays.
- ``planning/planner/tracer`` (568 on main, over 600 once step 5 takes helpers out of ``trace_training``): what the
  trace builds before it runs (model, precision, checkpointing, optimizer) goes to ``planner/trace_setup``.

Run at the root of a checkout (``--check``: only report).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from splitlib import Edit, Part, Split, run  # noqa: E402

# ---------------------------------------------------------------------------------------------- assets/wheelhouse

WHEEL_PLAN = [
    "REPO", "PYPROJECT", "CONSTRAINTS", "OPTIONAL_GROUPS", "GROUP_EXTRAS", "GPU_GROUPS", "NODE_PROVIDES",
    "DEFAULT_GLIBC", "PLACEHOLDER_LOCAL", "IMPORTED_WHEN_PRESENT", "WheelhouseError", "Target",
    "read_pyproject", "extra_requirements", "lab_extras", "lab_requirements", "read_constraints", "pinned_version",
    "deepspeed_wheel_command", "resolve_command", "download_command",
    "Resolved", "parse_report", "caps_of", "check_caps", "placeholder_wheel", "_name",
    "read_node_packages", "left_to_collect", "_specifiers_by_name", "requirements_on_target",
    "node_imported_requirements",
]  # fmt: skip

WHEEL_PLAN_DOC = """\
What a wheelhouse holds, decided by pure functions that ``wheelhouse`` runs pip with (unit-tested offline): the
lab's requirements and pins (pyproject's extras, ``scripts/constraints.txt``), the node the wheels are for
(``Target``: its Python, glibc and platform tags), pip's command lines for the three steps, pip's resolution
report with litgpt's caps read back and checked, the metadata-only torch placeholder, and what the node already
has (``--node-has``) against what is left to collect.
"""

WHEELHOUSE = Split(
    source="lab_helpers.assets.wheelhouse",
    parts=[Part("lab_helpers.assets.wheel_plan", WHEEL_PLAN, WHEEL_PLAN_DOC)],
    edits=[
        Edit(
            "lab_helpers/assets/wheelhouse.py",
            "How, in three pip steps whose command lines are built by the pure functions below (unit-tested offline):",
            "How, in three pip steps whose command lines are built by pure functions (``wheel_plan``, unit-tested "
            "offline):",
        ),
    ],
)

# ------------------------------------------------------------------------------------------------ record/records

FALLBACK = [
    "_DISK_ERRORS", "state_dir", "temp_fallback_dir", "fallback_places", "store_records", "_say", "_device_of",
    "_private_folder", "FALLBACK_NAMES", "_FALLBACK_FILE", "_RUN_FOLDER_FALLBACK", "MergeResult", "merge_records",
    "_not_a_fallback", "_fallback_run_id", "_open_fallback", "_refuse_the_target", "_read_fd", "_fallback_records",
]  # fmt: skip

FALLBACK_DOC = """\
Where a run's records go when the results file takes none, and how they come back.

``store_records`` appends a finished run's records to the results file (``records.append_records``); when that
file's folder or file system takes nothing (a full disk, a read-only mount, a link planted as ``runs.jsonl``), the
records go to a fallback file off that file system -- the run's own folder, ``$XDG_STATE_HOME/lab``, a private
temporary folder -- named by the run, and one line says where and how to merge it back. ``merge_records``
(``python -m lab_helpers merge-records FILE``) appends such a file's records under the results file's lock and
removes it: only a file that is a fallback of one run, never the results file itself or a reference.
"""

RECORDS = Split(
    source="lab_helpers.record.records",
    parts=[Part("lab_helpers.record.fallback", FALLBACK, FALLBACK_DOC)],
    renames={
        "_append_locked": "append_locked",
        "_open_locked": "open_locked",
        "_record_line": "record_line",
        "_scan": "scan_lines",
        "_shown": "short_repr",  # load_results uses it too (on main since issue 45)
    },
    edits=[
        Edit(
            "lab_helpers/record/records.py",
            "opened or written at the end of a run, ``store_records`` puts the record",
            "opened or written at the end of a run, ``fallback.store_records`` puts the record",
        ),
    ],
)

# ---------------------------------------------------------------------------------------------- launch/warm_start

WARM_SERVER = [
    "_MESSAGE_BYTES", "_INTERRUPTED", "_set_command_line", "_inside_stack", "_CudaProbes", "_cuda_driver_loaded",
    "_why_not_fork_safe", "_imported_files", "_changed", "_serve", "_fork_run", "_become_run", "_exit_code",
    "_shutdown", "main",
]  # fmt: skip

WARM_SERVER_DOC = """\
The warm server's side of ``warm_start``: ``python -m lab_helpers.launch.warm_server``, started by a launcher's
``WarmStarter`` and ended with it.

It imports torch, Lightning and litgpt once, says whether a fork of it is safe (nothing touched CUDA, no thread was
started), then forks one run per request: a process in its own session with the run's argv, environment, working
directory and command line, exactly as a cold start would give it, and exits once the launcher closes the socket
and its runs have ended. It imports as little of the lab as it can: each run imports ``lab_helpers`` afresh.
"""

WARM_START = "lab_helpers/launch/warm_start.py"

WARM = Split(
    source="lab_helpers.launch.warm_start",
    parts=[Part("lab_helpers.launch.warm_server", WARM_SERVER, WARM_SERVER_DOC)],
    main_guard="lab_helpers.launch.warm_server",
    renames={"_SERVER_MODULE": "SERVER_MODULE", "_LAUNCHER_PID_ENV": "LAUNCHER_PID_ENV"},
    edits=[
        Edit(
            WARM_START,
            '_SERVER_MODULE = "lab_helpers.launch.warm_start"',
            '_SERVER_MODULE = "lab_helpers.launch.warm_server"',
        ),
        Edit(
            WARM_START,
            '"""``python -m lab_helpers.launch.warm_start CTL_FD PRELOAD,... PADDING``',
            '"""``python -m lab_helpers.launch.warm_server CTL_FD PRELOAD,... PADDING``',
        ),
    ],
)

# ------------------------------------------------------------------------------------------ planning/planner/timing

CALIBRATION = [
    "CPU", "DEFAULT_MFU", "LITGPT_LORA_VS_NF4_MIN", "QLORA_SPEED_RATIO", "MfuEntry", "MFU_TABLE",
    "device_key", "Efficiency", "mfu_for", "MIN_POINTS_FOR_OVERHEAD", "mfu_from_records", "_line", "record_point",
    "_cpu_record_flops", "_clean", "_gpu_name", "_precision", "measured_step", "record_spec",
    "HOST_BOUND_MARGIN", "REPEATED_LENGTH_FIELD", "DeviceEfficiency", "_OPS_CACHE", "traced_ops", "_gpu_rates",
    "_device_s", "_record_ops", "fit_efficiencies", "fit_launch_cost", "traced_model",
]  # fmt: skip

CALIBRATION_DOC = """\
What the time model (``timing``) takes from measured records, and only from them: the figures it fits.

**The FLOPs model's MFU.** ``mfu_for``: fitted to the lab's own records for the device and method
(``mfu_from_records``: MFU and a fixed per-micro-batch overhead by least squares, records of the same precision
first), else ``MFU_TABLE`` (each figure with its source; today ``DEFAULT_MFU``, an assumption labelled as one).

**The traced model's three figures.** ``traced_model``: the per-launch host cost (``fit_launch_cost``: host-bound
records of this GPU, else of any GPU, else a default that says so) and the matmul and bandwidth efficiencies
(``fit_efficiencies``: the device busy time of the records' profiles), each op's cost from the traced step
(``traced_ops``, memoised).

A record's time is its steady one (``measured_step``) and its recipe the TrainingSpec it ran (``record_spec``).
Records are arguments: this module reads no file and probes no hardware.
"""

TIMING = Split(
    source="lab_helpers.planning.planner.timing",
    parts=[
        Part("lab_helpers.planning.planner.calibration", CALIBRATION, CALIBRATION_DOC, later=["host_bound_launch_cost"])
    ],  # fmt: skip
    relative=True,
    renames={"_clean": "without_nan", "_gpu_name": "gpu_name_of"},
)

# ----------------------------------------------------------------------------------- planning/decision, once more

# Main's pairs (experiments compared in pairs run at one micro batch, issue 43, after 02bc781) put decision.py over
# 600 lines even after split_decision: what a pair compares (moved where it is there) and the micro batch search.
PAIRS = ["_Settings", "_settings", "_model_key", "_can_run_at", "_at_micro", "_moved_words", "_pair_clause",
         "_prediction_overrides"]  # fmt: skip
MICRO_BATCH = ["SMALLER_MODEL_SUBSTITUTES", "_largest_micro_batch", "_substitute", "_smaller_models",
               "_named_elsewhere"]  # fmt: skip

PAIRS_DOC = """\
What an experiment and its pair (``pair:`` in configs/experiments) compare: the settings each decided alone runs
with (``PairSettings``), whether one can run at the other's micro batch on this node, that micro batch as
overrides, and the one sentence that says what moved or why the two do not compare here and what to compare
instead. ``decision._paired`` applies them.
"""
MICRO_BATCH_DOC = """\
The micro batch a run fits at on this node, asked of the planner (``largest_micro_batch``: the largest that fits,
keeping the global batch), and the substitute that keeps an experiment's lesson where its own model does not fit
(``lesson_substitute``: QLoRA for LoRA, the same technique on the largest model that fits). ``decision._fit``
applies them.
"""

DECISION = Split(
    source="lab_helpers.planning.decision",
    parts=[
        Part("lab_helpers.planning.pairs", [], PAIRS_DOC, later=PAIRS),
        Part("lab_helpers.planning.micro_batch", MICRO_BATCH, MICRO_BATCH_DOC),
    ],
    renames={
        "_Settings": "PairSettings",
        "_settings": "pair_settings",
        "_model_key": "model_key",
        "_can_run_at": "can_run_at",
        "_at_micro": "at_micro",
        "_moved_words": "moved_words",
        "_pair_clause": "pair_clause",
        "_prediction_overrides": "prediction_overrides",
        "_largest_micro_batch": "largest_micro_batch",
        "_substitute": "lesson_substitute",
        "_smaller_models": "smaller_models",
        "_named_elsewhere": "named_elsewhere",
    },
)

# --------------------------------------------------------------------------------------------- present/figures

FIGURE_FILES_DOC = """\
How the figures are written: the folder created and checked, each file (a PNG, ``comparison.csv``) written, by the
rule of every folder and file the lab writes (``paths.lab_folder``, ``paths.write_lab_file``): a folder or file it
cannot write is one LabConfigError line naming it. Which folder (``figures_dir``) is ``figures``'.
"""

FIGURES = Split(
    source="lab_helpers.present.figures",
    parts=[
        Part(
            "lab_helpers.present.figure_files",
            ["_figures_dir", "_save"],
            FIGURE_FILES_DOC,
            later=["write_figure_file", "save_table"],  # on main since issue 45
        )
    ],
    renames={"_figures_dir": "made_figures_dir", "_save": "save_figure"},
)

# ------------------------------------------------------------------------------------- planning/planner/tracer

TRACE_SETUP_DOC = """\
What the trace builds before it runs the step (``tracer.trace_training``): the model at the run's precision on fake
tensors, its activation checkpointing, the precision contexts of the forward pass, and the optimizer as the recipe
asks for it (``torch_optimizer_kwargs``: the recipe's foreach/fused, else the device's default).
"""

TRACER = Split(
    source="lab_helpers.planning.planner.tracer",
    relative=True,
    parts=[
        Part(
            "lab_helpers.planning.planner.trace_setup",
            [
                "_param_dtype",
                "_precision_contexts",
                "_default_dtype",
                "_to_default_float",
                "_build_model",
                "_make_optimizer",
                "_checkpoint_blocks",
            ],  # fmt: skip
            TRACE_SETUP_DOC,
            later=["torch_optimizer_kwargs"],  # on main since issue 43's optimizer step
        )
    ],
    renames={
        "_precision_contexts": "precision_contexts",
        "_to_default_float": "to_default_float",
        "_build_model": "build_model",
        "_make_optimizer": "make_optimizer",
        "_checkpoint_blocks": "checkpoint_blocks",
    },
)

LIMIT = 600


def check_sizes() -> int:
    """No module of the package over LIMIT lines, or the step fails naming them."""
    over = []
    for path in sorted(Path.cwd().glob("lab_helpers/**/*.py")):
        n = len(path.read_text().splitlines())
        if n > LIMIT:
            over.append(f"{path.relative_to(Path.cwd())} ({n})")
    if over:
        raise SystemExit(f"relayout: still over {LIMIT} lines: {', '.join(over)}; split it here (a Split above)")
    return 0


if __name__ == "__main__":
    status = run(WHEELHOUSE, RECORDS, WARM, TIMING, DECISION, FIGURES, TRACER)
    if status == 0 and "--check" not in sys.argv[1:]:
        check_sizes()
    sys.exit(status)
