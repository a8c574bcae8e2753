#!/usr/bin/env bash
# Ahead of class: download the gpu profile's models (litgpt download, converted to lit_model.pth) and the
# Alpaca2k data set, so the lab never waits on the Hugging Face hub.
#
# Checks free disk first. Resumable: a model that already has lit_model.pth is skipped, and an interrupted
# download picks up where it stopped (the hub client keeps partial files), so just run it again.
set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
. "$HERE/lib.sh"

LAB_DIR=$(cd "$HERE/.." && pwd)
CHECKPOINT_DIR=${LAB_CHECKPOINTS:-$LAB_DIR/checkpoints}
DATA_DIR=${LAB_DATA:-$LAB_DIR/data}
PYTHON=${LAB_PYTHON:-python3}
RETRIES=3
DATA_DONE=.fetch-class-assets-done # in the data set's folder once its download finished
FETCH_DATA=1

# The gpu profile's models and their download size in MB (fp16 weights on the hub).
ALL_MODELS=(
    TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
    openlm-research/open_llama_3b
    openlm-research/open_llama_7b
    openlm-research/open_llama_13b
)
declare -A SIZE_MB=(
    [TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T]=2200
    [openlm-research/open_llama_3b]=7000
    [openlm-research/open_llama_7b]=13500
    [openlm-research/open_llama_13b]=26000
)
MODELS=("${ALL_MODELS[@]}")

model_list() {
    local model mb
    for model in "${ALL_MODELS[@]}"; do
        mb=${SIZE_MB[$model]}
        printf '                          %s (~%d.%d GB download)\n' "$model" $((mb / 1000)) $((mb % 1000 / 100))
    done
}

usage() {
    cat <<EOF
Usage: $PROG [--models REPO[,REPO...]] [--checkpoint-dir DIR] [--data-dir DIR] [--no-data] [--retries N] [--dry-run]

Downloads the gpu profile's models with 'litgpt download' into the checkpoint folder and the Alpaca2k data set
into the data folder. Refuses to start without enough free disk (about twice each model's download: litgpt
converts it to lit_model.pth beside the original). Run it again to resume; finished models are skipped.

  --models LIST         comma-separated subset of (default: all):
$(model_list)
  --checkpoint-dir DIR  where models go (default: $CHECKPOINT_DIR; env LAB_CHECKPOINTS)
  --data-dir DIR        where the data set goes (default: $DATA_DIR; env LAB_DATA)
  --no-data             models only
  --retries N           attempts per download before giving up (default: $RETRIES)
  --dry-run             check disk and print the downloads that would run; download nothing
  -h, --help            this help

Needs litgpt (run it inside the lab container: docker exec -it lab provisioning/$PROG).
A Hugging Face token, if a model needs one, is read from HF_TOKEN in the environment; it is never printed.
EOF
}

# parse_models LIST: the comma-separated models, empty entries dropped ("a,,b", a trailing comma); none at all
# (--models , or --models "") is a usage error, not a "bad array subscript" from an empty key.
parse_models() {
    local raw=() entry
    IFS=, read -r -a raw <<<"$1"
    MODELS=()
    for entry in "${raw[@]}"; do
        [[ -n $entry ]] && MODELS+=("$entry")
    done
    ((${#MODELS[@]})) || usage_error "--models needs at least one model, e.g. --models ${ALL_MODELS[0]}"
}

parse_args() {
    while (($#)); do
        case $1 in
            --dry-run) DRY_RUN=1 ;;
            --no-data) FETCH_DATA=0 ;;
            --models | --checkpoint-dir | --data-dir | --retries)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    --models) parse_models "$2" ;;
                    --checkpoint-dir) CHECKPOINT_DIR=$2 ;;
                    --data-dir) DATA_DIR=$2 ;;
                    --retries) RETRIES=$2 ;;
                esac
                shift
                ;;
            *) help_or_unknown "$1" ;;
        esac
        shift
    done
    [[ $RETRIES =~ ^[1-9][0-9]*$ ]] || usage_error "--retries needs a positive number, not: $RETRIES"
    local model
    for model in "${MODELS[@]}"; do
        [[ -n ${SIZE_MB[$model]:-} ]] || usage_error "not a gpu-profile model: $model (see --help for the list)"
    done
}

