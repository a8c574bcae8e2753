#!/usr/bin/env bash
# Start the lab's JupyterLab in its container on this (provisioned) node and print how to reach it.
#
# JupyterLab listens on this node's 127.0.0.1 only and asks for a token; students reach it through an SSH
# tunnel. The checkout is mounted into the container, so notebooks, results/ and checkpoints/ survive a
# container restart. Safe to run again: a running lab is left alone and its URL printed again.
set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
. "$HERE/lib.sh"

LAB_DIR=$(cd "$HERE/.." && pwd)
IMAGE=${LAB_IMAGE:-lab-helpers:latest}
NAME=lab
PORT=8888
BUILD=0
SSH_HOST=
MOUNT=/home/jovyan/lab
TOKEN_FILE=${LAB_TOKEN_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/lab-helpers/jupyter-token}
WAIT_SECONDS=${LAB_WAIT_SECONDS:-120}
SHM_SIZE=${LAB_SHM_SIZE:-16g}

usage() {
    cat <<EOF
Usage: $PROG [--image IMAGE] [--build] [--name NAME] [--port PORT] [--ssh-host HOST] [--lab-dir DIR] [--dry-run]

Builds the lab image if it is missing, starts JupyterLab in a container (all GPUs, --shm-size $SHM_SIZE for
multi-GPU shared memory (env LAB_SHM_SIZE), the checkout mounted at $MOUNT), waits until it answers, and
prints the SSH tunnel command and the URL. JupyterLab listens on 127.0.0.1 only; nothing is published on a
public interface. A container started with another port or token is recreated. Run it as the lab user, not root.

  --image IMAGE    image to run (default: $IMAGE; env LAB_IMAGE); built from provisioning/Dockerfile if absent
  --build          rebuild the image even if it exists (then restart the lab to use it: docker rm -f $NAME)
  --name NAME      container name (default: $NAME)
  --port PORT      JupyterLab port on this node's 127.0.0.1 (default: $PORT)
  --ssh-host HOST  address students ssh to, for the printed tunnel command (default: this host's name)
  --lab-dir DIR    the lab checkout to mount (default: $LAB_DIR)
  --dry-run        print the commands that would change anything; change nothing
  -h, --help       this help

The token is kept in $TOKEN_FILE (mode 600) so the URL stays the same across restarts.
Set HF_TOKEN in the environment to pass a Hugging Face token into the container (never printed).
EOF
}

parse_args() {
    while (($#)); do
        case $1 in
            --dry-run) DRY_RUN=1 ;;
            --build) BUILD=1 ;;
            --image | --name | --port | --ssh-host | --lab-dir)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    --image) IMAGE=$2 ;;
                    --name) NAME=$2 ;;
                    --port) PORT=$2 ;;
                    --ssh-host) SSH_HOST=$2 ;;
                    --lab-dir) LAB_DIR=$(cd "$2" 2>/dev/null && pwd) || usage_error "no such folder: $2" ;;
                esac
                shift
                ;;
            *) help_or_unknown "$1" ;;
        esac
        shift
    done
    if [[ ! $PORT =~ ^[0-9]{1,5}$ ]] || ((10#$PORT < 1 || 10#$PORT > 65535)); then
        usage_error "--port needs a number from 1 to 65535, not: $PORT"
    fi
    PORT=$((10#$PORT)) # 08888 is 8888, in the URL too
    # Not a number ("2m"), the wait's arithmetic fails, reads as "not yet", and it would wait forever.
    [[ $WAIT_SECONDS =~ ^[0-9]+$ ]] || usage_error "LAB_WAIT_SECONDS needs a whole number of seconds, not: $WAIT_SECONDS"
}

# Right after provision-node.sh adds us to the docker group, this login session does not have it yet:
# `sg docker` runs this script again with the group, so no re-login is needed.
ensure_docker_access() {
    docker info >/dev/null 2>&1 && return 0
    local me
    me=$(id -un)
    if [[ -z ${LAB_VIA_SG:-} ]] && id -nG "$me" | tr ' ' '\n' | grep -qx docker; then
        say "Using the docker group you were just added to (sg docker)."
        LAB_VIA_SG=1 exec sg docker -c "$(quote "$0" "${ARGS[@]}")"
    fi
    ((DRY_RUN)) && {
        warn "cannot talk to Docker; showing what a fresh start would do"
        return 0
    }
    die "cannot talk to Docker as $me." \
        "Provision this node first: sudo $HERE/provision-node.sh" \
        "(if it was just provisioned, log out and back in so the docker group applies)."
}

# The token survives restarts in a file only its owner can read; it is passed to the container through
# the environment (docker run -e JUPYTER_TOKEN), so it never shows up in a command line or in `ps`.
load_token() {
    local saved=
    if [[ -s $TOKEN_FILE ]]; then
        check_token_file
        saved=$(<"$TOKEN_FILE")
        # Blank lines are no token: given an empty JUPYTER_TOKEN, Jupyter makes its own, and the printed URL
        # (token=) would never work, on this run or the next. A new token replaces them.
        [[ $saved =~ [^[:space:]] ]] || say "the token file $TOKEN_FILE holds no token, only blank lines"
    fi
    if [[ $saved =~ [^[:space:]] ]]; then
        JUPYTER_TOKEN=$saved
    elif ((DRY_RUN)); then
        say "would create a random token in $TOKEN_FILE"
        JUPYTER_TOKEN='<new-token>'
    else
        mkdir -p "$(dirname "$TOKEN_FILE")"
        JUPYTER_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
        (
            umask 077
            printf '%s\n' "$JUPYTER_TOKEN" >"$TOKEN_FILE"
        )
        chmod 600 "$TOKEN_FILE" # umask does not change the mode of a file that already existed (empty)
        say "+ created a random token in $TOKEN_FILE"
    fi
    export JUPYTER_TOKEN
}

# An existing token file must be ours and readable by us alone: a 644 file (copied, or made by hand) is made
# 600; one that is someone else's, or that stays readable by others, is refused -- its token may be known.
check_token_file() {
    local mode
    [[ -O $TOKEN_FILE ]] || die "the token file $TOKEN_FILE belongs to uid $(stat -c %u "$TOKEN_FILE"), not to you." \
        "Remove it (a new token is made) or pass another file: LAB_TOKEN_FILE=PATH $PROG"
    mode=$(stat -c %a "$TOKEN_FILE")
    if [[ $mode != 600 && $mode != 400 ]]; then
        if ((DRY_RUN)); then
            say "would run: chmod 600 $TOKEN_FILE (it is mode $mode: others can read the token)"
            return 0
        fi
        chmod 600 "$TOKEN_FILE"
        mode=$(stat -c %a "$TOKEN_FILE")
        [[ $mode == 600 ]] || die "the token file $TOKEN_FILE stays mode $mode: others can read the token." \
            "Remove it so a new one is made: rm $TOKEN_FILE"
        warn "the token file was readable by others; it is 600 now (consider a new token: rm $TOKEN_FILE)"
    fi
}

ensure_image() {
    if ((!BUILD)) && docker image inspect "$IMAGE" >/dev/null 2>&1; then
        unchanged "have image $IMAGE"
        return 0
    fi
    say "Building $IMAGE (the first build downloads PyTorch and CUDA libraries: expect 10-20 minutes)."
    run docker build -f "$HERE/Dockerfile" -t "$IMAGE" "$LAB_DIR"
    changed "built image $IMAGE"
}

# The container is labelled with the port and a hash of the token it was started with: a container started
# with another port or token would make the printed URL wrong, so it is recreated.
ensure_container() {
    local running wanted current
    running=$(docker container inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null || true)
    wanted="$PORT $(token_hash)"
    if [[ $running == true || $running == false ]]; then
        current=$(docker container inspect -f '{{index .Config.Labels "lab.port"}} {{index .Config.Labels "lab.token-sha256"}}' "$NAME" 2>/dev/null || true)
        if [[ $current != "$wanted" ]]; then
            say "The container $NAME was started with another port or token; recreating it."
            run docker rm -f "$NAME"
            running=
        fi
    fi
    case $running in
        true)
            unchanged "running: container $NAME"
            ;;
        false)
            run docker start "$NAME"
            changed "started the stopped container $NAME"
            ;;
        *)
            local env_args=(-e JUPYTER_TOKEN -e "LAB_HOME=$MOUNT")
            [[ -n ${HF_TOKEN:-} ]] && env_args+=(-e HF_TOKEN)
            # --network host + --ip=127.0.0.1: Jupyter listens on the host's loopback and nowhere else
            # (no -p: a published port would bypass the host firewall). --shm-size: NCCL and DataLoader
            # workers need far more shared memory than Docker's 64 MB default; every rank runs in this one
            # container, so they share its IPC namespace and --ipc host is not needed.
            # --ServerApp.port_retries=0: if the port is taken, fail instead of moving to the next one
            # (the readiness check and the printed URL would then point at someone else's server).
            run docker run -d --name "$NAME" --restart unless-stopped \
                --label "lab.port=$PORT" --label "lab.token-sha256=$(token_hash)" \
                --gpus all --shm-size "$SHM_SIZE" --ulimit memlock=-1 --ulimit stack=67108864 \
                --network host --user "$(id -u):$(id -g)" "${env_args[@]}" \
                -v "$LAB_DIR:$MOUNT" -v lab-cache:/home/jovyan/.cache -w "$MOUNT" \
                "$IMAGE" jupyter lab --ip=127.0.0.1 --port="$PORT" --ServerApp.port_retries=0 --no-browser \
                --ServerApp.root_dir="$MOUNT"
            changed "started container $NAME"
            ;;
    esac
}

