"""The levers of an overhead-bound loop: compile, pad-64, compile-static, fused-adamw and
attention-flash, each an experiment of single.yaml whose switch the litgpt child applies.

Fast: the padding collate on litgpt's own collate and data module, the options from the experiment to the child's
argv and back out of it, the checks before a run, the attention restriction. Slow: one compiled ci run (compiling
on 2 cores costs seconds to tens of seconds: the inductor cache decides), the padded and the fused run, and the
flash run skipped on a CPU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from lab_helpers import launch
from lab_helpers.config.experiments import LabConfigError, resolve, runnable_recipe
from lab_helpers.config.recipe_defaults import launch_options, padded_length
from lab_helpers.training.attention_backend import any_backend, only_backend
from lab_helpers.training.child_litgpt import Levers, take_levers
from lab_helpers.training.compile_blocks import CompileWatch, effective_mode
from lab_helpers.training.pad_batches import PaddedCollate, pad_train_batches

LEVERS = ("compile", "pad-64", "compile-static", "fused-adamw", "attention-flash")


# ------------------------------------------------------------------------------------------- padding


def test_padded_length_rounds_up_to_the_multiple_never_beyond_the_limit():
    assert padded_length(54, None, 512) == 54  # litgpt's own: the longest sample
    assert [padded_length(n, 64, 512) for n in (1, 64, 65, 130)] == [64, 64, 128, 192]
    assert padded_length(500, 64, 510) == 510  # the model takes no longer batch than its longest sample
    assert padded_length(54, "max", 300) == 300


def _samples(*lengths: int) -> list[dict]:
    return [{"input_ids": torch.arange(1, n + 1), "labels": torch.arange(1, n + 1),
             "token_counts": {"raw": n - 1, "raw_plus_prompt_template": n}} for n in lengths]  # fmt: skip


def test_the_collate_pads_further_as_litgpt_pads():
    """litgpt's collate first (to the longest sample), then input_ids with its pad id and labels with its ignore
    index (no loss on padding), the token counts untouched."""
    from litgpt.data.base import get_sft_collate_fn

    litgpt = get_sft_collate_fn(max_seq_length=256, ignore_index=-100)
    own, padded = litgpt(_samples(5, 9)), PaddedCollate(litgpt, 8, limit=256)(_samples(5, 9))
    assert own["input_ids"].shape == (2, 9) and padded["input_ids"].shape == (2, 16)
    assert torch.equal(padded["input_ids"][:, :9], own["input_ids"]) and (padded["input_ids"][:, 9:] == 0).all()
    assert torch.equal(padded["labels"][:, :9], own["labels"]) and (padded["labels"][:, 9:] == -100).all()
    assert torch.equal(padded["token_counts"]["raw_plus_prompt_template"], own["token_counts"]["raw_plus_prompt_template"])
    assert PaddedCollate(litgpt, "max", limit=40)(_samples(5, 9))["labels"].shape == (2, 40)
    assert PaddedCollate(litgpt, 64, limit=12)(_samples(5, 9))["input_ids"].shape == (2, 12)


def test_the_training_loader_of_litgpts_data_module_pads_to_multiples_of_64(ci_assets):
    """The ci recipe's own data module, its samples uncut at 256 tokens (cut at 64 nearly every batch is 64 anyway)."""
    from litgpt.data import JSON
    from litgpt.tokenizer import Tokenizer

    run = resolve("pad-64", "ci", {"train.max_seq_length": 256})
    recipe = runnable_recipe(run.recipe)
    init_args = dict(recipe["data"]["init_args"])
    data = JSON(**{**init_args, "json_path": Path(init_args["json_path"])})
    data.connect(Tokenizer(Path(recipe["checkpoint_dir"])), batch_size=8, max_seq_length=256)
    data.setup()
    plain = [batch["input_ids"].shape[-1] for batch in data.train_dataloader()]
    pad_train_batches(data, run.options["pad_multiple"])
    padded = [batch["input_ids"].shape[-1] for batch in data.train_dataloader()]
    longest = max(len(item["input_ids"]) for item in data.train_dataset)
    assert len(set(plain)) > 3 and any(n % 64 for n in plain)  # litgpt's own: many lengths
    assert padded == [padded_length(n, 64, longest) for n in plain]
    assert all(n % 64 == 0 or n == longest for n in padded) and len(set(padded)) < len(set(plain))


# ------------------------------------------------------------------------------------------- the options


def test_each_lever_reaches_the_child_and_litgpt_never_sees_it(ci_assets, tmp_path):
    """From the experiment (options, set) through the launcher's argv to the child's switches: what the child takes
    out is what the experiment asked for, and what is left is litgpt's own command line."""
    for exp_id in LEVERS:
        run = resolve(exp_id, "ci", check_files=False)
        argv = launch.command(run, tmp_path / exp_id)[3:]  # after `python -m lab_helpers.training...`
        options = run.options
        assert take_levers(argv) == Levers(
            compile_target=options["compile"], compile_mode=options["compile_mode"], pad=options["pad_multiple"],
            attention=options["attention_backend"],
        )  # fmt: skip
        assert argv == [run.litgpt_command, "--config", str(tmp_path / exp_id / "recipe.yaml")]
    assert resolve("fused-adamw", "ci", check_files=False).recipe["optimizer"]["init_args"]["fused"] is True
    assert take_levers(["finetune_full"]) == Levers()
    with pytest.raises(SystemExit, match="--pad-multiple '0'"):
        take_levers(["finetune_full", "--pad-multiple", "0"])
    with pytest.raises(SystemExit, match="--compile 'model'"):
        take_levers(["finetune_full", "--compile", "model"])


