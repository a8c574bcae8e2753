#!/usr/bin/env bats
# provision-class.sh's argument checks (with a stub ansible-playbook), then the real class playbook run
# against two local "nodes" whose commands are stubs: one passes the GPU check, one does not.

load helpers

setup() {
    setup_stubs
    SCRIPT=$PROVISIONING_DIR/provision-class.sh
    INVENTORY=$BATS_TEST_TMPDIR/inventory.ini
    printf '[gpu_nodes]\nnode1\n' >"$INVENTORY"
    export ANSIBLE_LOCAL_TEMP=$BATS_TEST_TMPDIR/ansible-tmp ANSIBLE_REMOTE_TEMP=$BATS_TEST_TMPDIR/ansible-tmp
    export ANSIBLE_NOCOLOR=1
}

# stub_ansible: a recording ansible-playbook, for the tests that only check the wrapper.
stub_ansible() {
    cat >"$STUB_BIN/ansible-playbook" <<'STUB'
#!/usr/bin/env bash
echo "ansible-playbook $*" >>"$STUB_LOG"
STUB
    chmod +x "$STUB_BIN/ansible-playbook"
}

@test "runs the class playbook on the inventory with the lab's ansible.cfg" {
    stub_ansible
    run "$SCRIPT" -i "$INVENTORY" --forks 8 --limit node1 --user cc -- -vv
    echo "$output"
    [ "$status" -eq 0 ]
    called "^ansible-playbook -i $INVENTORY $PROVISIONING_DIR/ansible/class.yml --forks 8 --limit node1 -e \\{\"lab_user\": \"cc\"\\} -vv\$"
}

# stub_ansible_args: a recording ansible-playbook that writes each argument on a line of its own (ARGS_LOG).
stub_ansible_args() {
    export ARGS_LOG=$BATS_TEST_TMPDIR/args.log
    cat >"$STUB_BIN/ansible-playbook" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$@" >"$ARGS_LOG"
STUB
    chmod +x "$STUB_BIN/ansible-playbook"
}

@test "--user is passed as JSON extra-vars: a value with a space, '=', quotes or a backslash stays one variable" {
    need_ansible
    local real_ansible
    real_ansible=$(command -v ansible-playbook)
    stub_ansible_args
    local name='a b=c "q" \x'
    run "$SCRIPT" -i "$INVENTORY" --user "$name"
    [ "$status" -eq 0 ]
    local extra
    extra=$(grep -A1 -x -- -e "$ARGS_LOG" | tail -1)
    [ "$extra" = '{"lab_user": "a b=c \"q\" \\x"}' ]
    # the real Ansible reads it back as one variable holding the whole name, and no variable "c"
    printf -- '- hosts: localhost\n  gather_facts: false\n  tasks:\n    - debug:\n        msg: "[{{ lab_user }}] [{{ c | default(\x27no c\x27) }}]"\n' \
        >"$BATS_TEST_TMPDIR/echo.yml"
    run "$real_ansible" -i localhost, -c local "$BATS_TEST_TMPDIR/echo.yml" -e "$extra"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *'"msg": "[a b=c \"q\" \\x] [no c]"'* ]]
}

@test "--dry-run becomes ansible's --check (each node runs provision-node.sh --dry-run)" {
    stub_ansible
    run "$SCRIPT" --inventory "$INVENTORY" --dry-run
    [ "$status" -eq 0 ]
    called "class.yml --check\$"
}

@test "missing inventory: a clear error, ansible never runs" {
    stub_ansible
    run "$SCRIPT" -i "$BATS_TEST_TMPDIR/no-such.ini"
    [ "$status" -eq 1 ]
    [[ $output == *"inventory not found: $BATS_TEST_TMPDIR/no-such.ini"* ]]
    [[ $output == *"inventory.example.ini"* ]]
    run "$SCRIPT"
    [ "$status" -eq 2 ]
    [[ $output == *"an inventory is required"* ]]
    [ ! -s "$STUB_LOG" ]
}

@test "an inventory folder (hosts.ini, group_vars/), with a space in its path, is an inventory, not 'not found'" {
    stub_ansible_args
    mkdir -p "$BATS_TEST_TMPDIR/class inventory"
    printf '[gpu_nodes]\nnode1\n' >"$BATS_TEST_TMPDIR/class inventory/hosts.ini"
    run "$SCRIPT" -i "$BATS_TEST_TMPDIR/class inventory"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(sed -n 2p "$ARGS_LOG")" == "$BATS_TEST_TMPDIR/class inventory" ]
}

@test "an inventory without [gpu_nodes]: the playbook says what to list, and touches nothing" {
    printf '[webservers]\nweb1 ansible_connection=local\n' >"$INVENTORY"
    run "$SCRIPT" -i "$INVENTORY"
    echo "$output"
    [ "$status" -ne 0 ]
    [[ $output == *"The inventory lists no hosts under [gpu_nodes]"* ]]
    [ ! -s "$STUB_LOG" ]
}

@test "unknown flag: a clear error, exit 2" {
    stub_ansible
    run "$SCRIPT" -i "$INVENTORY" --parallel
    [ "$status" -eq 2 ]
    [[ $output == *"unknown argument: --parallel"* ]]
    run "$SCRIPT" -i "$INVENTORY" --forks many
    [ "$status" -eq 2 ]
    [ ! -s "$STUB_LOG" ]
}

