#!/usr/bin/env bash
# Turn a fresh Ubuntu 22.04/24.04 GPU node into a lab node: Docker Engine, the NVIDIA Container Toolkit,
# the NVML-safe cgroup driver, the user in the docker group, and a check that containers see every GPU.
#
# Safe to run twice: every step looks before it acts and says "already ... (no change)"; the last line says
# whether anything changed. Run `provision-node.sh --help` for the flags.
set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
. "$HERE/lib.sh"

# Tests point these at a scratch folder so they never touch the real /etc.
ROOT=${PROVISION_ROOT:-}
OS_RELEASE_FILE=${OS_RELEASE_FILE:-$ROOT/etc/os-release}
DAEMON_JSON=$ROOT/etc/docker/daemon.json
# Written when Docker's packages or configuration change, removed once Docker has restarted: a run stopped in
# between (killed, a failed step) leaves it, so the next run still restarts Docker instead of finding nothing to
# change. In /run: a reboot clears it, and a reboot restarts Docker anyway.
RESTART_PENDING=$ROOT/run/lab-provisioning/docker-restart-pending

DOCKER_KEY=/etc/apt/keyrings/docker.asc
DOCKER_LIST=/etc/apt/sources.list.d/docker.list
NVIDIA_KEY=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
# The fingerprints Docker's and NVIDIA's install documentation publish for these keys.
DOCKER_KEY_FINGERPRINT=9DC858229FC7DD38854AE2D88D81803C0EBFCD88
NVIDIA_KEY_FINGERPRINT=C95B321B61E88C1809C4F759DDCAE044F796ECB0
NVIDIA_LIST=/etc/apt/sources.list.d/nvidia-container-toolkit.list
PACKAGES=(docker-ce docker-ce-cli containerd.io docker-buildx-plugin docker-compose-plugin nvidia-container-toolkit)
# Small (about 100 MB), the CUDA of the lab image (Dockerfile); only used for the GPU check.
CHECK_IMAGE=nvidia/cuda:12.6.3-base-ubuntu24.04
LAB_USER=${SUDO_USER:-}

usage() {
    cat <<EOF
Usage: sudo $PROG [--user NAME] [--check-image IMAGE] [--dry-run]

Installs Docker Engine (Docker's apt repository) and the NVIDIA Container Toolkit (NVIDIA's apt repository),
runs 'nvidia-ctk runtime configure --runtime=docker', sets Docker's cgroup driver to cgroupfs (avoids
"Failed to initialize NVML: Unknown Error" after a systemctl daemon-reload), adds the user to the docker
group, restarts Docker only if its configuration changed, and checks that a container sees every GPU.

  --user NAME         who joins the docker group (default: the user who ran sudo: ${SUDO_USER:-none})
  --check-image IMAGE image for the GPU check (default: $CHECK_IMAGE)
  --dry-run           look at the node and print every command that would change it; change nothing
  -h, --help          this help

Needs Ubuntu 22.04 or 24.04 with the NVIDIA driver installed (nvidia-smi works).
EOF
}

