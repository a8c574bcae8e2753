#!/usr/bin/env bash
# Create (or reuse) the lab's virtual environment at .venv and install the lab into it, pinned by
# scripts/constraints.txt. Sourced by run-lab.sh and test.sh; safe to run twice.
#   EXTRAS            pip extras to install. Default: what the profile needs: gpu,notebooks (datasets, deepspeed,
#                     bitsandbytes; JupyterLab) with LAB_PROFILE=gpu or, without LAB_PROFILE, where nvidia-smi lists
#                     a GPU; the wheelhouse's own with LAB_WHEELHOUSE; else dev (the tests' set, JupyterLab included)
#   LAB_VENV          where the venv lives (default: .venv)
#   LAB_BASE_PYTHON   the interpreter the venv is made from (default: the first of python3, python3.13,
#                     python3.12, python3.11 that is >= 3.11)
#   LAB_WHEELHOUSE    install offline (pip --no-index) from this folder, built elsewhere with
#                     `python -m lab_helpers wheelhouse`; implies LAB_SYSTEM_TORCH=1 (it holds no torch)
#   LAB_SYSTEM_TORCH  1: keep LAB_BASE_PYTHON's torch (a node's CUDA build) instead of installing one: the venv
#                     sees the base's site-packages after its own, and torch's pin is not applied
#   LAB_INSTALLER     uv (default: uv from PATH or pip-installed into the venv, falling back to pip) or pip
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LAB_VENV:-$repo/.venv}"

lab_python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

lab_python_ok() {
    local version
    version=$(lab_python_version "$1") || return 1
    [[ $version =~ ^3\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 11))
}

# The interpreter to make the venv from, checked first: Ubuntu 22.04's python3 is 3.10.
lab_find_python() {
    local candidate
    if [[ -n ${LAB_BASE_PYTHON:-} ]]; then
        if lab_python_ok "$LAB_BASE_PYTHON"; then echo "$LAB_BASE_PYTHON"; return; fi
        echo "setup: LAB_BASE_PYTHON=$LAB_BASE_PYTHON is Python $(lab_python_version "$LAB_BASE_PYTHON" || echo '(not runnable)'); the lab needs >= 3.11" >&2
        return 1
    fi
    for candidate in python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null && lab_python_ok "$candidate"; then echo "$candidate"; return; fi
    done
    echo "setup: the lab needs Python >= 3.11 with venv (python3 here is $(lab_python_version python3 || echo 'missing')): Ubuntu 22.04: sudo apt-get install python3.11 python3.11-venv, or python3.12 from the deadsnakes PPA (sudo add-apt-repository ppa:deadsnakes/ppa); or conda: conda env create -f environment.yml" >&2
    return 1
}