# Finished = converted: lit_model.pth and model_config.yaml, as `python -m lab_helpers prepare --profile gpu` checks;
# and lit_model.pth a whole zip file (torch's format): litgpt writes model_config.yaml first and lit_model.pth as it
# converts, so a conversion cut off (Ctrl-C, a full disk) leaves both, lit_model.pth without its zip directory.
is_downloaded() {
    local weights=$CHECKPOINT_DIR/$1/lit_model.pth
    [[ -s $weights && -f $CHECKPOINT_DIR/$1/model_config.yaml ]] || return 1
    python3 -c 'import sys, zipfile; sys.exit(not zipfile.is_zipfile(sys.argv[1]))' "$weights" && return 0
    say "$1: $weights is cut off (an interrupted conversion); fetching it again"
    return 1
}

# free_mb DIR: free space on the disk that holds DIR (or its nearest existing parent).
free_mb() {
    local dir=$1
    until [[ -d $dir ]]; do dir=$(dirname "$dir"); done
    df -Pk "$dir" | awk 'NR == 2 { print int($4 * 1024 / 1000000) }' # decimal MB, like the sizes
}

check_disk() {
    local model need=0
    for model in "${TODO[@]}"; do
        need=$((need + 2 * SIZE_MB[$model]))
    done
    local free
    free=$(free_mb "$CHECKPOINT_DIR")
    if ((free < need)); then
        die "not enough free disk for ${#TODO[@]} model(s): need about $((need / 1000)) GB in $CHECKPOINT_DIR, have $((free / 1000)) GB." \
            "Free some space, fetch fewer models (--models ...), or use a bigger disk (--checkpoint-dir DIR)."
    fi
    say "OK: about $((need / 1000)) GB needed, $((free / 1000)) GB free in $CHECKPOINT_DIR"
}

# with_retries CMD...: run CMD up to $RETRIES times; each try resumes the previous one's partial download.
with_retries() {
    if ((DRY_RUN)); then
        run "$@"
        return 0
    fi
    local attempt rc
    for ((attempt = 1; attempt <= RETRIES; attempt++)); do
        say "+ $(quote "$@")"
        rc=0
        "$@" || rc=$?
        ((rc == 0)) && return 0
        if ((attempt < RETRIES)); then
            warn "attempt $attempt of $RETRIES failed (exit $rc); retrying in 10 s, resuming where it stopped"
            sleep 10
        fi
    done
    die "gave up after $RETRIES attempts (exit $rc): $(quote "$@")" \
        "Run $PROG again later: finished files are kept and the download resumes."
}

fetch_models() {
    local model
    for model in "${TODO[@]}"; do
        # No --access_token: litgpt reads HF_TOKEN from the environment, which keeps it out of `ps` and logs.
        with_retries litgpt download "$model" --checkpoint_dir "$CHECKPOINT_DIR"
        changed "downloaded $model"
    done
}

fetch_data() {
    local dest=$DATA_DIR/alpaca2k
    # Finished = the marker written after a download that succeeded: the hub client's cache folder is not empty
    # as soon as a download starts, so an interrupted one would otherwise count as done and never resume.
    if [[ -f $dest/$DATA_DONE ]]; then
        unchanged "have the Alpaca2k data set in $dest"
        return 0
    fi
    # litgpt's own Alpaca2k data module, pointed at the lab's data folder: the same files training reads.
    with_retries "$PYTHON" -c 'import sys
from pathlib import Path
from litgpt.data import Alpaca2k
Alpaca2k(download_dir=Path(sys.argv[1])).prepare_data()' "$dest"
    ((DRY_RUN)) || : >"$dest/$DATA_DONE"
    changed "downloaded the Alpaca2k data set into $dest"
}

main() {
    parse_args "$@"
    ((DRY_RUN)) && say "Dry run: checking only; downloads are printed, none run."
    if ! ((DRY_RUN)) && ! command -v litgpt >/dev/null; then
        die "litgpt is not installed here." \
            "Run this inside the lab container: docker exec -it lab provisioning/$PROG" \
            "(or in a Python environment with the lab installed: pip install -e .)"
    fi
    [[ -n ${HF_TOKEN:-} ]] && say "HF_TOKEN is set; litgpt will use it."
    TODO=()
    local model
    for model in "${MODELS[@]}"; do
        if is_downloaded "$model"; then
            unchanged "downloaded: $model"
        else
            TODO+=("$model")
        fi
    done
    if ((${#TODO[@]})); then
        check_disk
        fetch_models
    fi
    ((FETCH_DATA)) && fetch_data
    summary
}

main "$@"
