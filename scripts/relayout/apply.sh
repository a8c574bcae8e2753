#!/usr/bin/env bash
# Issue 44's relayout, every step in order, on a clean checkout of main: a few large commits, each checked.
#
#   cd CHECKOUT && bash PATH/TO/scripts/relayout/apply.sh [--check] [--test] [--from STEP]
#
#   0  scripts/relayout/ joins the checkout (its own commit; nothing to do when run from the checkout's copy)
#   1  notebook_api.py       one namespace for the notebooks (lab); first, as the move splits a notebook's import
#                            line by package and 01's first cell would be over the tests' 15 lines without it
#   2  move.py               the layers as packages: git mv, every reference (lab's table too), .importlinter
#   3  split_compare.py      present/compare -> tables + figures (+ figure_display)
#   4  split_decision.py     planning/decision -> + profile_choice, node_limits, sections
#   5  split_large.py        no module over 600 lines (wheelhouse, records, warm_start, timing, decision, figures,
#                            tracer)
#   6  extract_functions.py  no function over 120 lines
#   7  readme_layout.py      the README's Layout
#   and last, no commit: notebook_api.py --count (the notebooks import at most six lab_helpers modules)
#
# Every step is a script beside this one that finds what it changes by name and stops, loudly, where that is not
# what it expects (main changed there since): fix the step, and run this again on a fresh checkout. After each
# step: ruff on the files it changed, lint-imports (every contract kept), the package imports; then one commit with the
# step's fixed message. --test also runs the fast tier after each step (minutes on 2 cores).
# --check changes nothing here: it runs every step in a throw-away worktree of HEAD (each step's own --check
# first, then the step, so that the next step sees what it would), reports, and removes the worktree.
# --from STEP starts there (a checkout that has the earlier steps' commits already, e.g. the branch relayout).
# PYTHON: the interpreter with ruff and import-linter (default: the checkout's .venv, else /work/main/.venv, else
# python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
cd "$root"
check=0 test=0 from=""
while (($#)); do
    case "$1" in
        --check) check=1 ;;
        --test) test=1 ;;
        --from) from="$2"; shift ;;
        *) echo "apply.sh: unknown argument $1 (--check, --test, --from STEP)" >&2; exit 2 ;;
    esac
    shift
done
if [[ -z "${PYTHON:-}" ]]; then
    for candidate in "$root/.venv/bin/python" /work/main/.venv/bin/python; do
        [[ -x $candidate ]] && PYTHON=$candidate && break
    done
    PYTHON=${PYTHON:-python3}
fi
lint_imports="$(dirname "$PYTHON")/lint-imports"
if ! "$PYTHON" -m ruff --version >/dev/null || [[ ! -x $lint_imports ]]; then
    echo "apply.sh: $PYTHON needs ruff and import-linter (PYTHON=...)" >&2
    exit 2
fi

steps=(notebook_api move split_compare split_decision split_large extract_functions readme_layout)
if [[ -n $from ]]; then
    for i in "${!steps[@]}"; do [[ ${steps[$i]} == "$from" ]] && steps=("${steps[@]:$i}") && break; done
    [[ ${steps[0]} == "$from" ]] || { echo "apply.sh: no step $from" >&2; exit 2; }
fi
declare -A subject=(
    [move]="Relayout (issue 44): lab_helpers' layers as packages, by scripts/relayout/move.py"
    [split_compare]="present: compare.py split into tables.py and figures.py (scripts/relayout/split_compare.py)"
    [split_decision]="planning: decision.py split where its parts are separate decisions (scripts/relayout/split_decision.py)"
    [split_large]="No module over 600 lines: wheelhouse, records, warm_start, timing, decision, figures, tracer split at their seams"
    [extract_functions]="No function over 120 lines: blocks of six long functions moved, unchanged, into helpers"
    [notebook_api]="One namespace for the notebooks: what their cells call from below is lab's public API"
    [readme_layout]="README Layout: the layers as the packages they now are"
)
declare -A body=(
    [move]="Every top-level module of lab_helpers/ moved into its layer package (present, record, launch, training,
assets, planning, hardware, config; distributed/ and planner/ whole), every reference rewritten (imports, python -m,
monkeypatch strings, file paths, notebook cells), .importlinter as layer contracts over the packages."
    [split_compare]="tables: the comparison table, markdown table, one-offs, the shipped references and the sentences the
