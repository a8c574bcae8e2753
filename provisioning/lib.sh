# shellcheck shell=bash
# Helpers shared by the provisioning scripts: messages, a dry-run aware `run`, and change tracking.
# Sourced, never executed. The caller sets PROG (for messages) and may set DRY_RUN=1.

DRY_RUN=${DRY_RUN:-0}
CHANGES=()

say() { printf '%s\n' "$*"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }

# die MESSAGE [HINT...]: the error, then each hint on its own line, all on stderr; exit 1.
die() {
    printf '%s: error: %s\n' "$PROG" "$1" >&2
    shift
    local hint
    for hint in "$@"; do printf '  %s\n' "$hint" >&2; done
    exit 1
}

# usage_error MESSAGE: a wrong command line; exit 2 so callers can tell it from a failed step.
usage_error() {
    printf '%s: %s\n' "$PROG" "$1" >&2
    printf 'Run %s --help for usage.\n' "$PROG" >&2
    exit 2
}

# help_or_unknown ARG: the end of every script's flag parsing: --help prints the caller's usage() and exits 0,
# anything else is an unknown argument.
help_or_unknown() {
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        *) usage_error "unknown argument: $1" ;;
    esac
}

# json_string TEXT: TEXT as a JSON string, quotes included: backslash, double quote and every control character
# escaped, so that a value passed to `ansible-playbook -e '{"key": ...}'` stays one value whatever it holds
# (`-e "key=$value"` is split by Ansible at spaces and `=`: "a b=c" became two variables).
json_string() {
    local text=$1 out='' char code i
    for ((i = 0; i < ${#text}; i++)); do
        char=${text:i:1}
        case $char in
            '"') out+='\"' ;;
            "\\") out+="\\\\" ;;
            $'\n') out+='\n' ;;
            $'\t') out+='\t' ;;
            $'\r') out+='\r' ;;
            *)
                printf -v code '%d' "'$char"
                if ((code >= 0 && code < 32)) || ((code == 127)); then
                    printf -v char '\\u%04x' "$code"
                fi
                out+=$char
                ;;
        esac
    done
    printf '"%s"' "$out"
}

# quote ARGS...: the command as one line that can be pasted back into a shell.
quote() {
    local line
    printf -v line '%q ' "$@"
    printf '%s' "${line% }"
}

# run CMD ARGS...: print the command, then run it; under --dry-run print it and stop there.
# A failing command ends the script with its exit code named (its own message is already on stderr).
run() {
    if ((DRY_RUN)); then
        say "would run: $(quote "$@")"
        return 0
    fi
    say "+ $(quote "$@")"
    local rc=0
    "$@" || rc=$?
    ((rc == 0)) || die "command failed (exit $rc): $(quote "$@")"
}

# write_file PATH CONTENT: replace PATH with CONTENT (one trailing newline), or say so under --dry-run.
write_file() {
    local path=$1 content=$2
    if ((DRY_RUN)); then
        say "would write $path:"
        say "    $content"
        return 0
    fi
    say "+ write $path"
    mkdir -p "$(dirname "$path")"
    printf '%s\n' "$content" >"$path.tmp"
    chmod 0644 "$path.tmp"
    mv "$path.tmp" "$path"
}

# changed WHAT / unchanged WHAT: record a step's outcome so the summary can say whether anything changed.
changed() { CHANGES+=("$1"); }
unchanged() { say "already $1 (no change)"; }

# summary: one closing line a person (and the class playbook) can read at a glance.
summary() {
    if ((DRY_RUN)); then
        say "Dry run: ${#CHANGES[@]} step(s) would change this machine; nothing was changed."
    elif ((${#CHANGES[@]} == 0)); then
        say "Summary: nothing changed."
    else
        say "Summary: ${#CHANGES[@]} change(s):"
        printf '  - %s\n' "${CHANGES[@]}"
    fi
}