# pip's configuration (index, extra indexes, find-links, global constraints) as uv arguments, one per line: uv
# does not read pip.conf or PIP_*, and must install from the same places pip would.
lab_pip_settings_for_uv() {
    local key value item
    while IFS='=' read -r key value; do
        value=${value#\'}; value=${value%\'}
        for item in $value; do
            case "${key##*.}" in
                index-url) printf '%s\n' --index-url "$item" ;;
                extra-index-url) [[ $item == file://* && ! -d ${item#file://} ]] || printf '%s\n' --extra-index-url "$item" ;;
                find-links) [[ $item == */* && ! -e $item && $item != *://* ]] || printf '%s\n' --find-links "$item" ;;
                constraint) printf '%s\n' -c "$item" ;;
            esac
        done
    done < <("$venv/bin/python" -m pip config list 2>/dev/null)
}

# Install with uv (the same pins; under a minute on 2 cores where pip takes two and a half):
# uv from PATH, else pip-installed into the venv. Returns non-zero (and the caller falls back to pip) when uv
# cannot be had or fails; LAB_INSTALLER=pip skips it. Not over a node's torch (LAB_SYSTEM_TORCH=1): uv counts only
# the venv's own packages as installed and would install a second torch beside the node's.
lab_uv_install() {
    local uv settings=()
    [[ ${LAB_INSTALLER:-uv} == uv && $system_torch != 1 ]] || return 1
    if ! uv=$(command -v uv); then
        "$venv/bin/python" -m pip install --quiet --no-compile -c "$repo/scripts/constraints.txt" uv >/dev/null 2>&1 || return 1
        uv="$venv/bin/uv"
        [[ -x $uv ]] || return 1
    fi
    mapfile -t settings < <(lab_pip_settings_for_uv)
    # Where PYTHONDONTWRITEBYTECODE is set (CI images, some containers) Python never writes .pyc itself, and every
    # process would compile torch and litgpt again (15 s per import, not 6): compile everything now, as pip does
    # (a minute on 2 cores). Elsewhere the first import writes what is used.
    [[ -z ${PYTHONDONTWRITEBYTECODE:-} ]] || settings+=(--compile-bytecode)
    # unsafe-best-match: pip's way, the best version from any index (uv's own stops at the first that has the name).
    if ! "$uv" pip install --quiet --python "$venv/bin/python" --index-strategy unsafe-best-match \
        "${settings[@]}" "$@"; then
        echo "setup: uv could not install the lab; trying pip" >&2
        return 1
    fi
}

wheelhouse="${LAB_WHEELHOUSE:-}"
if [[ -n $wheelhouse ]]; then
    if ! wheelhouse=$(cd "$wheelhouse" 2>/dev/null && pwd) || [[ ! -f $wheelhouse/manifest.json ]]; then
        echo "setup: LAB_WHEELHOUSE=$LAB_WHEELHOUSE is no finished wheelhouse (no manifest.json); build one with: python -m lab_helpers wheelhouse --python X.Y --dest DIR" >&2
        exit 1
    fi
fi
system_torch="${LAB_SYSTEM_TORCH:-$([[ -n $wheelhouse ]] && echo 1 || echo 0)}"

lab_default_extras() {
    if [[ -n $wheelhouse ]]; then cat "$wheelhouse/lab-extras.txt"; return; fi
    case "${LAB_PROFILE:-}" in
        gpu) echo gpu,notebooks ;;
        ci) echo dev ;;
        *) if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then echo gpu,notebooks; else echo dev; fi ;;
    esac
}
extras="${EXTRAS:-$(lab_default_extras)}"

if [[ ! -x "$venv/bin/python" ]]; then
    base=$(lab_find_python) || exit 1
    echo "setup: creating $venv with $base (Python $(lab_python_version "$base"))"
    if ! "$base" -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        version=$(lab_python_version "$base")
        echo "setup: $base (Python $version) cannot create a virtual environment (no venv/ensurepip): Debian/Ubuntu: sudo apt-get install python$version-venv; or conda: conda env create -f environment.yml" >&2
        exit 1
    fi
fi

if [[ $system_torch == 1 ]]; then
    # The base's site-packages after the venv's own (what --system-site-packages does, also when the base is
    # itself a venv, where that flag would not reach the base venv's packages).
    site_dir=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [[ ! -f $site_dir/lab-system-torch.pth ]]; then
        base=$(lab_find_python) || exit 1
        if ! "$base" -c 'import torch' 2>/dev/null; then
            echo "setup: LAB_SYSTEM_TORCH=1 but $base cannot import torch; set LAB_BASE_PYTHON to the python that has the node's torch" >&2
            exit 1
        fi
        if [[ $(lab_python_version "$base") != $(lab_python_version "$venv/bin/python") ]]; then
            echo "setup: $venv is Python $(lab_python_version "$venv/bin/python") but $base (with torch) is $(lab_python_version "$base"); remove $venv and run again" >&2
            exit 1
        fi
        mkdir -p "$site_dir"
        "$base" -c 'import site, sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' >"$site_dir/lab-system-torch.pth"
        echo "setup: $venv uses the torch of $base"
    fi
fi

if [[ -n $wheelhouse ]]; then
    constraints="$wheelhouse/manifest.json"  # no pins to apply offline: the stamp follows the wheelhouse's content
elif [[ $system_torch == 1 ]]; then
    constraints="$venv/lab-constraints.txt"
    grep -v '^torch==' "$repo/scripts/constraints.txt" >"$constraints"
else
    constraints="$repo/scripts/constraints.txt"
fi

# Each step checks its own exit status: a caller's `source setup-env.sh && ...` turns errexit off in here.
stamp="$venv/.lab-installed-$({ cat "$repo/pyproject.toml" "$constraints"; echo "$extras $wheelhouse $system_torch"; } | sha256sum | cut -c1-16)"
if [[ -f "$stamp" ]]; then
    echo "setup: $venv is up to date"
elif [[ -n $wheelhouse ]]; then
    echo "setup: installing the lab [$extras] into $venv offline from $wheelhouse"
    built_for=$(grep -o '"python": "[0-9.]*"' "$wheelhouse/manifest.json" | cut -d'"' -f4)
    if [[ $built_for != $(lab_python_version "$venv/bin/python") ]]; then
        echo "setup: $wheelhouse is for Python $built_for but $venv is Python $(lab_python_version "$venv/bin/python"); build it with --python $(lab_python_version "$venv/bin/python")" >&2
        exit 1
    fi
    wheels=("$wheelhouse"/*.whl)
    [[ -f ${wheels[0]} ]] || { echo "setup: $wheelhouse holds no wheels" >&2; exit 1; }
    # Exactly the set resolved when the wheelhouse was built, with no resolving here: pip would otherwise also
    # re-check the node's torch against its own CUDA requirements, and a node's hand-installed CUDA wheels
    # need not match them. The venv's copies come before the node's packages (a newer huggingface_hub, say).
    "$venv/bin/python" -m pip install --quiet --no-index --no-deps "${wheels[@]}" || exit 1
    "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheelhouse" --no-deps -e "$repo" || exit 1
    rm -f "$venv"/.lab-installed-*
    touch "$stamp"
else
    echo "setup: installing the lab [$extras] into $venv (a minute or two)"
    if ! lab_uv_install "-c" "$constraints" -e "${repo}[${extras}]"; then
        "$venv/bin/python" -m pip install --quiet --upgrade pip || exit 1
        "$venv/bin/python" -m pip install --quiet -c "$constraints" -e "${repo}[${extras}]" || exit 1
    fi
    rm -f "$venv"/.lab-installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
