#!/usr/bin/env bats
# provision-node.sh against stub commands: nothing here touches the real /etc, apt, Docker or a GPU.

load helpers

# Commands that change a node; a dry run or a second run must call none of them.
CHANGING='^(apt-get|curl|gpg --batch --yes|nvidia-ctk|usermod|systemctl (restart|enable)|docker run)'

setup() {
    setup_stubs
    os_release ubuntu 24.04 noble
    SCRIPT=$PROVISIONING_DIR/provision-node.sh
}

@test "fresh node: repositories, packages, runtime, cgroup driver, group, restart, GPU check" {
    run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 0 ]
    called '^curl -fsSL https://download.docker.com/linux/ubuntu/gpg -o .*/etc/apt/keyrings/docker.asc'
    called '^curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey'
    called '^gpg --batch --yes --dearmor -o .*/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg'
    called '^apt-get -o DPkg::Lock::Timeout=600 update'
    called '^apt-get .* install -y docker-ce docker-ce-cli containerd.io docker-buildx-plugin docker-compose-plugin nvidia-container-toolkit$'
    called '^nvidia-ctk runtime configure --runtime=docker --config=.*/etc/docker/daemon.json'
    called '^usermod -aG docker student$'
    called '^systemctl restart docker$'
    called '^docker run --rm --pull missing --gpus all nvidia/cuda:12.6.3-base-ubuntu24.04 nvidia-smi -L$'
    grep -qx 'deb \[arch=amd64 signed-by=/etc/apt/keyrings/docker.asc\] https://download.docker.com/linux/ubuntu noble stable' \
        "$PROVISION_ROOT/etc/apt/sources.list.d/docker.list"
    # shellcheck disable=SC2016 # $(ARCH) is apt's variable, written literally
    grep -qxF 'deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /' \
        "$PROVISION_ROOT/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    python3 - "$PROVISION_ROOT/etc/docker/daemon.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
assert "nvidia" in cfg["runtimes"], cfg
assert cfg["exec-opts"] == ["native.cgroupdriver=cgroupfs"], cfg
PY
    [[ $output == *"GPU check passed: the container sees all 2 GPU(s)"* ]]
    [[ $output == *"change(s):"* ]]
    # The apt keys are fetched before apt-get update, and Docker restarts before the GPU check.
    [ "$(grep -nE '^curl .*docker' "$STUB_LOG" | cut -d: -f1)" -lt "$(grep -n '^apt-get .* update' "$STUB_LOG" | cut -d: -f1)" ]
    [ "$(grep -n '^systemctl restart' "$STUB_LOG" | cut -d: -f1)" -lt "$(grep -n '^docker run' "$STUB_LOG" | cut -d: -f1)" ]
}

@test "signing keys: checked against the published fingerprint; a key cut off half-way is fetched again" {
    run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    [[ $output == *"added signing key /etc/apt/keyrings/docker.asc (fingerprint 9DC858229FC7DD38854AE2D88D81803C0EBFCD88)"* ]]
    # A download cut off half-way (the earlier script kept it forever, since the file was not empty).
    echo "stub key from curl, cut off" >"$PROVISION_ROOT/etc/apt/keyrings/docker.asc"
    : >"$STUB_LOG"
    run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"signing key /etc/apt/keyrings/docker.asc is damaged or not the published one"* ]]
    called '^curl -fsSL https://download.docker.com/linux/ubuntu/gpg -o .*/etc/apt/keyrings/docker.asc\.'
    grep -q "end of key" "$PROVISION_ROOT/etc/apt/keyrings/docker.asc"
}

@test "signing keys: a key with another fingerprint, or a cut-off download, is refused and nothing is installed" {
    STUB_WRONG_KEY=1 run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"not the published 9DC858229FC7DD38854AE2D88D81803C0EBFCD88; nothing was installed"* ]]
    [ ! -e "$PROVISION_ROOT/etc/apt/keyrings/docker.asc" ]
    [ -z "$(ls "$PROVISION_ROOT/etc/apt/keyrings/")" ] # no temporary file left behind
    STUB_CURL_CUT=1 run "$SCRIPT" --user student
    [ "$status" -ne 0 ]
    [ ! -e "$PROVISION_ROOT/etc/apt/keyrings/docker.asc" ]
}

