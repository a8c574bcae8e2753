#!/usr/bin/env bash
# The lab's main job on a fresh machine: set up, prepare the profile that fits this machine (gpu with a
# CUDA GPU, ci without), run the whole single-GPU sequence, and write the comparison table and plots.
#   LAB_PROFILE=ci|gpu         force a profile
#   LAB_RANDOM_WEIGHTS=1       gpu profile on a node without hub access: random-weight real architectures
#   LAB_WHEELHOUSE=DIR         an offline node: install from DIR (python -m lab_helpers wheelhouse) over the node's
#                              own torch; implies LAB_RANDOM_WEIGHTS=1 unless set to 0 (no hub to download from)
#   EXTRAS, LAB_SYSTEM_TORCH, LAB_BASE_PYTHON, LAB_VENV: see scripts/setup-env.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# shellcheck source=scripts/setup-env.sh
source scripts/setup-env.sh

profile="${LAB_PROFILE:-$(python -c 'from lab_helpers.lab import default_profile; print(default_profile())')}"
echo "lab: profile $profile"
python -m lab_helpers doctor
prepare_args=(--profile "$profile")
random_weights="${LAB_RANDOM_WEIGHTS:-$([[ -n ${LAB_WHEELHOUSE:-} ]] && echo 1 || echo 0)}"
[[ "$random_weights" == 1 && "$profile" == gpu ]] && prepare_args+=(--random-weights)
python -m lab_helpers prepare "${prepare_args[@]}"
python -m lab_helpers run-all --section single --profile "$profile" --quiet
echo "lab: records in $(python -c 'from lab_helpers.record.records import results_path; print(results_path())')"
