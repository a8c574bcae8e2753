#!/usr/bin/env bash
# Open the lab's notebooks without Docker: JupyterLab from the lab's .venv, on this machine's 127.0.0.1 with a
# token, printing the SSH tunnel line and the URL (as provisioning/start-lab.sh does for the lab image).
#
# Why: only the Docker image had JupyterLab; a student on a leased node with a plain Python, or an instructor
# trying the lab on a laptop, could run run-lab.sh but not open a notebook. It uses .venv as run-lab.sh left it
# (setup-env.sh's default extras include [notebooks]; it runs setup-env.sh itself where .venv has no JupyterLab)
# and serves the checkout, so notebooks/ holds the five notebooks.
#
#   --port PORT        port on 127.0.0.1 (default 8888, env LAB_NOTEBOOK_PORT); a taken port is an error, never
#                      silently another one (the printed URL would point at someone else's server)
#   --ssh-host HOST    the address you ssh to, for the printed tunnel line (default: this host's name)
#   LAB_TOKEN_FILE     where the token is kept, mode 600, so the URL stays the same across restarts
#                      (default: ~/.config/lab-helpers/jupyter-token, the file start-lab.sh uses)
#   LAB_WAIT_SECONDS   how long to wait for JupyterLab to answer (default 120)
# It runs in the foreground: Ctrl-C stops JupyterLab (the running notebooks' kernels with it).
set -euo pipefail

PROG=${0##*/}
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port=${LAB_NOTEBOOK_PORT:-8888}
ssh_host=
token_file=${LAB_TOKEN_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/lab-helpers/jupyter-token}
wait_s=${LAB_WAIT_SECONDS:-120}

die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

while (($#)); do
    case $1 in
        --port | --ssh-host)
            (($# >= 2)) || die "$1 needs a value"
            case $1 in
                --port) port=$2 ;;
                --ssh-host) ssh_host=$2 ;;
            esac
            shift 2
            ;;
        -h | --help) sed -n '2,/^set -e/{/^set -e/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see $PROG --help)" ;;
    esac
done
[[ $port =~ ^[0-9]+$ ]] || die "--port needs a number, not: $port"

cd "$repo"
venv="${LAB_VENV:-$repo/.venv}"
if [[ ! -x $venv/bin/jupyter-lab ]]; then  # a venv from before the [notebooks] extra, or none yet
    # shellcheck source=scripts/setup-env.sh
    source scripts/setup-env.sh  # its default extras include [notebooks]: dev on a CPU, gpu,notebooks on a GPU
    [[ -x $venv/bin/jupyter-lab ]] || die "$venv has no JupyterLab (EXTRAS=$extras); run: EXTRAS=$extras,notebooks bash scripts/setup-env.sh"
fi

# The token: kept in a file only its owner can read, passed to Jupyter through the environment (never a command
# line, so never in `ps`).
if [[ -s $token_file ]]; then
    [[ -O $token_file ]] || die "the token file $token_file is not yours; remove it or set LAB_TOKEN_FILE"
    chmod 600 "$token_file"
else
    mkdir -p "$(dirname "$token_file")"
    (umask 077 && "$venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))' >"$token_file")
    chmod 600 "$token_file"
fi
JUPYTER_TOKEN=$(<"$token_file")
export JUPYTER_TOKEN

url="http://127.0.0.1:$port"
if curl -fsS -o /dev/null --max-time 2 "$url/api" 2>/dev/null; then
    die "something already answers on 127.0.0.1:$port (a JupyterLab started earlier?); stop it, or pass --port"
fi

root_args=()
# Jupyter refuses to run as root without --allow-root (a container or a CI job often is root).
[[ $(id -u) != 0 ]] || root_args=(--allow-root)
log="${LAB_RESULTS:-$repo/results}/jupyterlab.log"
mkdir -p "$(dirname "$log")"
"$venv/bin/jupyter-lab" --ip=127.0.0.1 --port="$port" --ServerApp.port_retries=0 --no-browser \
    --ServerApp.root_dir="$repo" "${root_args[@]}" >"$log" 2>&1 &
server=$!
# A background job of a script starts with SIGINT ignored: Ctrl-C reaches this script, which ends the server.
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; exit 130' INT
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; exit 143' TERM

waited=0
until curl -fsS -o /dev/null --max-time 2 "$url/api" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null; then
        tail -n 5 "$log" >&2
        die "JupyterLab stopped before it answered (the whole log: $log)"
    fi
    if ((waited >= wait_s)); then
        kill -TERM "$server" 2>/dev/null || true
        die "JupyterLab did not answer on 127.0.0.1:$port within ${wait_s}s (its log: $log)"
    fi
    sleep 1
    waited=$((waited + 1))
done

host=${ssh_host:-$(hostname -f 2>/dev/null || hostname)}
cat <<EOF

JupyterLab is running on this machine's 127.0.0.1:$port only (log: $log). Ctrl-C stops it.
1. From another computer, open a tunnel first (use the address you ssh to if it differs from $host):
     ssh -N -L $port:127.0.0.1:$port $(id -un)@$host
2. Then open (on this machine, directly):
     $url/lab/tree/notebooks?token=$JUPYTER_TOKEN
EOF
wait "$server"