@test "already provisioned node: second run changes nothing and says so" {
    run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    before=$(cd "$PROVISION_ROOT" && find . -type f -exec sha256sum {} + | sort)
    : >"$STUB_LOG"

    run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"Summary: nothing changed."* ]]
    [[ $output == *"already installed: docker-ce"* ]]
    [[ $output == *"already in the docker group: student (no change)"* ]]
    [[ $output == *"native.cgroupdriver=cgroupfs"*"(no change)"* ]]
    not_called '^(apt-get|curl|gpg --batch --yes|nvidia-ctk|usermod|systemctl (restart|enable))'
    # Only the read-only GPU check runs again.
    called '^docker run --rm --pull missing --gpus all .* nvidia-smi -L$'
    [ "$(cd "$PROVISION_ROOT" && find . -type f -exec sha256sum {} + | sort)" == "$before" ]
}

@test "a run stopped after Docker's configuration changed: the next run still restarts Docker" {
    # The first run stops at the docker group (usermod fails), after daemon.json changed, before the restart.
    # shellcheck disable=SC2016 # the stub's own $*, written literally
    printf '#!/usr/bin/env bash\necho "usermod $*" >>"$STUB_LOG"\necho "usermod: user does not exist" >&2\nexit 6\n' \
        >"$STUB_BIN/usermod"
    run "$SCRIPT" --user student
    [ "$status" -eq 1 ]
    not_called '^systemctl restart'
    cp "$BATS_TEST_DIRNAME/stubs/usermod" "$STUB_BIN/usermod"
    : >"$STUB_LOG"

    run "$SCRIPT" --dry-run --user student
    [ "$status" -eq 0 ]
    [[ $output == *"would run: systemctl restart docker"* ]]
    run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"stopped before restarting it"* ]]
    called '^systemctl restart docker$'
    [[ $output != *"already running: docker"* ]]
    # Restarted once: a third run has nothing left to do.
    : >"$STUB_LOG"
    run "$SCRIPT" --user student
    [[ $output == *"Summary: nothing changed."* ]]
    not_called '^systemctl restart'
}

@test "a --user that does not exist is refused before anything changes, also in a dry run" {
    export STUB_NO_SUCH_USERS=stdent
    run "$SCRIPT" --user stdent
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"no user named 'stdent' on this node: nothing was changed."* ]]
    not_called "$CHANGING"
    run "$SCRIPT" --dry-run --user stdent
    [ "$status" -eq 1 ]
    [[ $output == *"no user named 'stdent'"* ]]
}

@test "a minimal image without curl or gnupg gets them before the keys are fetched" {
    rm "$STUB_STATE/pkg/curl" "$STUB_STATE/pkg/gnupg"
    run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    called '^apt-get .* install -y curl gnupg$'
    [ "$(grep -n 'install -y curl gnupg' "$STUB_LOG" | cut -d: -f1)" -lt "$(grep -n '^curl ' "$STUB_LOG" | head -1 | cut -d: -f1)" ]
}

@test "a Docker that is stopped is started, without counting as reconfigured" {
    run "$SCRIPT" --user student
    : >"$STUB_LOG"
    STUB_DOCKER_STOPPED=1 run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    called '^systemctl enable --now docker$'
    not_called '^systemctl restart'
}

@test "dry run: prints every changing command and runs none" {
    run "$SCRIPT" --dry-run --user student
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"would run: curl -fsSL https://download.docker.com/linux/ubuntu/gpg"* ]]
    [[ $output == *"would run: env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y docker-ce"* ]]
    [[ $output == *"would run: nvidia-ctk runtime configure --runtime=docker"* ]]
    [[ $output == *"would run: python3 "*"daemon_json.py set-cgroupfs"* ]]
    [[ $output == *"would run: usermod -aG docker student"* ]]
    [[ $output == *"would run: systemctl enable --now docker"* ]]
    [[ $output == *"would run: docker run --rm --pull missing --gpus all"* ]]
    [[ $output == *"would write "*"/etc/apt/sources.list.d/docker.list"* ]]
    [[ $output == *"nothing was changed"* ]]
    not_called "$CHANGING"
    # Nothing was written under the scratch root except the os-release the test put there.
    [ "$(cd "$PROVISION_ROOT" && find . -type f)" == "./etc/os-release" ]
}

@test "dry run needs no root, a real run does" {
    STUB_UID=1000 run "$SCRIPT" --dry-run
    [ "$status" -eq 0 ]
    STUB_UID=1000 run "$SCRIPT"
    [ "$status" -ne 0 ]
    [[ $output == *"must run as root"* ]]
    not_called "$CHANGING"
}

