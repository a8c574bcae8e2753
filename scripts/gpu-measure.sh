#!/usr/bin/env bash
# Measure a chunk of the lab on a GPU node that has torch but no network, in one go, and pack what it recorded.
#
# Why: a leased or borrowed GPU machine (an offline HPC node, or a developer session's device machine that is
# handed back seconds after a command ends) must do install, random-weight checkpoints, runs and packing in ONE
# command, leave nothing behind that matters, and bring back every record even when a run fails or time runs out.
#
#   bash scripts/gpu-measure.sh --models 1b,7b --deadline-s 540 --pack DIR  baseline small-batch ... one-gpu
#
#   --models KEYS     random-weight checkpoints to build first (prepare --random-weights --models KEYS)
#   --deadline-s S    start no experiment after S seconds from now (each run is also limited to what is left)
#   --pack DIR        write DIR/gpu-results-<host>-<time>.tar.gz: records, timelines, logs, doctor's report
#   --wheels DIR      install these wheels first (pip --no-index --no-deps --target, ahead on PYTHONPATH): the
#                     packages the node lacks, from `python -m lab_helpers wheelhouse --node-has ...` built elsewhere
#   --full            full runs instead of quick mode (LAB_QUICK=1 is the default here)
#   --set KEY=VALUE   a recipe override for every experiment of this call (repeatable), e.g. the model that the
#                     host-RAM gate names for deepspeed-offload: --set checkpoint_dir=checkpoints/openlm-research/open_llama_7b
#   --simulate-world N  run each (multi-GPU) experiment as rank 0 of a world of N on this one GPU (run --simulate-world)
#   --trace-steps N     capture a torch.profiler trace of N steady steps of each run (run --trace-steps)
#   EXPERIMENT...     ids of configs/experiments/*.yaml, run in this order on the gpu profile
#
# Results go to $LAB_RESULTS (default: results-gpu/ in the checkout). Unpack the tarballs of several calls into
# one folder, then: LAB_RESULTS=that python -m lab_helpers export-reference h100-80gb --profile gpu --note "..."
# The whole route (wheelhouse, the calls, the join and export, what the next GPU session runs):
# docs/measuring-on-a-gpu.md; what the shipped results show: reference_results/README.md.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 1

models="" deadline_s=0 pack="" wheels="" quick=1 experiments=() sets=() passed=()
while (($#)); do
    case "$1" in
        --models|--deadline-s|--pack|--wheels)
            (($# >= 2)) || { echo "gpu-measure: $1 needs a value (see --help)" >&2; exit 2; } ;;&
        --models) models="$2"; shift 2 ;;
        --deadline-s) deadline_s="$2"; shift 2 ;;
        --pack) pack="$2"; shift 2 ;;
        --wheels) wheels="$2"; shift 2 ;;
        --full) quick=0; shift ;;
        --set) [[ ${2:-} == *=* ]] || { echo "gpu-measure: --set ${2:-}: give KEY=VALUE" >&2; exit 2; }
               sets+=(--set "$2"); shift 2 ;;
        --simulate-world|--trace-steps)
               [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "gpu-measure: $1 ${2:-}: give a whole number" >&2; exit 2; }
               passed+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        -*) echo "gpu-measure: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) experiments+=("$1"); shift ;;
    esac
done
[[ $deadline_s =~ ^[0-9]+$ ]] || { echo "gpu-measure: --deadline-s $deadline_s: give whole seconds" >&2; exit 2; }
deadline_s=$((10#$deadline_s))  # decimal: bash reads 08 as octal, errs, and the lease would run with no deadline
((${#experiments[@]})) || { echo "gpu-measure: name at least one experiment (see --help)" >&2; exit 2; }
started=$SECONDS
python="${LAB_PYTHON:-python3}"
min_run_s="${LAB_MIN_RUN_S:-60}"  # a GPU run needs about this long to import, load and measure a few steps

if [[ -n $wheels ]]; then
    compgen -G "$wheels/*.whl" >/dev/null || { echo "gpu-measure: --wheels $wheels holds no wheels" >&2; exit 2; }
    site="${TMPDIR:-/tmp}/lab-site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl || { echo "gpu-measure: installing the wheels of $wheels failed" >&2; exit 1; }
    export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi
export LAB_PROFILE="${LAB_PROFILE:-gpu}" LAB_QUICK="$quick" PYTHONUNBUFFERED=1
# The wheels above are installed --no-compile (device seconds): the first import writes their .pyc for every later
# run of the call, which PYTHONDONTWRITEBYTECODE (set on some images) would stop, recompiling litgpt every run.
unset PYTHONDONTWRITEBYTECODE
export LAB_RESULTS="${LAB_RESULTS:-$repo/results-gpu}"
mkdir -p "$LAB_RESULTS"
log="$LAB_RESULTS/gpu-measure.log"
# every line logged goes through the lab's one redaction (lab_helpers/config/secrets.py): a --set access_token=... or a
# token quoted in an error is masked in the log and the pack, as in records
mask() { "$python" -m lab_helpers.config.secrets || echo "gpu-measure: (a line not logged: masking it failed)"; }
say() { echo "gpu-measure: $*" | mask | tee -a "$log"; }

# shellcheck disable=SC2317  # called through the EXIT trap
pack_results() {  # whatever happened: the records, timelines and logs travel
    [[ -n $pack ]] || return 0
    mkdir -p "$pack"
    local name
    name="gpu-results-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ).tar.gz"
    tar czf "$pack/$name" -C "$LAB_RESULTS" . && echo "gpu-measure: packed $pack/$name ($(du -h "$pack/$name" | cut -f1))"
}
trap pack_results EXIT

say "$(date -u +%FT%TZ) on $(hostname -s): ${experiments[*]} (profile $LAB_PROFILE, quick=$quick, deadline ${deadline_s}s${sets:+, ${sets[*]}})"
"$python" -m lab_helpers doctor 2>&1 | mask >"$LAB_RESULTS/doctor.txt"
say "doctor: $(grep -m1 -i 'gpu' "$LAB_RESULTS/doctor.txt" || echo 'see doctor.txt')"
if [[ -n $models ]]; then
    "$python" -m lab_helpers prepare --profile "$LAB_PROFILE" --random-weights --models "$models" 2>&1 | tail -n 3 | mask | tee -a "$log"
    ((PIPESTATUS[0] == 0)) || { say "prepare failed: see above"; exit 1; }
    say "prepared $models in $((SECONDS - started)) s"
fi

status=0
for experiment in "${experiments[@]}"; do
    limit=()
    if ((deadline_s)); then
        left=$((deadline_s - (SECONDS - started)))
        if ((left < min_run_s)); then say "not started (deadline): $experiment"; status=1; continue; fi
        limit=(--time-limit "$((left - 10))")  # 10 s to end the run and pack
    fi
    t0=$SECONDS
    "$python" -m lab_helpers run "$experiment" --profile "$LAB_PROFILE" --quiet "${limit[@]}" "${sets[@]}" \
        "${passed[@]}" 2>&1 |
        tail -n 2 | mask | tee -a "$log"
    say "$experiment: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
done
exit $status