# token_hash: the token's SHA-256, so a container's label can be compared without storing the token in it.
token_hash() {
    printf '%s' "$JUPYTER_TOKEN" | sha256sum | cut -c1-64
}

# The container runs as the calling user (files on the mount stay theirs); as root, Jupyter refuses to start
# without --allow-root and the container restarts in a loop. Refuse clearly instead.
refuse_root() {
    [[ $(id -u) != 0 ]] && return 0
    die "do not run $PROG as root (or with sudo): the lab runs as the user who starts it." \
        "Run it as the lab user, e.g.: sudo -u <lab user> $HERE/$PROG (that user needs the docker group: provision-node.sh --user)."
}

# Jupyter's /api answers without a token once the server is up.
wait_until_ready() {
    ((DRY_RUN)) && return 0
    local waited=0
    until curl -fsS -o /dev/null "http://127.0.0.1:$PORT/api"; do
        if ((waited >= WAIT_SECONDS)); then
            die "JupyterLab did not answer on 127.0.0.1:$PORT within ${WAIT_SECONDS}s." \
                "See what it says: docker logs $NAME"
        fi
        sleep 2
        waited=$((waited + 2))
    done
}

print_access() {
    local host=${SSH_HOST:-$(hostname -f 2>/dev/null || hostname)}
    cat <<EOF

JupyterLab is running in container '$NAME', on this node's 127.0.0.1:$PORT only.
1. On your own computer, open a tunnel (use the address you ssh to if it differs from $host):
     ssh -N -L $PORT:127.0.0.1:$PORT $(id -un)@$host
2. Then open:
     http://127.0.0.1:$PORT/lab?token=$JUPYTER_TOKEN
Your work is in $LAB_DIR (mounted at $MOUNT); stopping the container keeps it.
EOF
}

main() {
    ARGS=("$@")
    parse_args "$@"
    refuse_root
    ensure_docker_access
    load_token
    ensure_image
    ensure_container
    wait_until_ready
    summary
    print_access
}

main "$@"
