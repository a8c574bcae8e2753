#!/usr/bin/env bash
# One slice of GPU time is one command: bash scripts/gpu-chunk.sh CHUNK --out DIR [--wheels DIR] [--dry-run] [--only IDS] [--steps N]
#                                       bash scripts/gpu-chunk.sh CHUNK --list [--dry-run]   (the steps and their costs)
#
# Why: GPU time comes in slices of 15 minutes (machine start included), at most 10 minutes a command, the machine
# handed back seconds after it ends, and only DIR comes back (8 files of 16 MiB, 2 folders deep). So a chunk does
# preflight, install, checkpoints and runs under ONE deadline that counts everything, and after every step it
# copies what is done into DIR: a kill at the limit loses at most the step in flight, and one oversized file
# (a profile trace) never takes the records with it.
#
#   CHUNK          speed | ranks | single-7b | 13b | offload | notebooks | padding | levers   (the GPU issues; steps below,
#                  costs in configs/gpu-chunk-costs.tsv; docs/measuring-on-a-gpu.md has the table)
#   --out DIR      the folder that comes back (default: $OUT), without another chunk's files (a relative DIR, like
#                  --wheels DIR, is read from the caller's directory); it holds at most 7:
#                    chunk.log             preflight, every step's time and outcome, the summary
#                    runs.jsonl            the records so far (the lab's schema)
#                    results.tar.gz        LAB_RESULTS without traces: timelines, logs, preflight, prepare log
#                    trace-<run>.json.gz   one per profiled run, if it fits (else the log says so)
#                    measurement-overhead.txt   benchmarks/measurement_overhead.py's table (speed, levers)
#                    NAME.ipynb            each executed notebook (notebooks: 00, 04, 01; wheels --with notebooks)
#   --wheels DIR   install these wheels first (from `python -m lab_helpers wheelhouse --node-has ...`)
#   --deadline-s S S seconds from the script's start (default 540; dry run 900): a step starts only while its
#                  row's seconds in configs/gpu-chunk-costs.tsv are left (60 s when it has none); S below the
#                  first step's row is bad input
#   --dry-run      the same chunk on the ci profile on a CPU: tiny models, same streaming and limits
#   --only IDS     run only the chunk's steps of these experiments or notebooks (comma-separated, e.g.
#                  lora-7b,qlora-7b: what an earlier slice did not reach), in the chunk's order
#   --steps N      run only the chunk's first N steps, after --only (CI's short dry runs: tests/test_gpu_chunk.py)
#   --list         print the chunk's steps, each with its row's seconds on this profile (gpu; ci with --dry-run) and
#                  where the figure comes from, then exit 0 having run nothing (no --out needed)
# Python: LAB_PYTHON, else the lab's venv (LAB_VENV, as scripts/setup-env.sh: default .venv in the repository) where
# it has bin/python, else python3; chunk.log's first line names it.
# Signals: every step runs in the chunk's process group (`timeout --foreground`), so a SIGTERM to the group (a
# device's limit) reaches the step in flight: it ends (a notebook's cell interrupted, its copy written; a run
# recorded `interrupted`), what is done is shipped, and chunk.log says which step was cut short. After a SIGKILL of
# the group nothing of the chunk writes into --out, and its work folder is removed within seconds.
# A chunk's last steps may run only if time is left (levers: the repeats): the deadline drops them first, and a
# dropped one fails nothing.
# Exit status: 0 every step ran and exited 0 (those run only if time is left: every one started did); 1 a step
# failed, a step was not started (deadline) or the preflight stopped the chunk; 2 bad input (one line on stderr,
# nothing done).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
caller="$PWD"  # relative paths given to the script are read from here; it runs in the repository

