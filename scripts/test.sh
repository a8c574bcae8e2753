#!/usr/bin/env bash
# The lab's test command (README "Tests", and what .ci/run runs): set up, then run every test and execute
# every notebook on the ci profile. Needs no GPU and no model hub.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

# System tools for the provisioning tests (Debian/Ubuntu package names); only installed when missing.
missing=()
for tool in shellcheck bats; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "test: installing ${missing[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "test: please install ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi

# The suite starts ~60 Python processes that import torch and litgpt. With PYTHONDONTWRITEBYTECODE (set on CI
# images) each would compile them from source again; without it the first import writes the .pyc for the rest
# (and setup-env.sh need not compile all of site-packages up front).
unset PYTHONDONTWRITEBYTECODE
EXTRAS=dev source scripts/setup-env.sh

export LAB_PROFILE=ci
python -m lab_helpers prepare --profile ci

results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
export LAB_RESULTS="$results"   # notebooks and tests record into a throw-away folder, never the student's
# Two workers (LAB_TEST_WORKERS=0 runs in one process), a whole file each: a notebook's cells share one kernel
# and run in order on one worker. (Not --dist loadgroup: pytest-xdist 3.8 cannot regroup items under pytest 9.2.)
# The notebooks go first: they are the longest files (minutes each), and files are handed out in order, so
# the short test files fill in around them instead of one worker running a notebook alone at the end.
# Each training process gets one thread, so that two workers' runs share the 2 cores instead of fighting.
workers="${LAB_TEST_WORKERS:-2}"
if [[ "$workers" != 0 ]]; then export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"; fi
python -m pytest notebooks tests --nbval-lax -p no:cacheprovider -n "$workers" --dist loadfile "$@"
