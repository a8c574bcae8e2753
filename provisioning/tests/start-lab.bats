#!/usr/bin/env bats
# start-lab.sh against a stub docker: image build, container flags, token handling, idempotency.

load helpers

setup() {
    setup_stubs
    export LAB_TOKEN_FILE=$BATS_TEST_TMPDIR/config/jupyter-token
    export LAB_WAIT_SECONDS=4
    export STUB_UID=1000 # the lab user, not root
    LAB=$BATS_TEST_TMPDIR/lab
    mkdir -p "$LAB"
    SCRIPT=$PROVISIONING_DIR/start-lab.sh
}

@test "first start: builds the image, runs JupyterLab on 127.0.0.1 only, prints tunnel and URL" {
    run "$SCRIPT" --lab-dir "$LAB" --ssh-host node1.example.org
    echo "$output"
    [ "$status" -eq 0 ]
    called "^docker build -f $PROVISIONING_DIR/Dockerfile -t lab-helpers:latest $LAB\$"
    run_line=$(grep '^docker run -d' "$STUB_LOG")
    [[ $run_line == *"--gpus all"* ]]
    [[ $run_line == *"--shm-size 16g"* && $run_line != *"--ipc host"* ]]
    [[ $run_line == *"--ServerApp.port_retries=0"* ]] # a taken port fails instead of moving to 8889
    [[ $run_line == *"--network host"* ]]
    [[ $run_line == *"--ip=127.0.0.1"* ]]
    [[ $run_line == *"-v $LAB:/home/jovyan/lab"* ]]
    [[ $run_line == *"-e JUPYTER_TOKEN "* ]]
    [[ $run_line == *"--restart unless-stopped"* ]]
    # Never published, never on a public interface.
    [[ $run_line != *" -p "* && $run_line != *"--publish"* && $run_line != *"0.0.0.0"* ]]
    token=$(cat "$LAB_TOKEN_FILE")
    [ "${#token}" -eq 48 ]
    [ "$(stat -c %a "$LAB_TOKEN_FILE")" = 600 ]
    # The token is in the printed URL but was never on a command line.
    [[ $output == *"ssh -N -L 8888:127.0.0.1:8888 "*"@node1.example.org"* ]]
    [[ $output == *"http://127.0.0.1:8888/lab?token=$token"* ]]
    not_called "$token"
    called '^curl -fsS -o /dev/null http://127.0.0.1:8888/api$'
}

@test "second start: nothing is rebuilt or restarted, same URL" {
    run "$SCRIPT" --lab-dir "$LAB"
    first_token=$(cat "$LAB_TOKEN_FILE")
    : >"$STUB_LOG"
    run "$SCRIPT" --lab-dir "$LAB"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"Summary: nothing changed."* ]]
    [[ $output == *"token=$first_token"* ]]
    not_called '^docker (build|run|start)'
}

@test "a stopped lab container is started again, not recreated" {
    run "$SCRIPT" --lab-dir "$LAB"
    echo false >"$STUB_STATE/container"
    : >"$STUB_LOG"
    run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 0 ]
    called '^docker start lab$'
    not_called '^docker (build|run)'
}

@test "--build rebuilds an existing image; --port and --name are honoured" {
    touch "$STUB_STATE/image"
    run "$SCRIPT" --lab-dir "$LAB" --build --port 9999 --name lab2
    [ "$status" -eq 0 ]
    called '^docker build '
    called '^docker run -d --name lab2 .*--port=9999'
    [[ $output == *"ssh -N -L 9999:127.0.0.1:9999"* ]]
}

@test "HF_TOKEN goes into the container by name; its value is never printed" {
    HF_TOKEN=hf_secret_value run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 0 ]
    called '^docker run -d .* -e HF_TOKEN '
    not_called hf_secret_value
    [[ $output != *hf_secret_value* ]]
}

@test "dry run: prints the build and run commands, runs neither, writes no token" {
    run "$SCRIPT" --lab-dir "$LAB" --dry-run
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"would run: docker build"* ]]
    [[ $output == *"would run: docker run -d --name lab"* ]]
    not_called '^docker (build|run|start)'
    [ ! -e "$LAB_TOKEN_FILE" ]
}

@test "just added to the docker group: re-runs itself through sg docker" {
    touch "$STUB_STATE/groups/student-docker"
    STUB_DOCKER_DENIED=1 run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 0 ]
    called "^sg docker -c .*start-lab.sh --lab-dir $LAB"
    not_called '^docker (build|run)'
}

@test "no access to Docker: says to provision the node first" {
    STUB_DOCKER_DENIED=1 run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 1 ]
    [[ $output == *"cannot talk to Docker"* ]]
    [[ $output == *"provision-node.sh"* ]]
}