chunk="" out="${OUT:-}" wheels="" deadline_s="" dry=0 first_n="" only="" list=0
while (($#)); do
    case "$1" in
        --out|--wheels|--deadline-s|--steps|--only)  # a value must follow (a bare `shift 2` at the end would loop forever)
            (($# >= 2)) || { echo "gpu-chunk: $1 needs a value (see --help)" >&2; exit 2; } ;;&
        --out) out="${2:-}"; shift 2 ;;
        --wheels) wheels="${2:-}"; shift 2 ;;
        --deadline-s) deadline_s="${2:-}"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        --steps) first_n="${2:-}"; shift 2 ;;
        --only) only="${2:-}"; shift 2 ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,/^set /p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
        -*) echo "gpu-chunk: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [[ -z $chunk ]] || { echo "gpu-chunk: one chunk per command; got $chunk and $1" >&2; exit 2; }
           chunk="$1"; shift ;;
    esac
done
from_caller() {  # a path as the caller meant it: relative ones from the caller's directory
    if [[ -z $1 || $1 == /* ]]; then echo "$1"; else echo "$caller/$1"; fi
}
out=$(from_caller "$out") wheels=$(from_caller "$wheels")
[[ -n ${LAB_CHUNK_COSTS:-} ]] && LAB_CHUNK_COSTS=$(from_caller "$LAB_CHUNK_COSTS")
[[ ${LAB_PYTHON:-} == */* ]] && LAB_PYTHON=$(from_caller "$LAB_PYTHON")  # a bare name is looked up on PATH
venv=$(from_caller "${LAB_VENV:-$repo/.venv}")
cd "$repo" || exit 1

# The chunks: each step is `run ID [ARGS]` (python -m lab_helpers run, quick mode), `overhead ID [REPEAT]`, or
# `notebook NAME` (notebooks/NAME.ipynb executed by scripts/execute_notebook.py, its copy shipped as NAME.ipynb).
# if_time: steps after those, each started only while its row's seconds are left; one not started fails nothing.
models="" steps=() if_time=()
case "$chunk" in
    speed) models=1b
        steps=("run lora-1b --trace-steps 2" "run bf16-true --trace-steps 2" "run small-batch --trace-steps 2"
               "run grad-accum" "run bf16-mixed" "run fill-gpu" "overhead lora-1b 3") ;;
    ranks) models=7b
        steps=("run fsdp --simulate-world 4" "run ddp --simulate-world 4" "run fsdp-grad-op --simulate-world 4"
               "run fsdp-bs8 --simulate-world 4" "run ddp-course --simulate-world 4" "run fsdp-course --simulate-world 4"
               "run fsdp --simulate-world 8" "run ddp --simulate-world 8") ;;
    single-7b) models=7b
        steps=("run one-gpu" "run act-ckpt" "run adamw-8bit" "run full-7b" "run lora-7b" "run qlora-7b"
               "run qlora-7b --set train.micro_batch_size=1") ;;
    13b) models=13b
        steps=("run full-13b-sgd" "run lora-13b" "run full-13b") ;;
    notebooks) models=1b  # the student's path: 00, 04, then 01 on the 1.1B models (LAB_MODELS), quick mode
        steps=("notebook 00_check_node" "notebook 04_what_if" "notebook 01_single_gpu") ;;
    padding) models=1b  # small-batch and its length-grouped order, the same samples
        steps=("run small-batch" "run length-grouped") ;;
    offload) models=7b
        steps=("run deepspeed-zero2-offload --set checkpoint_dir=checkpoints/openlm-research/open_llama_7b"
               "run deepspeed-offload --set checkpoint_dir=checkpoints/openlm-research/open_llama_7b") ;;
    levers) models=1b  # each lever beside its pair, a pair that another step runs run once
        # (compile-static's is compile; fused-adamw's is small-batch), compile and its pair profiled, the cost of
        # measuring in 3 tries; then, if time is left, the repeats that the speed-verdict rule needs
        steps=("run compile --trace-steps 2" "run lora-1b --trace-steps 2" "run pad-64" "run small-batch"
               "run compile-static" "run fused-adamw" "run attention-flash" "run bf16-true" "overhead lora-1b 3")
        if_time=("run small-batch" "run bf16-true" "run lora-1b") ;;
    "") echo "gpu-chunk: name a chunk: speed, ranks, single-7b, 13b, offload, notebooks, padding or levers (see --help)" >&2; exit 2 ;;
    *) echo "gpu-chunk: unknown chunk '$chunk': speed, ranks, single-7b, 13b, offload, notebooks, padding or levers" >&2; exit 2 ;;
