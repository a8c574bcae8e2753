#!/usr/bin/env bats
# fetch-class-assets.sh against stub litgpt and df: disk check, resume/skip, retries, dry run, token hygiene.

load helpers

setup() {
    setup_stubs
    export LAB_PYTHON=lab-python
    CKPT=$BATS_TEST_TMPDIR/checkpoints
    DATA=$BATS_TEST_TMPDIR/data
    SCRIPT=$PROVISIONING_DIR/fetch-class-assets.sh
    ARGS=(--checkpoint-dir "$CKPT" --data-dir "$DATA")
}

@test "fresh: checks disk, downloads the four models and the data set" {
    run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    called "^df -Pk $BATS_TEST_TMPDIR\$"
    for model in TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T openlm-research/open_llama_3b \
        openlm-research/open_llama_7b openlm-research/open_llama_13b; do
        called "^litgpt download $model --checkpoint_dir $CKPT\$"
        [ -s "$CKPT/$model/lit_model.pth" ]
    done
    called "^lab-python $DATA/alpaca2k\$"
    [[ $output == *"about 97 GB needed"* ]]
    # The disk is checked before the first download.
    [ "$(grep -n '^df' "$STUB_LOG" | cut -d: -f1)" -lt "$(grep -n '^litgpt' "$STUB_LOG" | head -1 | cut -d: -f1)" ]
}

@test "second run: everything is there, nothing is downloaded" {
    run "$SCRIPT" "${ARGS[@]}"
    : >"$STUB_LOG"
    run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"Summary: nothing changed."* ]]
    not_called '^(litgpt|lab-python)'
}

@test "resumable: only the missing model is fetched, and disk is counted for it alone" {
    run "$SCRIPT" "${ARGS[@]}"
    rm "$CKPT/openlm-research/open_llama_7b/lit_model.pth"
    : >"$STUB_LOG"
    STUB_DF_FREE_KB=$((28 * 1024 * 1024)) run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '^litgpt' "$STUB_LOG")" -eq 1 ]
    called '^litgpt download openlm-research/open_llama_7b '
    [[ $output == *"about 27 GB needed"* ]]
}

@test "a conversion cut off (model_config.yaml and half a lit_model.pth) is fetched again, not taken as done" {
    run "$SCRIPT" "${ARGS[@]}"
    weights=$CKPT/openlm-research/open_llama_3b/lit_model.pth
    head -c 20 "$weights" >"$weights.cut" && mv "$weights.cut" "$weights"
    : >"$STUB_LOG"
    run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"open_llama_3b: $weights is cut off"* ]]
    [ "$(grep -c '^litgpt' "$STUB_LOG")" -eq 1 ]
    called '^litgpt download openlm-research/open_llama_3b '
}

@test "an interrupted data set download (a cache folder not empty) is fetched again, not taken as done" {
    mkdir -p "$DATA/alpaca2k/downloads"
    echo partial >"$DATA/alpaca2k/downloads/alpaca2k.json.incomplete"
    run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    called "^lab-python $DATA/alpaca2k\$"
    [[ $output == *"downloaded the Alpaca2k data set"* ]]
    : >"$STUB_LOG"
    run "$SCRIPT" "${ARGS[@]}"
    [[ $output == *"Summary: nothing changed."* ]]
    not_called '^lab-python'
}

@test "not enough disk: refuses before downloading, with the numbers and what to do" {
    STUB_DF_FREE_KB=$((50 * 1024 * 1024)) run "$SCRIPT" "${ARGS[@]}"
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"not enough free disk"*"need about 97 GB"*"have 53 GB"* ]]
    [[ $output == *"--models"* ]]
    not_called '^(litgpt|lab-python)'
}

@test "--models picks a subset; an unknown model is a usage error" {
    run "$SCRIPT" "${ARGS[@]}" --no-data --models TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T,openlm-research/open_llama_3b
    [ "$status" -eq 0 ]
    [ "$(grep -c '^litgpt' "$STUB_LOG")" -eq 2 ]
    not_called '^lab-python'
    run "$SCRIPT" --models meta-llama/Llama-2-70b
    [ "$status" -eq 2 ]
    [[ $output == *"not a gpu-profile model: meta-llama/Llama-2-70b"* ]]
}

@test "--models with no model in it (a lone comma, empty) is one usage line, not a bash error" {
    for list in "," "" ",,"; do
        run "$SCRIPT" --models "$list" --dry-run
        [ "$status" -eq 2 ]
        [[ $output == *"--models needs at least one model"* ]]
        [[ $output != *"bad array subscript"* ]]
    done
    not_called '^lab-python'
}

@test "a dropped download is retried and resumes" {
    STUB_LITGPT_FAILS=2 run "$SCRIPT" "${ARGS[@]}" --models openlm-research/open_llama_3b
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '^litgpt download openlm-research/open_llama_3b' "$STUB_LOG")" -eq 3 ]
    [[ $output == *"attempt 1 of 3 failed"* ]]
    called '^sleep 10$'
}

@test "a download that keeps failing stops with the error and says how to resume" {
    STUB_LITGPT_FAILS=99 run "$SCRIPT" "${ARGS[@]}" --retries 2
    echo "$output"
    [ "$status" -eq 1 ]
    [[ $output == *"Connection reset by peer"* ]]
    [[ $output == *"gave up after 2 attempts"* ]]
    [[ $output == *"resumes"* ]]
    [ "$(grep -c '^litgpt' "$STUB_LOG")" -eq 2 ]
}

@test "dry run: checks disk and prints the downloads, downloads nothing" {
    run "$SCRIPT" "${ARGS[@]}" --dry-run
    echo "$output"
    [ "$status" -eq 0 ]
    [[ $output == *"would run: litgpt download openlm-research/open_llama_13b --checkpoint_dir $CKPT"* ]]
    [[ $output == *"would run: lab-python -c"* ]]
    not_called '^(litgpt|lab-python)'
    [ ! -e "$CKPT" ]
}

@test "HF_TOKEN is used through the environment and never printed or passed as an argument" {
    HF_TOKEN=hf_secret_value run "$SCRIPT" "${ARGS[@]}"
    [ "$status" -eq 0 ]
    [[ $output == *"HF_TOKEN is set"* ]]
    [[ $output != *hf_secret_value* ]]
    not_called 'hf_secret_value|--access_token'
}

@test "no litgpt here: says to run it in the lab container" {
    rm "$STUB_BIN/litgpt"
    PATH=$STUB_BIN:/usr/bin:/bin run "$SCRIPT" "${ARGS[@]}"
    [ "$status" -eq 1 ]
    [[ $output == *"litgpt is not installed"* ]]
    [[ $output == *"docker exec -it lab provisioning/fetch-class-assets.sh"* ]]
}

@test "unknown flag: a clear error, exit 2" {
    run "$SCRIPT" --resume
    [ "$status" -eq 2 ]
    [[ $output == *"unknown argument: --resume"* ]]
    run "$SCRIPT" --retries 0
    [ "$status" -eq 2 ]
}