@test "JupyterLab that never answers: an error pointing at docker logs" {
    STUB_CURL_FAIL=1 run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 1 ]
    [[ $output == *"did not answer on 127.0.0.1:8888"* ]]
    [[ $output == *"docker logs lab"* ]]
}

@test "unknown flag and bad values: clear errors, exit 2" {
    run "$SCRIPT" --public
    [ "$status" -eq 2 ]
    [[ $output == *"unknown argument: --public"* ]]
    run "$SCRIPT" --port http
    [ "$status" -eq 2 ]
    [[ $output == *"--port needs a number"* ]]
    # Not a port: refused at once, not a URL with :0 or a JupyterLab that never answers.
    for port in 0 65536 99999 123456; do
        run "$SCRIPT" --port "$port"
        [ "$status" -eq 2 ]
        [[ $output == *"--port needs a number from 1 to 65535, not: $port"* ]]
    done
    # A wait that is not a number ("2m") looped forever, its arithmetic failing as "not ready yet".
    for wait in 2m abc; do
        LAB_WAIT_SECONDS=$wait run "$SCRIPT" --lab-dir "$LAB"
        [ "$status" -eq 2 ]
        [[ $output == *"LAB_WAIT_SECONDS needs a whole number of seconds, not: $wait"* ]]
    done
    run "$SCRIPT" --image
    [ "$status" -eq 2 ]
    [[ $output == *"--image needs a value"* ]]
    [ ! -s "$STUB_LOG" ]
}

@test "a token file others can read is made 600; one that stays readable is refused" {
    mkdir -p "$(dirname "$LAB_TOKEN_FILE")"
    echo 0123456789abcdef0123456789abcdef0123456789abcdef >"$LAB_TOKEN_FILE"
    chmod 644 "$LAB_TOKEN_FILE"
    run "$SCRIPT" --lab-dir "$LAB"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(stat -c %a "$LAB_TOKEN_FILE")" = 600 ]
    [[ $output == *"readable by others; it is 600 now"* ]]
    # chmod that does not take (a file system without modes): refused, the token is not used
    printf '#!/usr/bin/env bash\nexit 0\n' >"$BATS_TEST_TMPDIR/bin/chmod" && chmod +x "$BATS_TEST_TMPDIR/bin/chmod"
    /bin/chmod 644 "$LAB_TOKEN_FILE"
    run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 1 ]
    [[ $output == *"stays mode 644: others can read the token"* ]]
}

@test "a token file of blank lines is replaced by a new token, never an empty token= URL" {
    mkdir -p "$(dirname "$LAB_TOKEN_FILE")"
    printf '\n  \n' >"$LAB_TOKEN_FILE"
    chmod 600 "$LAB_TOKEN_FILE"
    run "$SCRIPT" --lab-dir "$LAB" --dry-run
    [[ $output == *"holds no token"* && $output == *"would create a random token"* ]]
    run "$SCRIPT" --lab-dir "$LAB"
    echo "$output"
    [ "$status" -eq 0 ]
    token=$(cat "$LAB_TOKEN_FILE")
    [ "${#token}" -eq 48 ]
    [ "$(stat -c %a "$LAB_TOKEN_FILE")" = 600 ]
    [[ $output == *"/lab?token=$token"* && $output != *"token="$'\n'* ]]
}

@test "a container started with another port or token is recreated, so the printed URL is right" {
    run "$SCRIPT" --lab-dir "$LAB"
    [ "$status" -eq 0 ]
    : >"$STUB_LOG"
    run "$SCRIPT" --lab-dir "$LAB" --port 9999
    echo "$output"
    [ "$status" -eq 0 ]
    called '^docker rm -f lab$'
    called '^docker run -d --name lab .*--label lab.port=9999 .*--port=9999'
    [[ $output == *"http://127.0.0.1:9999/lab?token="* ]]
    # a new token (the old file removed): recreated again
    rm "$LAB_TOKEN_FILE"
    : >"$STUB_LOG"
    run "$SCRIPT" --lab-dir "$LAB" --port 9999
    [ "$status" -eq 0 ]
    called '^docker rm -f lab$'
    # same port and token: left alone
    : >"$STUB_LOG"
    run "$SCRIPT" --lab-dir "$LAB" --port 9999
    [[ $output == *"Summary: nothing changed."* ]]
    not_called '^docker (rm|run|start)'
}

@test "run as root (sudo start-lab.sh): refused with what to do, nothing started" {
    STUB_UID=0 run "$SCRIPT" --lab-dir "$LAB"
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"do not run start-lab.sh as root"* ]]
    not_called '^docker'
}