notebooks print. figures: every plot, the timeline, save_all. new_figure and breakdown_colors join figure_display
(what_if and step_memory no longer import compare's private helpers); measured_memory, rank0_records and as_mapping
get public names. Code moved unchanged; callers name tables.X or figures.X."
    [split_decision]="profile_choice: which profile this node runs and why one cannot. node_limits: what the node offers a run
and host RAM against an offload run. sections: which sections this node can run. decision keeps the gate (blocked)
and decide. torch_problem and smaller_model_checkpoint get public names. Callers import from the defining module."
    [split_large]="Whole top-level definitions moved by name, callers rewritten (no re-exports): assets/wheel_plan (what a
wheelhouse holds: requirements, target, pip's commands and report, the node's packages), record/fallback
(store_records' fallback and merge_records), launch/warm_server (the warm server's side), planning/planner/calibration
(what the time model fits to records), planning/pairs + planning/micro_batch (what a pair compares, the
micro batch search: decision.py once more, where main's pairs make it long), present/figure_files (how the
figures are written), planning/planner/trace_setup (what the trace builds before the step)."
    [extract_functions]="cli.build_parser, launch/runner.run_command, planner/spec.spec_from_recipe, planner/timing.predict_time,
planner/tracer.trace_training and training/distributed/train.run: each block found by its first line, checked
against a digest of its text and for the locals it reads and sets, moved verbatim into a helper below."
    [notebook_api]="The notebooks import at most six lab_helpers modules: lab, node_plan, arithmetic, compare (tables and
figures once it is split), what_if. Every other name a cell used (describe_node, results_dir, prepare, load_results, load_experiments,
show_commands, guess_table, plot_step, ...) is in lab's __all__, imported on first use; import lines and qualified
names rewritten in the notebooks' cells, the rest of each notebook byte for byte; tests/test_notebooks.py and
tests/notebook_images.py follow."
    [readme_layout]="The tree (one line per layer package), one run's path through it, and the home-made parts with their
reasons, each named by its new path."
)

gate() {  # what every step must leave: ruff-clean changed files, the contracts kept, an importable package
    local changed
    mapfile -t changed < <(git diff --cached --name-only --diff-filter=AMR HEAD -- '*.py')
    if ((${#changed[@]})); then "$PYTHON" -m ruff check --quiet "${changed[@]}"; fi
    PYTHONPATH="$root" "$lint_imports" --no-cache --no-logo | grep -q " kept, 0 broken" || {
        PYTHONPATH="$root" "$lint_imports" --no-cache --no-logo | tail -20
        echo "apply.sh: lint-imports fails" >&2
        return 1
    }
    PYTHONPATH="$root" "$PYTHON" -c "import lab_helpers.cli, lab_helpers.lab, lab_helpers.node_plan"
    if ((test)); then
        PYTHONPATH="$root" LAB_RESULTS="$(mktemp -d)" LAB_PROFILE=ci OMP_NUM_THREADS=1 "$PYTHON" -m pytest tests \
            -m "not slow" -n 2 -p no:cacheprovider -q --dist loadfile
    fi
}

copy_scripts() {  # step 0
    if [[ "$here" != "$root/scripts/relayout" ]]; then
        mkdir -p scripts/relayout
        find "$here" -maxdepth 1 -type f \( -name '*.py' -o -name '*.sh' \) -exec cp {} scripts/relayout/ \;
        git add scripts/relayout
    fi
}

if ((check)); then
    parent="$(mktemp -d)"
    tmp="$parent/relayout-check"
    git worktree add --detach -q "$tmp" HEAD
    trap 'git -C "$root" worktree remove --force "$tmp"; rmdir "$parent"' EXIT
    cd "$tmp"
    copy_scripts
    for step in "${steps[@]}"; do
        echo "== $step"
        "$PYTHON" "scripts/relayout/$step.py" --check
        "$PYTHON" "scripts/relayout/$step.py" >/dev/null
        git add -A
    done
    "$PYTHON" scripts/relayout/notebook_api.py --count
    echo "apply.sh --check: every step applies to $(git rev-parse --short HEAD)"
    exit 0
fi

if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
    echo "apply.sh: the checkout has changes; run it on a clean checkout of main" >&2
    exit 1
fi
copy_scripts
if ! git diff --cached --quiet; then
    git commit -q -m "scripts/relayout: issue 44's relayout as re-runnable steps (apply.sh runs them in order)"
    echo "== scripts: committed"
fi
for step in "${steps[@]}"; do
    echo "== $step"
    "$PYTHON" "scripts/relayout/$step.py"
    git add -A
    gate
    git commit -q -m "${subject[$step]}" -m "${body[$step]}"
    git log --oneline -1
done
"$PYTHON" scripts/relayout/notebook_api.py --count
echo "apply.sh: done"
git log --oneline -$((${#steps[@]} + 1))
