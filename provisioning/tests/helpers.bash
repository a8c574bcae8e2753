# shellcheck shell=bash
# Shared set-up for the provisioning bats tests: a scratch root, stub commands first on PATH, and a call log.

# shellcheck disable=SC2034 # used by the .bats files that load this
PROVISIONING_DIR=$(cd "$BATS_TEST_DIRNAME/.." && pwd)

setup_stubs() {
    # Settings from the caller's shell would change the scripts' defaults; each test sets what it needs.
    unset HF_TOKEN SUDO_USER OS_RELEASE_FILE LAB_IMAGE LAB_CHECKPOINTS LAB_DATA LAB_PYTHON LAB_TOKEN_FILE LAB_WAIT_SECONDS
    export STUB_LOG=$BATS_TEST_TMPDIR/calls.log
    export STUB_STATE=$BATS_TEST_TMPDIR/state
    export PROVISION_ROOT=$BATS_TEST_TMPDIR/root
    mkdir -p "$STUB_STATE/pkg" "$STUB_STATE/groups" "$PROVISION_ROOT/etc"
    # What an Ubuntu server image already has installed.
    touch "$STUB_STATE/pkg/ca-certificates" "$STUB_STATE/pkg/curl" "$STUB_STATE/pkg/gnupg"
    : >"$STUB_LOG"
    # A copy, so a test can take a command away (rm "$STUB_BIN/nvidia-smi") without touching the others.
    STUB_BIN=$BATS_TEST_TMPDIR/bin
    cp -R "$BATS_TEST_DIRNAME/stubs" "$STUB_BIN"
    export PATH=$STUB_BIN:$PATH
}

# os_release ID VERSION_ID [CODENAME]: write the scratch root's /etc/os-release.
os_release() {
    cat >"$PROVISION_ROOT/etc/os-release" <<OS
PRETTY_NAME="$1 $2"
ID=$1
VERSION_ID="$2"
VERSION_CODENAME=${3:-noble}
UBUNTU_CODENAME=${3:-noble}
OS
}

# called PATTERN: the call log has a line matching the extended regex PATTERN.
called() {
    grep -Eq -- "$1" "$STUB_LOG" || {
        echo "expected a call matching: $1" >&2
        echo "--- calls ---" >&2
        cat "$STUB_LOG" >&2
        return 1
    }
}

# not_called PATTERN: no line of the call log matches.
not_called() {
    if grep -Eq -- "$1" "$STUB_LOG"; then
        echo "unexpected call matching: $1" >&2
        grep -E -- "$1" "$STUB_LOG" >&2
        return 1
    fi
}