parse_args() {
    while (($#)); do
        case $1 in
            --dry-run) DRY_RUN=1 ;;
            --user)
                (($# >= 2)) || usage_error "--user needs a user name"
                LAB_USER=$2
                shift
                ;;
            --check-image)
                (($# >= 2)) || usage_error "--check-image needs an image name"
                CHECK_IMAGE=$2
                shift
                ;;
            *) help_or_unknown "$1" ;;
        esac
        shift
    done
}

# --- preflight: refuse early and say how to fix -------------------------------------------------------------

check_os() {
    [[ -r $OS_RELEASE_FILE ]] || die "cannot read $OS_RELEASE_FILE: is this Ubuntu?" \
        "This script supports Ubuntu 22.04 and 24.04 only."
    local id version name
    # os-release is shell syntax by specification; read it in a subshell so it cannot clobber our variables.
    # shellcheck source=/dev/null
    IFS='|' read -r id version CODENAME name < <(
        . "$OS_RELEASE_FILE"
        printf '%s|%s|%s|%s\n' "${ID:-}" "${VERSION_ID:-}" "${UBUNTU_CODENAME:-${VERSION_CODENAME:-}}" "${PRETTY_NAME:-unknown}"
    )
    if [[ $id != ubuntu || ! $version =~ ^(22\.04|24\.04)$ ]]; then
        die "this host runs $name; only Ubuntu 22.04 and 24.04 are supported." \
            "Start the node from an Ubuntu 22.04 or 24.04 image (on Chameleon: CC-Ubuntu22.04-CUDA or CC-Ubuntu24.04-CUDA)."
    fi
    say "OK: $name ($CODENAME)"
}

check_driver() {
    local hint1="Install the NVIDIA driver, then reboot:"
    local hint2="  sudo apt-get install -y ubuntu-drivers-common && sudo ubuntu-drivers install --gpgpu && sudo reboot"
    local hint3="(or start the node from an image that has it, e.g. Chameleon's CC-Ubuntu24.04-CUDA), then run $PROG again."
    command -v nvidia-smi >/dev/null || die "no NVIDIA driver: nvidia-smi is not installed." "$hint1" "$hint2" "$hint3"
    local out
    out=$(nvidia-smi -L 2>&1) || die "the NVIDIA driver is not working: nvidia-smi says: $out" "$hint1" "$hint2" "$hint3"
    HOST_GPUS=$(grep -c '^GPU ' <<<"$out" || true)
    ((HOST_GPUS > 0)) || die "nvidia-smi lists no GPU: $out" "$hint1" "$hint2" "$hint3"
    say "OK: NVIDIA driver sees $HOST_GPUS GPU(s)"
}

check_root() {
    ((DRY_RUN)) && return 0 # looking needs no privileges
    [[ $(id -u) == 0 ]] || die "must run as root: sudo $PROG $*"
}

# A mistyped --user would otherwise stop the run at usermod, after every package was installed.
check_user() {
    [[ -z $LAB_USER || $LAB_USER == root ]] && return 0
    id -nG "$LAB_USER" >/dev/null 2>&1 || die "no user named '$LAB_USER' on this node: nothing was changed." \
        "Name an existing account with --user NAME (the lab user who joins the docker group)."
}

# --- apt repositories and packages ---------------------------------------------------------------------------

# fetch_key URL DEST FINGERPRINT [dearmor]: install a repository signing key, checked against the
# fingerprint its publisher documents. It goes to a temporary file first and is moved into place only once
# checked, so a download cut off half-way is never kept; an existing key that is damaged or is not the
# published one is fetched again.
fetch_key() {
    local url=$1 dest=$ROOT$2 fingerprint=$3 dearmor=${4:-}
    if [[ -s $dest ]] && [[ $(key_fingerprint "$dest") == "$fingerprint" ]]; then
        unchanged "have signing key $2"
        return 0
    fi
    [[ -e $dest ]] && say "the signing key $2 is damaged or not the published one ($fingerprint): fetching it again"
    run install -m 0755 -d "$(dirname "$dest")"
    if ((DRY_RUN)); then
        say "would run: curl -fsSL $url -o <temporary file>, check fingerprint $fingerprint, then move it to $2"
        return 0
    fi
    local tmp got
    tmp=$(mktemp "$dest.XXXXXX")
    run curl -fsSL "$url" -o "$tmp"
    got=$(key_fingerprint "$tmp")
    if [[ $got != "$fingerprint" ]]; then
        rm -f "$tmp"
        die "the key from $url has fingerprint ${got:-none}, not the published $fingerprint; nothing was installed." \
            "Check the publisher's install documentation; if the key was rotated, update the fingerprint in $PROG."
    fi
    if [[ $dearmor ]]; then
        # NVIDIA publishes an ASCII-armoured key; apt's signed-by wants it binary.
        run gpg --batch --yes --dearmor -o "$tmp.gpg" "$tmp"
        mv -f "$tmp.gpg" "$tmp"
    fi
    run chmod a+r "$tmp"
    run mv -f "$tmp" "$dest"
    changed "added signing key $2 (fingerprint $fingerprint)"
}

# key_fingerprint FILE: the primary key's fingerprint (armoured or binary), or nothing for a damaged file.
key_fingerprint() {
    gpg --batch --show-keys --with-colons "$1" 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }'
}

# ensure_list PATH LINE: an apt source file holding exactly LINE.
ensure_list() {
    local dest=$ROOT$1 line=$2
    if [[ -f $dest && $(<"$dest") == "$line" ]]; then
        unchanged "have apt source $1"
        return 0
    fi
    write_file "$dest" "$line"
    changed "wrote apt source $1"
}

setup_repositories() {
    local arch
    # Ubuntu server images ship these; minimal ones may not.
    ensure_packages "what fetching the repository keys needs" ca-certificates curl gnupg
    arch=$(dpkg --print-architecture)
    # Docker's documented repository setup for Ubuntu.
    fetch_key https://download.docker.com/linux/ubuntu/gpg "$DOCKER_KEY" "$DOCKER_KEY_FINGERPRINT"
    ensure_list "$DOCKER_LIST" \
        "deb [arch=$arch signed-by=$DOCKER_KEY] https://download.docker.com/linux/ubuntu $CODENAME stable"
    # NVIDIA's stable repository (one for all distributions): what its nvidia-container-toolkit.list holds,
    # with the keyring added, written directly so the result is the same on every run.
    fetch_key https://nvidia.github.io/libnvidia-container/gpgkey "$NVIDIA_KEY" "$NVIDIA_KEY_FINGERPRINT" dearmor
    ensure_list "$NVIDIA_LIST" \
        "deb [signed-by=$NVIDIA_KEY] https://nvidia.github.io/libnvidia-container/stable/deb/\$(ARCH) /"
}

is_installed() {
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# Ubuntu's own Docker packages clash with Docker's; removing them is the owner's call, so refuse and say how.
refuse_conflicting_packages() {
    local conflicts=() pkg
    for pkg in docker.io docker-compose docker-compose-v2 docker-doc podman-docker; do
        is_installed "$pkg" && conflicts+=("$pkg")
    done
    ((${#conflicts[@]} == 0)) || die "these packages conflict with Docker's own: ${conflicts[*]}" \
        "Remove them first (sudo apt-get remove ${conflicts[*]}), then run $PROG again."
}

# ensure_packages WHAT PKG...: install whichever of PKG are missing (apt-get update first: new repositories).
ensure_packages() {
    local what=$1 missing=() pkg
    shift
    for pkg in "$@"; do
        is_installed "$pkg" || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        unchanged "installed: $*"
        return 0
    fi
    # A fresh cloud node often runs unattended-upgrades at boot: wait for its dpkg lock instead of failing.
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
    run "${apt[@]}" update
    run "${apt[@]}" install -y "${missing[@]}"
    changed "installed $what: ${missing[*]}"
}

install_packages() {
    refuse_conflicting_packages
    local before=${#CHANGES[@]}
    ensure_packages "Docker and the NVIDIA Container Toolkit" "${PACKAGES[@]}"
    # New Docker or toolkit binaries are only picked up by a restarted daemon.
    ((${#CHANGES[@]} == before)) || restart_pending
}

# --- Docker configuration ------------------------------------------------------------------------------------

# daemon_has CHECK: ask daemon_json.py; exit code 2 (unreadable file) stops the script.
daemon_has() {
    local rc=0
    python3 "$HERE/daemon_json.py" "$1" "$DAEMON_JSON" || rc=$?
    ((rc < 2)) || die "cannot read $DAEMON_JSON (see above)"
    return "$rc"
}

configure_docker() {
    if daemon_has has-nvidia-runtime; then
        unchanged "configured: nvidia runtime in $DAEMON_JSON"
    else
        restart_pending
        run nvidia-ctk runtime configure --runtime=docker --config="$DAEMON_JSON"
        changed "added the nvidia runtime to $DAEMON_JSON"
    fi
    if daemon_has has-cgroupfs; then
        unchanged "configured: native.cgroupdriver=cgroupfs in $DAEMON_JSON"
    else
        restart_pending
        run python3 "$HERE/daemon_json.py" set-cgroupfs "$DAEMON_JSON"
        changed "set native.cgroupdriver=cgroupfs in $DAEMON_JSON (avoids NVML 'Unknown Error')"
    fi
}

# restart_pending: Docker must restart at the end of this run, or of the next one should this one stop first.
restart_pending() {
    RESTART_DOCKER=1
    ((DRY_RUN)) && return 0
    mkdir -p "$(dirname "$RESTART_PENDING")"
    : >"$RESTART_PENDING"
}

add_user_to_docker_group() {
    if [[ -z $LAB_USER || $LAB_USER == root ]]; then
        say "note: no non-root user named (--user NAME), so nobody was added to the docker group"
        return 0
    fi
    if id -nG "$LAB_USER" 2>/dev/null | tr ' ' '\n' | grep -qx docker; then
        unchanged "in the docker group: $LAB_USER"
        return 0
    fi
    run usermod -aG docker "$LAB_USER"
    changed "added $LAB_USER to the docker group (takes effect at their next login)"
}

restart_docker_if_needed() {
    if [[ -e $RESTART_PENDING ]] && ! ((RESTART_DOCKER)); then
        say "an earlier run changed Docker's packages or configuration and stopped before restarting it"
        RESTART_DOCKER=1
    fi
    if ! systemctl is-active --quiet docker; then
        run systemctl enable --now docker
        changed "started docker"
    elif ((RESTART_DOCKER)); then
        run systemctl restart docker
        changed "restarted docker to load its new configuration"
    else
        unchanged "running: docker, with this configuration"
    fi
    ((DRY_RUN)) || rm -f "$RESTART_PENDING"
}

# --- the proof: a container sees every GPU ---------------------------------------------------------------------

gpu_check() {
    local cmd=(docker run --rm --pull missing --gpus all "$CHECK_IMAGE" nvidia-smi -L)
    if ((DRY_RUN)); then
        run "${cmd[@]}"
        return 0
    fi
    say "+ $(quote "${cmd[@]}")"
    local out seen
    out=$("${cmd[@]}" 2>&1) || die "GPU check failed: the container could not run: $out" \
        "Look at: sudo journalctl -u docker --since '-10 min'; then: sudo systemctl restart docker"
    seen=$(grep -c '^GPU ' <<<"$out" || true)
    if ((seen != HOST_GPUS)); then
        die "GPU check failed: the container sees $seen of the host's $HOST_GPUS GPU(s):" "$out" \
            "Try: sudo systemctl restart docker, then run $PROG again."
    fi
    say "GPU check passed: the container sees all $HOST_GPUS GPU(s)"
}

main() {
    parse_args "$@"
    RESTART_DOCKER=0
    ((DRY_RUN)) && say "Dry run: looking only; commands that would change this node are printed, none run."
    check_os
    check_driver
    check_root "$@"
    check_user
    setup_repositories
    install_packages
    configure_docker
    add_user_to_docker_group
    restart_docker_if_needed
    gpu_check
    summary
    if [[ $LAB_USER && $LAB_USER != root ]] && ! ((DRY_RUN)); then
        say "Next, as $LAB_USER: provisioning/start-lab.sh (it starts JupyterLab and prints its URL)"
    fi
}

main "$@"