@test "no ansible-playbook: says how to install it" {
    if [[ -x /usr/bin/ansible-playbook ]]; then skip "ansible-playbook is installed system-wide"; fi
    PATH=$STUB_BIN:/usr/bin:/bin run "$SCRIPT" -i "$INVENTORY"
    [ "$status" -eq 1 ]
    [[ $output == *"pip install ansible-core"* ]]
}

# fake_node NAME KEY=VALUE...: a fake node (its own root, state and call log) as an inventory entry.
fake_node() {
    local name=$1 dir=$BATS_TEST_TMPDIR/$1
    shift
    mkdir -p "$dir/state/pkg" "$dir/state/groups" "$dir/root/etc"
    touch "$dir/state/pkg/ca-certificates" "$dir/state/pkg/curl" "$dir/state/pkg/gnupg"
    printf 'ID=ubuntu\nVERSION_ID="22.04"\nUBUNTU_CODENAME=jammy\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n' >"$dir/root/etc/os-release"
    printf '        %s:\n          provision_env:\n' "$name"
    printf '            %s: "%s"\n' PATH "$PATH" STUB_LOG "$dir/calls.log" STUB_STATE "$dir/state" PROVISION_ROOT "$dir/root"
    local kv
    for kv in "$@"; do printf '            %s: "%s"\n' "${kv%%=*}" "${kv#*=}"; done
}

need_ansible() {
    command -v ansible-playbook >/dev/null || {
        echo "ansible-playbook is not on PATH: pip install ansible-core" >&2
        return 1
    }
}

# inventory_header EXTRA_VARS: a YAML inventory's [gpu_nodes] head, every node run locally (EXTRA_VARS: more vars)
inventory_header() {
    printf 'gpu_nodes:\n  vars:\n    ansible_connection: local\n    ansible_become: false\n'
    printf '    ansible_python_interpreter: "{{ ansible_playbook_python }}"\n'
    # shellcheck disable=SC2059 # the extra vars are a printf format on purpose (their \n)
    printf "$1"
    printf '  hosts:\n'
}

@test "the real playbook: provisions nodes in parallel and reports which passed the GPU check" {
    need_ansible
    {
        inventory_header '    lab_user: student\n'
        fake_node fresh-node | sed 's/^    //'
        fake_node done-node | sed 's/^    //'
        fake_node bad-node STUB_CONTAINER_GPUS=1 | sed 's/^    //'
    } >"$BATS_TEST_TMPDIR/inventory.yml"
    # done-node was provisioned before: Ansible must report it unchanged.
    STUB_LOG=$BATS_TEST_TMPDIR/done-node/calls.log STUB_STATE=$BATS_TEST_TMPDIR/done-node/state \
        PROVISION_ROOT=$BATS_TEST_TMPDIR/done-node/root "$PROVISIONING_DIR/provision-node.sh" --user student

    run "$SCRIPT" -i "$BATS_TEST_TMPDIR/inventory.yml"
    echo "$output"
    [ "$status" -ne 0 ]
    [[ $output == *"fresh-node: GPU check passed: the container sees all 2 GPU(s)"* ]]
    [[ $output == *"done-node: GPU check passed: the container sees all 2 GPU(s)"* ]]
    [[ $output == *"bad-node: FAILED: provision-node.sh: error: GPU check failed: the container sees 1 of the host's 2 GPU(s)"* ]]
    [[ $output == *"GPU check did not pass on 1 of 3 node(s): bad-node"* ]]
    [[ $output == *"changed: [fresh-node]"* ]]
    [[ $output =~ done-node\ +:\ ok=[0-9]+\ +changed=0 ]]
    grep -q '^usermod -aG docker student$' "$BATS_TEST_TMPDIR/fresh-node/calls.log"
    grep -q '^nvidia-ctk runtime configure' "$BATS_TEST_TMPDIR/fresh-node/calls.log"
}

@test "the real playbook: no lab user named is refused (never the controller's \$USER), nothing provisioned" {
    need_ansible
    {
        inventory_header ''
        fake_node lone-node | sed 's/^    //'
    } >"$BATS_TEST_TMPDIR/inventory.yml"
    USER=controller-user run "$SCRIPT" -i "$BATS_TEST_TMPDIR/inventory.yml"
    echo "$output"
    [ "$status" -ne 0 ]
    [[ $output == *"Name the lab user who joins the docker group"* ]]
    run grep -qs usermod "$BATS_TEST_TMPDIR/lone-node/calls.log"
    [ "$status" -ne 0 ] # provision-node.sh never ran
}

@test "the real playbook: a node that cannot be reached gets its report line, even when no node can be" {
    need_ansible
    {
        inventory_header '    lab_user: student\n'
        printf '    gone-node:\n      ansible_connection: ssh\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n'
    } >"$BATS_TEST_TMPDIR/inventory.yml"
    run "$SCRIPT" -i "$BATS_TEST_TMPDIR/inventory.yml"
    echo "$output"
    [ "$status" -ne 0 ]
    # was: Ansible's recap only (every node left the play before the report, which runs on one of them)
    [[ $output == *'"gone-node: FAILED: unreachable: '*"Connection refused"* ]]
    [[ $output == *"GPU check did not pass on 1 of 1 node(s): gone-node"* ]]
}