@test "non-Ubuntu host is refused, saying what is supported" {
    os_release debian 12 bookworm
    run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"only Ubuntu 22.04 and 24.04 are supported"* ]]
    not_called "$CHANGING"
}

@test "an unsupported Ubuntu release is refused" {
    os_release ubuntu 20.04 focal
    run "$SCRIPT"
    [ "$status" -eq 1 ]
    [[ $output == *"only Ubuntu 22.04 and 24.04"* ]]
}

@test "Ubuntu 22.04 is supported and gets the jammy Docker repository" {
    os_release ubuntu 22.04 jammy
    run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    grep -q ' jammy stable$' "$PROVISION_ROOT/etc/apt/sources.list.d/docker.list"
}

@test "no NVIDIA driver (nvidia-smi missing) is refused with how to fix it" {
    rm "$STUB_BIN/nvidia-smi"
    PATH=$STUB_BIN:/usr/bin:/bin run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"no NVIDIA driver"* ]]
    [[ $output == *"ubuntu-drivers install"* ]]
    not_called "$CHANGING"
}

@test "a driver that does not answer is refused with nvidia-smi's message" {
    STUB_NO_DRIVER=1 run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"couldn't communicate with the NVIDIA driver"* ]]
    [[ $output == *"ubuntu-drivers install"* ]]
    not_called "$CHANGING"
}

@test "an apt failure stops the run and shows apt's own message" {
    STUB_APT_FAIL="Unable to locate package nvidia-container-toolkit" run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -ne 0 ]
    [[ $output == *"E: Unable to locate package nvidia-container-toolkit"* ]]
    [[ $output == *"command failed (exit 100): env DEBIAN_FRONTEND=noninteractive apt-get"* ]]
    not_called '^(nvidia-ctk|usermod|systemctl restart|docker run)'
}

@test "Ubuntu's docker.io is refused rather than silently replaced" {
    touch "$STUB_STATE/pkg/docker.io"
    run "$SCRIPT" --user student
    [ "$status" -eq 1 ]
    [[ $output == *"conflict with Docker's own: docker.io"* ]]
    not_called '^apt-get'
}

@test "GPU check fails when a container sees fewer GPUs than the host" {
    STUB_GPUS=4 STUB_CONTAINER_GPUS=1 run "$SCRIPT" --user student
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"the container sees 1 of the host's 4 GPU(s)"* ]]
}

@test "an existing daemon.json keeps its settings; a conflicting cgroup driver is replaced" {
    mkdir -p "$PROVISION_ROOT/etc/docker"
    echo '{"log-driver": "json-file", "exec-opts": ["native.cgroupdriver=systemd"]}' >"$PROVISION_ROOT/etc/docker/daemon.json"
    run "$SCRIPT" --user student
    [ "$status" -eq 0 ]
    python3 - "$PROVISION_ROOT/etc/docker/daemon.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
assert cfg["log-driver"] == "json-file", cfg
assert cfg["exec-opts"] == ["native.cgroupdriver=cgroupfs"], cfg
assert "nvidia" in cfg["runtimes"], cfg
PY
}

@test "a daemon.json that is not JSON is left alone and reported" {
    mkdir -p "$PROVISION_ROOT/etc/docker"
    echo '{ not json' >"$PROVISION_ROOT/etc/docker/daemon.json"
    run "$SCRIPT" --user student
    [ "$status" -eq 1 ]
    [[ $output == *"is not valid JSON"* ]]
    [ "$(cat "$PROVISION_ROOT/etc/docker/daemon.json")" == '{ not json' ]
}

@test "unknown flag: a clear error and usage hint, exit 2" {
    run "$SCRIPT" --frobnicate
    [ "$status" -eq 2 ]
    [[ $output == *"unknown argument: --frobnicate"* ]]
    [[ $output == *"--help"* ]]
    [ ! -s "$STUB_LOG" ]
}

@test "a flag missing its value is a clear error" {
    run "$SCRIPT" --user
    [ "$status" -eq 2 ]
    [[ $output == *"--user needs a user name"* ]]
}

@test "--help prints usage and exits 0" {
    run "$SCRIPT" --help
    [ "$status" -eq 0 ]
    [[ $output == *"Usage: sudo provision-node.sh"* ]]
    [[ $output == *"--dry-run"* ]]
}
