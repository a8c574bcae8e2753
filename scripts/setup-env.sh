#!/usr/bin/env bash
# Create (or reuse) the lab's virtual environment at .venv and install the lab into it, pinned by
# scripts/constraints.txt. Sourced by run-lab.sh and test.sh; safe to run twice.
#   EXTRAS   pip extras to install (default: dev)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LAB_VENV:-$repo/.venv}"
extras="${EXTRAS:-dev}"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv"
    python3 -m venv "$venv"
fi
stamp="$venv/.lab-installed-$(cat "$repo/pyproject.toml" "$repo/scripts/constraints.txt" | sha256sum | cut -c1-16)-$extras"
if [[ -f "$stamp" ]]; then
    echo "setup: $venv is up to date"
else
    echo "setup: installing the lab [$extras] into $venv (a minute or two)"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -c "$repo/scripts/constraints.txt" -e "$repo[$extras]"
    rm -f "$venv"/.lab-installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