def test_each_lever_is_its_pairs_recipe_with_one_change():
    for exp_id, pair, change in [("compile", "lora-1b", {"compile": "blocks"}),
                                 ("pad-64", "small-batch", {"pad_multiple": 64}),
                                 ("compile-static", "compile", {"pad_multiple": "max", "compile_mode": "reduce-overhead"}),
                                 ("attention-flash", "bf16-true", {"attention_backend": "flash"})]:  # fmt: skip
        for profile in ("ci", "gpu"):
            lever, against = (resolve(e, profile, check_files=False) for e in (exp_id, pair))
            assert lever.recipe == against.recipe and lever.experiment.pair == pair
            assert {k: v for k, v in lever.options.items() if against.options[k] != v} == change


def test_the_commands_say_what_the_litgpt_command_leaves_out(capsys):
    from lab_helpers.present.commands import show_commands

    for exp_id, profile, words in [("compile", "ci", 'block.compile(mode="default")'),
                                   ("compile-static", "gpu", 'block.compile(mode="reduce-overhead")'),
                                   ("pad-64", "ci", "the next multiple of 64 tokens"),
                                   ("attention-flash", "gpu", "with sdpa_kernel(SDPBackend.FLASH_ATTENTION):"),
                                   ("fused-adamw", "ci", "--optimizer.fused true")]:  # fmt: skip
        show_commands(exp_id, profile=profile)
        assert words in capsys.readouterr().out, exp_id


def test_levers_are_checked_before_anything_starts(monkeypatch):
    for bad, words in [({"pad_multiple": 0}, "pad_multiple 0"), ({"pad_multiple": True}, "pad_multiple True"),
                       ({"compile": "model"}, "compile 'model'"), ({"compile_mode": "fast"}, "compile_mode 'fast'"),
                       ({"attention_backend": "xformers"}, "attention_backend 'xformers'")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            launch_options("single", bad)
    from lab_helpers.config import experiments

    ddp = experiments.get_experiment("ddp")
    monkeypatch.setattr(experiments, "get_experiment", lambda _: dataclasses.replace(ddp, options={"compile": "blocks"}))
    with pytest.raises(LabConfigError, match="compile runs on one device .* only"):
        resolve("ddp", "ci", check_files=False)


def test_cuda_graphs_need_cuda_and_nothing_compiled_reports_nothing():
    assert effective_mode("reduce-overhead", on_cuda=False) == ("default", "reduce-overhead's CUDA graphs need CUDA")
    assert effective_mode("reduce-overhead", on_cuda=True) == ("reduce-overhead", "")
    assert effective_mode("default", on_cuda=False) == ("default", "")
    assert CompileWatch().fields() == {"compiled": None, "compile_s": None, "recompiles": None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CPU torch has no efficient-attention kernel")
def test_attention_is_restricted_inside_and_free_outside_the_loop():
    """A call the one backend cannot serve raises instead of falling back; validation and generation run free."""
    q = torch.randn(1, 2, 8, 16)

    def attend():
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    with only_backend("efficient"), pytest.raises(RuntimeError, match="No viable backend"):
        attend()
    with only_backend("efficient"):
        assert any_backend(attend)().shape == q.shape


# ------------------------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_a_compiled_ci_run_records_what_compiled_apart_from_the_timed_loop(ci_assets, results):
    """The one compiled run of the suite (compiling costs 2 s from a warm inductor cache, 10-25 s from a cold one)."""
    from lab_helpers.lab import run_experiment

    [record] = run_experiment("compile", profile="ci", echo=False)
    assert record["status"] == "ok", record.get("error")
    assert record["compiled"].startswith("blocks (") and "mode default" in record["compiled"]
    assert 0 < record["compile_s"] <= record["warmup_s"]  # compiled at the first forward and backward: warm-up
    assert isinstance(record["recompiles"], int) and record["seq_lens"]
    assert record["peak_tensor_gib"] is None  # the live-tensor count would keep torch.compile from compiling
    log = (results / record["log_path"]).read_text()
    assert "lab: compiled blocks (" in log and "lab: no live-tensor count" in log


@pytest.mark.slow
def test_padded_fused_and_flash_runs_on_a_cpu(ci_assets, results):
    from lab_helpers.lab import run_experiment

    # cut at 128 tokens (the ci recipes cut at 64, where every batch is 64 long with or without the lever): 64 or 128
    [padded] = run_experiment("pad-64", profile="ci", overrides={"train.max_seq_length": 128}, echo=False)
    assert padded["status"] == "ok", padded.get("error")
    assert padded["pad_multiple"] == 64 and padded["seq_lens"] and set(padded["seq_lens"]) <= {64, 128}
    assert padded["compiled"] is padded["compile_s"] is padded["recompiles"] is None
    [fused] = run_experiment("fused-adamw", profile="ci", echo=False)
    assert fused["status"] == "ok", fused.get("error")  # torch 2.13 runs the fused AdamW step on a CPU
    assert "fused=True on cpu: the fused step" in (results / fused["log_path"]).read_text()
    [flash] = run_experiment("attention-flash", profile="ci", echo=False)
    assert flash["status"] == "skipped" and "needs CUDA" in flash["reason"]