esac
step_id() { local kind id; read -r kind id _ <<<"$1"; echo "$id"; }  # run ID ..., overhead ID, notebook NAME
if [[ -n $only ]]; then  # the chunk's steps of these ids, in the chunk's order; an id it lacks is bad input
    ids=() kept=() kept_if_time=()
    for step in "${steps[@]}" "${if_time[@]}"; do ids+=("$(step_id "$step")"); done
    IFS=, read -ra wanted <<<"$only"
    for id in "${wanted[@]}"; do
        [[ " ${ids[*]} " == *" $id "* ]] ||
            { echo "gpu-chunk: --only $only: $chunk has no step of '$id' (its steps: $(printf '%s\n' "${ids[@]}" | awk '!seen[$0]++' | paste -sd ' '))" >&2; exit 2; }
    done
    for step in "${steps[@]}"; do [[ ",$only," == *",$(step_id "$step"),"* ]] && kept+=("$step"); done
    for step in "${if_time[@]}"; do [[ ",$only," == *",$(step_id "$step"),"* ]] && kept_if_time+=("$step"); done
    steps=("${kept[@]}") if_time=("${kept_if_time[@]}")
    ((${#steps[@]} + ${#if_time[@]})) || { echo "gpu-chunk: --only $only: give at least one id" >&2; exit 2; }
fi
required=${#steps[@]}  # the steps after these are if_time's
steps+=("${if_time[@]}")
deadline_s="${deadline_s:-$((dry ? 900 : 540))}"
[[ $deadline_s =~ ^[0-9]+$ ]] || { echo "gpu-chunk: --deadline-s $deadline_s: give whole seconds" >&2; exit 2; }
deadline_s=$((10#$deadline_s))  # decimal: bash reads 08 as octal and fails
if [[ -n $first_n ]]; then
    [[ $first_n =~ ^[1-9][0-9]*$ ]] || { echo "gpu-chunk: --steps $first_n: give a whole number from 1" >&2; exit 2; }
    steps=("${steps[@]:0:first_n}")
fi
profile=gpu; ((dry)) && profile=ci
costs="${LAB_CHUNK_COSTS:-configs/gpu-chunk-costs.tsv}"  # another table: the tests' deadlines that start no step
row_for() {  # the step's row in the cost table on this profile: SECONDS<tab>WHERE, nothing when none
    local kind id key
    read -r kind id _ <<<"$1"
    key="$id"; [[ $1 == *--trace-steps* ]] && key="$id+trace"; [[ $kind == overhead ]] && key="overhead-$id"
    [[ $kind == notebook ]] && key="notebook-$id"
    awk -v id="$key" -v p="$profile" -F'\t' '$1 == id && $2 == p {print $3 "\t" $4; exit}' "$costs"
}
min_s_for() {  # the row's seconds for this step (60 when it has none)
    local row
    row=$(row_for "$1")
    echo "${row%%$'\t'*}" | awk '{print ($1 == "" ? 60 : $1)}'
}
if ((list)); then  # what the chunk would run, in order, and the least time left at which each starts
    for i in "${!steps[@]}"; do
        where=$(row_for "${steps[i]}" | cut -f2)
        when=""; ((i >= required)) && when="[if time is left] "
        printf '%2d  %-40s %4s s  %s%s\n' $((i + 1)) "${steps[i]}" "$(min_s_for "${steps[i]}")" "$when" \
            "${where:-(no row in $costs: 60 s)}"
    done
    exit 0
fi
[[ -n $out ]] || { echo "gpu-chunk: give --out DIR (or set OUT): the folder that comes back" >&2; exit 2; }
python="${LAB_PYTHON:-}"  # else the lab's venv, as scripts/setup-env.sh made it (not activated: a new user's shell)
[[ -n $python ]] || { [[ -x $venv/bin/python ]] && python="$venv/bin/python"; } || python=python3
command -v "$python" >/dev/null || { echo "gpu-chunk: ${LAB_PYTHON:+LAB_PYTHON }$python: no such command" >&2; exit 2; }
need_s=$(min_s_for "${steps[0]}")  # a deadline that starts no step would spend the slice on preflight and builds
((deadline_s >= need_s)) ||
    { echo "gpu-chunk: --deadline-s $deadline_s starts no step: the first (${steps[0]}) needs ~${need_s} s" >&2; exit 2; }
if [[ -n $wheels ]] && ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "gpu-chunk: --wheels $wheels holds no wheels" >&2; exit 2
fi
for done_file in chunk.log runs.jsonl results.tar.gz; do  # a second chunk would replace the first's records
    [[ ! -e $out/$done_file ]] ||
        { echo "gpu-chunk: --out $out already holds a chunk's $done_file: give an empty folder (on a device machine," \
            "one chunk per call: only 8 files come back from its output folder, subfolders included)" >&2; exit 2; }
done
mkdir -p "$out" || { echo "gpu-chunk: cannot make --out $out" >&2; exit 2; }
out="$(cd "$out" && pwd)"

started=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-chunk-XXXXXX")"
# A SIGKILL of the chunk's group runs no trap: a watcher in a session of its own removes the work folder once this
# shell is gone (its steps' last processes, a notebook's kernel, end within a second of it). Any other end runs the
# EXIT trap below, which removes the folder and ends the watcher.
reaper=""
if command -v setsid >/dev/null; then
    # shellcheck disable=SC2016  # $1 and $2 are the watcher's own arguments
    setsid bash -c 'tail --pid="$1" -s 0.5 -f /dev/null 2>/dev/null; sleep 2; rm -rf -- "$2"' gpu-chunk-reaper \
        "$$" "$work" </dev/null >/dev/null 2>&1 &
    reaper=$!
fi
export LAB_PROFILE="$profile" LAB_RESULTS="$work/results" PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE  # wheels go in --no-compile: the first import writes the .pyc for every later run
mkdir -p "$LAB_RESULTS/preflight" "$LAB_RESULTS/steps"
log="$out/chunk.log"
trace_cap_bytes="${LAB_TRACE_CAP_BYTES:-$((15 * 1024 * 1024))}"
# what is logged and shipped goes through the lab's one redaction (lab_helpers/config/secrets.py), as records do
mask() { "$python" -m lab_helpers.config.secrets || echo "gpu-chunk: (lines not logged: masking them failed)"; }
say() { echo "gpu-chunk [$((SECONDS - started)) s]: $*" | mask | tee -a "$log"; }
left_s() { echo $((deadline_s - (SECONDS - started))); }

# shellcheck disable=SC2317  # called after each step and at exit
stream() {  # what is done so far into $out, each file replaced whole (written beside, then renamed)
    if [[ -f $LAB_RESULTS/runs.jsonl ]] && ! { cp "$LAB_RESULTS/runs.jsonl" "$out/.runs.jsonl.part" 2>>"$log" &&
        mv -f "$out/.runs.jsonl.part" "$out/runs.jsonl"; }; then  # a full disk: said, not shipped half
        rm -f "$out/.runs.jsonl.part"; unshipped=1; say "runs.jsonl: writing it into $out failed (a full disk?)"
    fi
    local trace name size
    while IFS= read -r trace; do
        name="trace-$(basename "$(dirname "$(dirname "$trace")")").json.gz"
        [[ -e $out/$name || -e $work/shipped-$name ]] && continue
        : >"$work/shipped-$name"
        gzip -c "$trace" >"$work/$name"
        size=$(stat -c %s "$work/$name")
        if ((size > trace_cap_bytes)); then
            say "trace $name: $((size / 1048576)) MiB gzipped, over the cap of $((trace_cap_bytes / 1048576)) MiB: not shipped (its summary is in the record)"
        elif (($(find "$out" -maxdepth 1 -type f | wc -l) >= 7)); then
            say "trace $name: not shipped (the output folder holds 7 files already)"
        else
            if mv -f "$work/$name" "$out/$name" 2>>"$log"; then
                say "trace $name: shipped, $((size / 1024)) KiB"
            else
                rm -f "$out/$name"; unshipped=1; say "trace $name: writing it into $out failed (a full disk?)"
            fi
        fi
        rm -f "$work/$name"
    done < <(find "$LAB_RESULTS/runs" -path '*/profile/trace.json' 2>/dev/null | sort)
    if ! { tar czf "$out/.results.tar.gz.part" --exclude='trace.json' --exclude='*.pth' --exclude='*.safetensors' \
        --exclude='tokenizer*.json' -C "$LAB_RESULTS" . 2>>"$log" &&
        mv -f "$out/.results.tar.gz.part" "$out/results.tar.gz"; }; then
        rm -f "$out/.results.tar.gz.part"; unshipped=1; say "results.tar.gz: writing it into $out failed (a full disk?)"
    fi
}
unshipped=0  # set when stream could not write into $out: the chunk then fails
# everything worth keeping is in $out by then
trap 'stream; rm -rf "$work"; [[ -z $reaper ]] || kill -- "-$reaper" 2>/dev/null' EXIT
running=""  # the step in flight
# shellcheck disable=SC2317  # called through the traps below
ended_by() {  # a SIGTERM (the device's limit) or Ctrl-C: bash runs this once the step in flight has ended, its launcher
    # (signalled too) having recorded it, so that the EXIT trap ships that record and the log says what was cut short
    say "ended by SIG$1${running:+ during $running}"; exit $((128 + $2))
}
trap 'ended_by TERM 15' TERM; trap 'ended_by INT 2' INT; trap 'ended_by HUP 1' HUP

say "$chunk on ${HOSTNAME:-?}, $(date -u +%FT%TZ): profile $profile, deadline ${deadline_s}s, ${#steps[@]} steps, out $out, python $python"

# --- preflight: what the node has, in the first seconds, written out at once ------------------------------
pre="$LAB_RESULTS/preflight"
{ nvidia-smi 2>&1 || echo "no nvidia-smi"; } >"$pre/nvidia-smi.txt"
"$python" -m pip list --format=freeze >"$pre/pip-freeze.txt" 2>&1
{ df -h "$repo" /tmp /dev/shm; echo; free -g; echo; nproc; } >"$pre/host.txt" 2>&1
write_s=$( { TIMEFORMAT=%R; time dd if=/dev/zero of="$work/dd.bin" bs=1M count=512 conv=fdatasync status=none; } 2>&1 )
rm -f "$work/dd.bin"
"$python" - >"$pre/torch.txt" 2>&1 <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", "sms", p.multi_processor_count)
try:  # the node's own, never carried (docs/gpu-image-packages.txt): torch.compile on CUDA needs it (levers)
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton none")
EOF
say "preflight: $(tr '\n' ' ' <"$pre/torch.txt"); 512 MiB written in ${write_s}s; $(awk '/^Mem:/ {print "RAM " $2 " GiB, free " $7}' "$pre/host.txt"); /dev/shm free $(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')"
if ((!dry)) && ! grep -q "available True" "$pre/torch.txt"; then
    say "stopped: torch sees no CUDA GPU here (see preflight/torch.txt); use --dry-run on a CPU"; exit 1
fi

# --- install the carried wheels, then check the imports the chunk needs --------------------------------------
if [[ -n $wheels ]]; then
    t0=$SECONDS
    site="$work/site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl >"$pre/pip-install.txt" 2>&1 || { say "stopped: installing $wheels failed (preflight/pip-install.txt)"; exit 1; }
    export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
    say "installed $(find "$wheels" -name '*.whl' | wc -l) wheels ($(du -sm "$wheels" | cut -f1) MiB) in $((SECONDS - t0)) s"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi
t0=$SECONDS
imports="litgpt, lightning, lab_helpers.lab, lab_helpers.planning.planner"
[[ $chunk == notebooks ]] && imports+=", nbclient, nbformat, ipykernel"  # the wheelhouse's --with notebooks
if ! "$python" -c "import $imports" >"$pre/imports.txt" 2>&1; then
    say "stopped: the imports failed: $(tail -n 1 "$pre/imports.txt") (preflight/imports.txt)"; exit 1
fi
say "imports ok in $((SECONDS - t0)) s"

# --- checkpoints: only the sizes the chunk needs, each build timed, its whole output kept --------------------
if [[ $chunk == 13b ]] && ((!dry)); then  # 26 GB of random weights: in RAM where /dev/shm holds them with room
    shm_free_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc '0-9')
    if ((10#${shm_free_gb:-0} >= 30)); then
        export LAB_CHECKPOINTS=/dev/shm/lab-checkpoints
        say "checkpoints in $LAB_CHECKPOINTS (/dev/shm has ${shm_free_gb} GB free)"
    fi
fi
if [[ $chunk == offload ]] && ((!dry)); then  # DeepSpeedCPUAdam's JIT build (nvcc) beside the weights' build
    ( t=$SECONDS; "$python" -c "from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()" \
        >"$LAB_RESULTS/cpu-adam-build.log" 2>&1; echo "exit $? after $((SECONDS - t)) s" >>"$LAB_RESULTS/cpu-adam-build.log" ) &
    cpu_adam=$!
fi
t0=$SECONDS
if ((dry)); then
    prepare=(-m lab_helpers prepare --profile ci)
else
    prepare=(-m lab_helpers prepare --profile gpu --random-weights --models "$models")
fi
"$python" "${prepare[@]}" 2>&1 | mask >"$LAB_RESULTS/prepare.log"
if ((PIPESTATUS[0] != 0)); then
    say "stopped: building checkpoints failed: $(tail -n 1 "$LAB_RESULTS/prepare.log") (prepare.log)"; exit 1
fi
say "checkpoints ready ($( ((dry)) && echo "the ci models" || echo "$models")) in $((SECONDS - t0)) s"
if [[ -n ${cpu_adam:-} ]]; then
    wait "$cpu_adam"
    say "DeepSpeedCPUAdam build: $(tail -n 1 "$LAB_RESULTS/cpu-adam-build.log") (cpu-adam-build.log)"
fi
stream

# --- the steps, in value order, under the one deadline -----------------------------------------------------
status=0 number=0 not_run=() not_left=()
for step in "${steps[@]}"; do
    number=$((number + 1))
    read -r kind id rest <<<"$step"
    need_s=$(min_s_for "$step") left=$(left_s)
    if ((left < need_s && number > required)); then  # if time is left: not started fails nothing
        say "not started (if time is left): $step (needs ~${need_s} s, ${left} s left)"; not_left+=("$step"); continue
    elif ((left < need_s)); then
        say "not started: $step (needs ~${need_s} s, ${left} s left)"; not_run+=("$step"); status=1; continue
    fi
    step_log="$LAB_RESULTS/steps/$(printf %02d "$number")-$id.log"
    limit_s=$((left - 25))  # the training process's limit: ~25 s of launcher, planner and record around it
    ((limit_s >= 10)) || limit_s=10  # 0 would mean no limit, below 0 a refused run (a cost row under 35 s)
    t0=$SECONDS running="step $number ($step)"
    # Every step stays in the chunk's process group (timeout --foreground: timeout's own group would keep the step
    # running through a SIGTERM to the chunk, and alive after a SIGKILL of it, still writing into $out)
    if [[ $kind == notebook ]]; then  # executed as a student runs it; the copy ships whatever happens (SIGTERM:
        # the cell in flight interrupted, the cells run so far written; SIGINT would be ignored in a background job)
        LAB_QUICK=1 LAB_MODELS="$models" timeout --foreground -s TERM -k 30 "$((left - 5))" "$python" \
            scripts/execute_notebook.py "notebooks/$id.ipynb" "$out/$id.ipynb" >"$step_log" 2>&1
        rc=$?
    elif [[ $kind == overhead ]]; then
        # shellcheck disable=SC2086  # $rest holds the step's own arguments
        LAB_RESULTS="$work/overhead" timeout --foreground -s INT -k 20 "$((left - 5))" "$python" \
            benchmarks/measurement_overhead.py --profile "$profile" --steps 12 --repeat "${rest:-1}" "$id" \
            >"$out/measurement-overhead.txt" 2>"$step_log"
        rc=$?
        cat "$out/measurement-overhead.txt" >>"$log"
    else
        if ((dry)) && [[ $rest =~ --set\ checkpoint_dir=[^\ ]+ ]]; then  # a gpu model (offload's 7B): not on a CPU,
            rest=${rest/"${BASH_REMATCH[0]}"/}  # and its size would skip the run; the ci model stands in, as elsewhere
        fi
        if ((dry)) && [[ $rest =~ --simulate-world\ ([0-9]+) ]]; then
            # the ci recipes are sized for 2 CPU ranks: N simulated ranks get the global batch that gives each the
            # micro-batches per step that each of 2 ranks runs, as the notebooks' ci decision does
            rest+=" --set train.global_batch_size=$("$python" -c 'import sys
from lab_helpers.config.experiments import resolve
from lab_helpers.planning.decision import ci_simulated_global_batch
print(ci_simulated_global_batch(resolve(sys.argv[1], "ci", check_files=False), int(sys.argv[2])))' "$id" "${BASH_REMATCH[1]}")"
        fi
        # shellcheck disable=SC2086  # $rest holds the step's own arguments
        "$python" -m lab_helpers run "$id" --profile "$profile" --quick --quiet --time-limit "$limit_s" \
            $rest 2>&1 | mask >"$step_log"
        rc=${PIPESTATUS[0]}
    fi
    running=""
    ((rc == 0)) || status=1
    say "$step: exit $rc after $((SECONDS - t0)) s; $(grep -v '^\s*$' "$step_log" | tail -n 1 | cut -c1-240)"
    stream
done

# --- what ran, what did not, and how to export --------------------------------------------------------------
"$python" - "$LAB_RESULTS/runs.jsonl" <<'EOF' | tee -a "$log"
import json, sys
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in lines:
    r = json.loads(line)
    print(f"  {r.get('experiment')}: {r.get('status')}  peak {r.get('peak_alloc_gib')} GiB  iter median "
          f"{r.get('iter_median_s')} s  gpu busy {r.get('gpu_busy_pct')} %  bound {r.get('bound')}  "
          f"quick_stop {r.get('quick_stop')}  {r.get('reason') or ''}")
EOF
((${#not_run[@]})) && say "not run (deadline): ${not_run[*]}"
((${#not_left[@]})) && say "not run (if time is left; none was): ${not_left[*]}"
((unshipped)) && status=1
if [[ -s $out/runs.jsonl ]]; then  # the path quoted for the shell: an --out with a space gives a command that works
    say "done in $((SECONDS - started)) s. Export on the CPU: python -m lab_helpers export-reference --from $(printf %q "$out/runs.jsonl")"
else
    say "done in $((SECONDS - started)) s; no record was shipped, so there is nothing to export"
fi
exit $status
