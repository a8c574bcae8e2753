#!/usr/bin/env bash
# Provision a whole class of GPU nodes with Ansible: provision-node.sh on every node of the inventory, in
# parallel, then a report of which nodes passed the GPU check. This wrapper only checks its arguments and
# runs ansible-playbook; the work is in ansible/class.yml.
set -euo pipefail

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
. "$HERE/lib.sh"

PLAYBOOK=$HERE/ansible/class.yml
INVENTORY=
EXTRA=()

usage() {
    cat <<EOF
Usage: $PROG -i INVENTORY [--dry-run] [--forks N] [--limit PATTERN] [--user NAME] [-- ANSIBLE-ARGS...]

Runs provision-node.sh on every host under [gpu_nodes] in INVENTORY (an Ansible inventory; start from
$HERE/ansible/inventory.example.ini), all at once, and reports which nodes passed the GPU check.
Exits non-zero unless every node passed.

  -i, --inventory FILE  the class's inventory, a file or an inventory folder (required)
  --dry-run             each node looks and prints what it would do (ansible --check; provision-node.sh --dry-run)
  --forks N             nodes provisioned at the same time (default: 32, from ansible/ansible.cfg)
  --limit PATTERN       only these nodes (Ansible host pattern), e.g. to redo the ones that failed
  --user NAME           who joins the docker group on every node (default: the login user, ansible_user)
  -- ANSIBLE-ARGS       passed to ansible-playbook as they are (e.g. -- -vv)
  -h, --help            this help

Needs ansible-playbook here (pip install ansible-core) and SSH + sudo access to the nodes.
EOF
}

parse_args() {
    while (($#)); do
        case $1 in
            --dry-run) EXTRA+=(--check) ;;
            -i | --inventory | --forks | --limit | --user)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    -i | --inventory) INVENTORY=$2 ;;
                    --forks)
                        [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "--forks needs a positive number, not: $2"
                        EXTRA+=(--forks "$2")
                        ;;
                    --limit) EXTRA+=(--limit "$2") ;;
                    --user) EXTRA+=(-e "{\"lab_user\": $(json_string "$2")}") ;; # JSON: one value, whatever it holds
                esac
                shift
                ;;
            --)
                shift
                EXTRA+=("$@")
                break
                ;;
            *) help_or_unknown "$1" ;;
        esac
        shift
    done
    [[ -n $INVENTORY ]] || usage_error "an inventory is required: -i INVENTORY (start from $HERE/ansible/inventory.example.ini)"
}

main() {
    parse_args "$@"
    # Ansible only warns about a missing inventory and then runs against no hosts; say so plainly instead.
    # A folder is an inventory too (Ansible reads every file in it: hosts.ini, group_vars/, ...).
    [[ -f $INVENTORY || -d $INVENTORY ]] || die "inventory not found: $INVENTORY" \
        "Copy $HERE/ansible/inventory.example.ini, list your nodes under [gpu_nodes], and pass it with -i."
    command -v ansible-playbook >/dev/null || die "ansible-playbook is not installed." \
        "Install it with: pip install ansible-core (or: sudo apt-get install ansible)"
    export ANSIBLE_CONFIG=$HERE/ansible/ansible.cfg
    run ansible-playbook -i "$INVENTORY" "$PLAYBOOK" "${EXTRA[@]}"
}

main "$@"
