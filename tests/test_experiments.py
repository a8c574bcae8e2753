"""Bad input is caught before any process starts, with one line that names the problem and the fix."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import cli

from lab_helpers.config.experiments import LabConfigError, load_experiments, resolve, runnable_recipe

SHARED_LAB_SINGLE = [
    "baseline", "small-batch", "grad-accum", "bf16-true", "bf16-mixed", "full-3b", "full-7b", "full-13b",
    "full-13b-sgd", "lora-1b", "lora-3b", "lora-7b", "lora-13b", "qlora-7b",
    "act-ckpt", "adamw-8bit",  # LAB.md's "Beyond the course", after the course's own matrix
    "fill-gpu",  # the lab's own speed experiment: lora-1b at the largest micro batch that fits
    "length-grouped",  # padding experiment: small-batch in micro-batches of samples of similar length
    "compile", "pad-64", "compile-static", "fused-adamw", "attention-flash",  # the levers of a host bound
]  # fmt: skip


def test_single_section_is_lab_md_matrix_in_order():
    assert list(load_experiments("single")) == SHARED_LAB_SINGLE


@pytest.mark.parametrize("profile", ["ci", "gpu"])
@pytest.mark.slow
def test_every_experiment_resolves_to_a_valid_recipe(profile):
    for exp_id in load_experiments("single"):
        run = resolve(exp_id, profile, check_files=False)
        assert run.recipe_path.is_file()
        adapters = run.recipe_path.stem in ("lora", "qlora")  # the recipe file says what trains (fill-gpu is LoRA)
        assert run.litgpt_command == ("finetune_lora" if adapters else "finetune_full")


def test_overrides_reach_the_recipe_and_experiment_settings_win_over_the_recipe():
    run = resolve("grad-accum", "ci", {"train.max_steps": 7, "data.num_workers": 0}, check_files=False)
    assert run.recipe["train"]["micro_batch_size"] == 8 and run.recipe["train"]["global_batch_size"] == 32
    assert run.recipe["train"]["max_steps"] == 7
    assert run.recipe["data"]["init_args"]["num_workers"] == 0
    sgd = resolve("full-13b-sgd", "gpu", check_files=False)
    assert sgd.recipe["optimizer"] == "SGD" and sgd.recipe["train"]["max_steps"] == 25


@pytest.mark.parametrize(
    ("exp_id", "profile", "overrides", "message"),
    [
        ("grad-acum", "ci", {}, "unknown experiment 'grad-acum' (did you mean 'grad-accum'?)"),
        ("grad-accum", "cpu", {}, "unknown profile 'cpu'"),
        ("grad-accum", "ci", {"train.micro_batchsize": 2}, "unknown recipe key 'train.micro_batchsize' (did you mean 'train.micro_batch_size'?)"),
        ("grad-accum", "ci", {"micro_batch_size": 2}, "unknown recipe key 'micro_batch_size' for litgpt finetune_full (did you mean 'train.micro_batch_size'?)"),
        ("lora-1b", "ci", {"eval.intervall": 2}, "unknown recipe key 'eval.intervall' (did you mean 'eval.interval'?)"),
        ("ddp", "ci", {"train.micro_batchsize": 2}, "unknown recipe key 'train.micro_batchsize' (did you mean 'train.micro_batch_size'?)"),
        ("grad-accum", "ci", {"precison": "bf16-true"}, "unknown recipe key 'precison' for litgpt finetune_full (did you mean 'precision'?)"),
        ("grad-accum", "ci", {"learning_rate": 1}, "unknown recipe key 'learning_rate'"),
        ("grad-accum", "ci", {"data.jsonpath": "x"}, "unknown recipe key 'data.jsonpath' for litgpt.data.JSON (did you mean 'data.json_path'?)"),
        ("grad-accum", "ci", {"train.micro_batch_size": 64}, "train.micro_batch_size (64) is larger than train.global_batch_size (32)"),
        ("grad-accum", "ci", {"train.global_batch_size": 12}, "train.global_batch_size (12) is not divisible by micro_batch_size x devices (8 x 1 = 8)"),
        ("grad-accum", "ci", {"precision": "bf17"}, "precision 'bf17' is not one of"),
        ("grad-accum", "ci", {"train.max_steps": 1}, "train.max_steps (1) must be larger than train.lr_warmup_steps (1)"),
        ("grad-accum", "ci", {"train.lr_warmup_steps": 0}, "train.lr_warmup_steps must be a whole number >= 1"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_line(exp_id, profile, overrides, message):
    with pytest.raises(LabConfigError) as info:
        resolve(exp_id, profile, overrides, check_files=False)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_sequence_longer_than_the_block_size_is_refused(ci_assets):
    with pytest.raises(LabConfigError, match=r"train.max_seq_length \(4096\) exceeds the model's block size \(\d+\)"):
        resolve("grad-accum", "ci", {"train.max_seq_length": 4096})


def test_missing_checkpoint_names_the_command_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CHECKPOINTS", str(tmp_path))
    with pytest.raises(LabConfigError, match=r"run `python -m lab_helpers prepare --profile ci`"):
        resolve("grad-accum", "ci")
    with pytest.raises(LabConfigError, match=r"litgpt download TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"):
        resolve("grad-accum", "gpu")


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_one_line_and_starts_nothing(results):
    out = subprocess.run(
        cli("run", "grad-accum", "--profile", "ci", "--set", "train.micro_batch_size=64"),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: train.micro_batch_size (64) is larger")
    assert len(out.stderr.strip().splitlines()) == 1
    assert not results.exists()  # no run folder, no record: nothing started



def test_commands_that_trace_nothing_answer_without_importing_torch(results):
    """``results`` (and the parser every command builds, ``plan`` included) must not pay torch's seconds-long
    import: the planner is imported when something is traced."""
    code = "import sys; from lab_helpers.cli import main; rc = main(['results']); print(rc, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stdout[-500:] + out.stderr[-2000:]

def test_qlora_is_skipped_with_the_reason_on_a_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from lab_helpers.hardware.node import describe_node
    from lab_helpers.planning.decision import blocked

    reason = blocked(resolve("qlora-7b", "ci"), describe_node())
    assert reason == "needs CUDA: bitsandbytes QLoRA cannot run on a CPU"


def test_the_written_recipe_pins_moved_folders_and_masks_tokens(tmp_path, monkeypatch):
    """Single and multi-GPU runs get the same runnable recipe: absolute paths as the lab resolves them, no token."""
    import yaml

    from lab_helpers.training.distributed import build_command

    monkeypatch.setenv("LAB_CHECKPOINTS", str(tmp_path / "ckpt"))
    monkeypatch.setenv("LAB_DATA", str(tmp_path / "data"))
    secret = {"access_token": "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1234"}
    ddp = resolve("ddp", "ci", secret, check_files=False)
    build_command(ddp, tmp_path / "run")
    written = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert written["checkpoint_dir"] == str(tmp_path / "ckpt" / "lab-ci" / "ci-llama-m")
    assert written["data"]["init_args"]["json_path"] == str(tmp_path / "data" / "ci" / "alpaca_short.json")
    assert written["access_token"] == "***"
    gpu = runnable_recipe(resolve("bf16-true", "gpu", check_files=False).recipe)
    assert gpu["data"]["init_args"]["download_dir"] == str(tmp_path / "data" / "alpaca2k")


def test_the_old_kind_key_still_reads_as_its_launcher(tmp_path, monkeypatch):
    """Experiment files written with ``kind: litgpt | lightning`` (the old name) load with the same launcher."""
    folder = tmp_path / "configs" / "experiments"
    folder.mkdir(parents=True)
    (folder / "single.yaml").write_text("a: {model: 1b, method: full, kind: litgpt}\nb: {model: 1b, method: full}\n")
    (folder / "multi.yaml").write_text(
        "c: {model: 7b, method: full, kind: lightning, strategy: ddp}\n"
        "d: {model: 7b, method: full, launcher: lightning-strategy, strategy: ddp}\n"
    )
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    experiments = load_experiments()
    assert [e.launcher for e in experiments.values()] == ["litgpt-cli"] * 2 + ["lightning-strategy"] * 2
    assert [e.distributed for e in experiments.values()] == [False, False, True, True]
    (folder / "multi.yaml").write_text("e: {model: 7b, method: full, kind: deepspeed}\n")
    with pytest.raises(LabConfigError, match="kind 'deepspeed' is not litgpt or lightning"):
        load_experiments()


@pytest.mark.parametrize("exp_id", ["ddp-course", "fsdp-course"])
def test_the_course_rows_run_their_batch_per_gpu_without_accumulation(exp_id):
    """The course ran batch 4 per GPU with no accumulation: global = micro x world, whatever the world;
    a run's own global batch (planner_multi_check's) still wins."""
    for profile, micro in (("gpu", 4), ("ci", 2)):
        for world in (None, 2, 4, 8):
            run = resolve(exp_id, profile, check_files=False, simulate_world=world)
            train = run.recipe["train"]
            assert (train["micro_batch_size"], run.gradient_accumulation) == (micro, 1), (profile, world)
            assert train["global_batch_size"] == micro * run.world_size
    own = resolve(exp_id, "ci", {"train.global_batch_size": 16}, check_files=False, simulate_world=4)
    assert own.gradient_accumulation == 2


def test_every_pair_is_data_and_each_expect_names_its_pair():
    """The pairs the notebooks compare are ``pair:`` keys, not words in ``expect``: each names another
    experiment of its section on the same model, every "(its pair)" has one, and its expect names the pair."""
    experiments = load_experiments()
    pairs = {e: x.pair for e, x in experiments.items() if x.pair}
    assert {
        "grad-accum": "small-batch", "bf16-mixed": "bf16-true", "act-ckpt": "full-7b", "adamw-8bit": "full-7b",
        "fill-gpu": "lora-1b", "fsdp-course": "fsdp", "fsdp-grad-op": "fsdp",
    }.items() <= pairs.items()  # fmt: skip
    for exp_id, experiment in experiments.items():
        if "its pair" in experiment.expect:
            assert experiment.pair, exp_id
        if experiment.pair:
            pair = experiments[experiment.pair]
            assert experiment.pair in experiment.expect, exp_id
            assert (pair.section, pair.model) == (experiment.section, experiment.model), exp_id


@pytest.mark.parametrize(
    ("single", "message"),
    [
        ("b: {model: 1b, method: full, pair: aa}", "experiment 'b' in single.yaml: pair 'aa' is not another "
                                                  "experiment of single.yaml (did you mean 'a'?)"),
        ("b: {model: 1b, method: full, pair: b}", "pair 'b' is not another experiment of single.yaml"),
        ("b: {model: 1b, method: full, pair: c}", "pair 'c' is not another experiment of single.yaml"),
        ("b: {model: 3b, method: full, pair: a}", "its pair 'a' trains the 1b model, not the 3b"),
    ],
)
def test_a_pair_that_is_no_experiment_of_its_file_is_one_line(tmp_path, monkeypatch, single, message):
    folder = tmp_path / "configs" / "experiments"
    folder.mkdir(parents=True)
    (folder / "single.yaml").write_text(f"a: {{model: 1b, method: full}}\n{single}\n")
    (folder / "multi.yaml").write_text("c: {model: 1b, method: full, launcher: lightning-strategy, strategy: ddp}\n")
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    with pytest.raises(LabConfigError, match=re.escape(message)):
        load_experiments()


def test_every_resolve_gets_its_own_run_and_an_edited_file_is_read_again(tmp_path, monkeypatch):
    """The YAML files are parsed once per version (experiments._read_yaml) but no caller shares what it got: a run
    changed by one caller leaves the next resolve as defined, and a file written again is read again."""
    first = resolve("lora-1b", "gpu", check_files=False)
    first.recipe["train"]["micro_batch_size"] = 999
    first.experiment.set["changed"] = True
    again = resolve("lora-1b", "gpu", check_files=False)
    assert again.recipe["train"]["micro_batch_size"] != 999 and "changed" not in again.experiment.set
    folder = tmp_path / "configs" / "experiments"
    folder.mkdir(parents=True)
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    (folder / "single.yaml").write_text("a: {model: 1b, method: full}\n")
    assert load_experiments()["a"].method == "full"
    (folder / "single.yaml").write_text("a: {model: 1b, method: lora, devices: 1}\n")
    assert load_experiments()["a"].method == "lora"


def test_a_plan_before_prepare_says_to_prepare(tmp_path, monkeypatch):
    """04, or a plan cell, before the ci models are built: the planner's 'unknown model ... no model_config.yaml'
    did not say what to do, where a run before prepare does."""
    from lab_helpers import lab
    from lab_helpers.planning.planner import PlanError

    monkeypatch.setenv("LAB_CHECKPOINTS", str(tmp_path / "none yet"))
    with pytest.raises(PlanError, match=r"build it first: python -m lab_helpers prepare --profile ci \(in a notebook"):
        lab.predict_experiment("baseline", profile="ci")


def test_predict_experiment_takes_overrides_as_run_experiment_does_and_refuses_a_gpu_size_that_is_none(ci_assets):
    """A list of KEY=VALUE overrides (as run_experiment takes) was a TypeError from inside; a GPU size of '80' too,
    and -1 or NaN answered 'will OOM' on a GPU of -1.0 GiB."""
    from lab_helpers import lab

    as_list = lab.predict_experiment("baseline", profile="ci", overrides=["train.micro_batch_size=2"])
    assert as_list == lab.predict_experiment("baseline", profile="ci", overrides={"train.micro_batch_size": 2})
    import numpy as np

    assert lab.predict_experiment("baseline", profile="ci", gpu_memory_gib=np.int64(24)).fits  # a table's cell
    for size in ("80", -1, float("nan"), True):
        with pytest.raises(LabConfigError, match=r"gpu_memory_gib is a GPU's size in GiB above 0 \(e.g. 80\)"):
            lab.predict_experiment("baseline", profile="ci", gpu_memory_gib=size)


# ------------------------------------------------- a notebook's wrong argument is one line, not difflib's


def _refused(call) -> str:
    with pytest.raises(LabConfigError) as info:
        call()
    assert "\n" not in str(info.value), info.value
    return str(info.value)


def test_a_notebooks_wrong_argument_is_one_line_and_starts_nothing(results):
    """``run_experiment(None)`` and ``predict_experiment(None)`` were TypeErrors from inside difflib; a profile of
    the wrong type, an override key that is no text, overrides that are no mapping or list of KEY=VALUE too."""
    from lab_helpers import lab

    for exp_id in (None, 5):
        for call in (lab.run_experiment, lab.predict_experiment):
            line = _refused(lambda call=call, exp_id=exp_id: call(exp_id))
            assert line.startswith(f"experiment: expected an experiment's name (text), e.g. 'grad-accum'; got {exp_id}")
    line = _refused(lambda: lab.run_experiment("small-batch", profile={"a": 1}))
    assert line.startswith("profile: expected a profile's name (text), one of ") and "got {'a': 1}" in line, line
    line = _refused(lambda: lab.run_experiment("small-batch", overrides={None: 1}))
    assert line.startswith("overrides: each key is a recipe key as text (e.g. 'train.micro_batch_size'); got None")
    for overrides in (5, "train.max_steps=2", (1, 2)):
        line = _refused(lambda overrides=overrides: lab.run_experiment("small-batch", overrides=overrides))
        assert line.startswith("overrides: expected a mapping ({'train.micro_batch_size': 4}) or a list of"), line
    line = _refused(lambda: lab.run_experiment("small-batch", overrides=[1, 2]))
    assert line.startswith("--set 1: expected KEY=VALUE text, e.g. 'train.micro_batch_size=4'"), line
    line = _refused(lambda: lab.run_experiment("small-batch", overrides={"devices": 2}))
    assert line.startswith("devices=2: small-batch trains on one device"), line
    assert not results.exists()  # no record, no run folder: nothing started


def test_the_cli_refuses_two_devices_for_a_single_device_experiment_in_one_line(results, capsys):
    from lab_helpers.cli import main

    assert main(["run", "small-batch", "--set", "devices=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: devices=2: small-batch trains on one device") and "\n" not in err, err
    assert not results.exists()


def test_a_recipe_rewritten_at_its_size_with_its_time_put_back_is_read_again(tmp_path, monkeypatch):
    """The parsed-file cache was keyed by inode, size and mtime, all three of which an edit can keep (``touch -d``
    or a restore puts the mtime back): the old recipe was served."""
    import os

    folder = tmp_path / "configs" / "experiments"
    folder.mkdir(parents=True)
    monkeypatch.setenv("LAB_HOME", str(tmp_path))
    single = folder / "single.yaml"
    single.write_text("a: {model: 1b, method: full}\n")
    assert load_experiments()["a"].method == "full"
    before = single.stat()
    single.write_text("a: {model: 1b, method: lora}\n")  # the same size, in place: the same inode
    os.utime(single, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = single.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert load_experiments()["a"].method == "lora"
