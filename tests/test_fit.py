"""What fits (lab_helpers.planning.planner.fit): the search itself, and its answers checked against ``predict`` on the ci
profile's tiny models (the fit's batch fits, batch + 1 does not), the alternatives when nothing fits, and
``plan --fit`` on a lab recipe and on a litgpt config-hub recipe."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from lab_helpers.planning.planner import PlanError, fit, predict, spec_from_recipe
from lab_helpers.planning.planner.fit import largest
from lab_helpers.present.plan_command import main as plan_main

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "configs" / "ci"
CONFIG_HUB_LORA = ROOT / "tests" / "fixtures" / "config_hub" / "tiny-llama" / "lora.yaml"


@pytest.fixture(scope="module")
def ci_assets():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)


def _grid(low: int, high: int, step: int) -> list[int]:
    return sorted({low, high, *range(-(-low // step) * step, high + 1, step)})


def test_largest_finds_the_boundary_of_any_monotonic_curve_in_few_calls():
    rng = random.Random(14)
    for _ in range(2000):
        c, k, q = rng.uniform(0, 10), rng.uniform(0.01, 5), rng.choice([0.0, rng.uniform(0, 0.01)])
        budget = rng.uniform(0, 200)
        low, high, step = rng.choice([1, 2]), rng.choice([16, 32, 512, 2048]), rng.choice([1, 8])
        calls: list[int] = []

        def used(v: int, c=c, k=k, q=q, calls=calls) -> float:
            calls.append(v)
            return c + k * v + q * v * v

        got = largest(used, budget, start=rng.randint(low, high), low=low, high=high, step=step)
        fitting = [v for v in _grid(low, high, step) if c + k * v + q * v * v <= budget]
        assert got == (max(fitting) if fitting else None)
        assert len(calls) == len(set(calls)) and len(calls) <= 2 * (high - low).bit_length() + 2


def test_largest_needs_few_calls_on_an_affine_curve():
    calls: list[int] = []
    got = largest(lambda v: calls.append(v) or 1.0 + 0.5 * v, 40.0, start=4, low=1, high=4096)
    assert got == 78 and len(calls) <= 4, calls


def test_largest_asks_twice_when_the_start_and_the_limit_fit():
    """The usual --fit: the recipe's micro batch fits, and so does the search limit. Memory proportional to the
    batch never overshoots an affine memory's crossing, so the second question is the limit itself."""
    calls: list[int] = []
    assert largest(lambda v: calls.append(v) or 6.0 + 0.6 * v, 76.0, start=4, low=1, high=16) == 16
    assert calls == [4, 16]


@pytest.mark.slow  # ~6 predictions of the tiny model: 15-30 s on 2 cores
def test_fit_batch_fits_and_one_more_does_not(ci_assets):
    spec = spec_from_recipe(CI / "ci-llama-xs" / "lora.yaml", device="cpu")
    per_device = spec.micro_batch_size * spec.gradient_accumulation_iters
    # a device that holds micro batch 6 of this recipe (with the 5 % margin) but not much more
    six = predict(dataclasses.replace(spec, micro_batch_size=6, gradient_accumulation_iters=per_device // 6))
    gpu_gib = six.gpu_used_gib / 0.95 * 1.001
    result = fit(spec, gpu_memory_gib=gpu_gib, sequence=False)
    best = result.max_micro_batch_size
    assert best is not None and 6 <= best < per_device, result
    sized = dataclasses.replace(spec, gpu_memory_gib=gpu_gib)  # the spec fit asked about (memoised by predict)
    at = predict(dataclasses.replace(sized, micro_batch_size=best, gradient_accumulation_iters=per_device // best))
    over = predict(
        dataclasses.replace(sized, micro_batch_size=best + 1, gradient_accumulation_iters=per_device // (best + 1))
    )
    assert at.gpu_used_gib <= result.budget_gib < over.gpu_used_gib
    assert result.max_micro_batch_used_gib == at.gpu_used_gib
    assert result.predictions <= 6


@pytest.mark.slow  # every alternative: ~9 predictions of the tiny model
def test_nothing_fits_lists_each_change_with_its_prediction(ci_assets):
    spec = spec_from_recipe(CI / "ci-llama-xs" / "full.yaml", device="cpu")
    one = dataclasses.replace(spec, micro_batch_size=1, gradient_accumulation_iters=32)
    gpu_gib = predict(one).gpu_used_gib * 0.9  # micro batch 1 does not fit
    result = fit(spec, gpu_memory_gib=gpu_gib, sequence=False)
    assert result.max_micro_batch_size is None and not result.recipe_fits
    changes = [alt.change for alt in result.alternatives]
    assert changes[:4] == [
        "precision bf16-true",
        "activation checkpointing",
        "LoRA r32, all linear layers",
        "QLoRA (bnb.nf4, bf16-true)",
    ]
    bf16 = result.alternatives[0]
    bf16_spec = dataclasses.replace(one, precision="bf16-true", gpu_memory_gib=gpu_gib)
    assert bf16.gpu_used_gib == predict(bf16_spec).gpu_used_gib
    assert bf16.fits == (bf16.gpu_used_gib <= result.budget_gib)
    assert result.cheapest is not None and result.cheapest.fits
    assert any(c.startswith("FSDP over") for c in changes) and any(
        c.startswith("ZeRO-3 + CPU offload") for c in changes
    )
    text = "\n".join(result.lines())
    assert "cheapest change that fits" in text


def test_fit_with_bad_sizes_is_one_clear_error(ci_assets, capsys):
    recipe = str(CI / "ci-llama-xs" / "lora.yaml")
    for gib in ("-1", "0", "nan", "inf", "1e308"):  # a 0 GiB GPU is no more sensible than a negative one
        code = plan_main([recipe, "--device", "cpu", "--fit", "--gpu-memory-gib", gib])  # 1e308: OverflowError
        said = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and said == [
            "error: --gpu-memory-gib must be a number of GiB above 0 and at most 100,000 (e.g. 79), "
            f"got {float(gib):g}"
        ], said
    for margin in ("1", "-0.1", "nan"):
        assert plan_main([recipe, "--device", "cpu", "--fit", "--gpu-memory-gib", "24", "--margin", margin]) == 2
        assert capsys.readouterr().err.strip().startswith("error: --margin must be a fraction from 0 up to")
    assert plan_main([recipe, "--device", "cpu", "--margin", "0.1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --margin and --max-micro-batch belong to --fit"
    with pytest.raises(PlanError, match="margin"):
        fit(spec_from_recipe(recipe, device="cpu"), gpu_memory_gib=1.0, margin=1.5)


@pytest.mark.slow  # a few predictions of the tiny model through the CLI
def test_plan_fit_cli_on_a_lab_recipe(ci_assets, capsys):
    recipe = str(CI / "ci-llama-xs" / "lora.yaml")
    assert plan_main([recipe, "--device", "cpu", "--fit", "--gpu-memory-gib", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    per_device = 16  # the recipe's global batch on one device: everything fits in 24 GiB
    assert out["max_micro_batch_size"] == per_device and out["recipe_fits"]
    assert out["max_seq_len"] == out["seq_len_limit"]  # the model's block size
    assert out["alternatives"] == []


@pytest.mark.slow  # TinyLlama 1.1B predictions: ~10 s each on 2 cores
def test_plan_fit_cli_on_a_config_hub_recipe(capsys):
    """litgpt's tiny-llama/lora.yaml on a 24 GB A10G (22 GiB usable): litgpt's own table ran micro batch 8."""
    code = plan_main([str(CONFIG_HUB_LORA), "--fit", "--gpu-memory-gib", "22", "--max-micro-batch", "8"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "largest micro batch: 8" in text and "as written (micro batch 8, 512 tokens)" in text
    assert "longest sequence at micro batch 8" in text


def test_the_one_micro_batch_search_takes_the_largest_candidate_that_fits():
    """fit, fill-gpu, the decision's shrinking and the OOM demo's raising all ask this one search."""
    from lab_helpers.planning.planner.fit import keeping_global_batch, largest_micro_batch

    asked: list[int] = []

    def used(b: int) -> float:
        asked.append(b)
        return 10.0 + 2.0 * b

    assert largest_micro_batch(used, 30.0, candidates=range(1, 33)) == 10
    assert keeping_global_batch(24, 8) == [1, 2, 3, 4, 6, 8] and keeping_global_batch(32) == [1, 2, 4, 8, 16, 32]
    assert largest_micro_batch(used, 30.0, candidates=keeping_global_batch(32)) == 8  # 10 does not divide 32
    asked.clear()
    assert largest_micro_batch(used, 24.0, candidates=keeping_global_batch(24, 8), start=8) == 6
    assert asked[0] == 8 and len(asked) <= 4  # the recipe's first, then a few more
    assert largest_micro_batch(used, 11.0, candidates=[2, 4]) is None
    assert largest_micro_batch(used, 1e9, candidates=[2, 4, 8]) == 8
    with pytest.raises(PlanError, match="whole numbers >= 1"):
        largest_micro_batch(used, 1.0, candidates=[0, 1])


def test_a_batch_without_accumulation_shrinks_to_a_divisor_of_its_own():
    """small-batch (8, no accumulation) takes 4 where 7 would fit: grad-accum, its pair at a global batch of 32, can
    then run at the same micro batch."""
    from types import SimpleNamespace

    from node_fixtures import node

    from lab_helpers.config.experiments import get_experiment
    from lab_helpers.planning.micro_batch import fitted_micro_batch

    def predict(exp_id, overrides):  # 40 GiB fits micro batch 7 at most
        return SimpleNamespace(gpu_used_gib=22.0 + 2.5 * overrides.get("train.micro_batch_size", 8))

    the_node = node("A100-40GB")
    fitted, why = fitted_micro_batch("small-batch", get_experiment("small-batch"), "gpu", the_node, {}, predict)
    assert fitted == {"train.micro_batch_size": 4, "train.global_batch_size": 4}, why
    assert "micro and global batch 8 -> 4" in why
    fitted, why = fitted_micro_batch("grad-accum", get_experiment("grad-accum"), "gpu", the_node, {}, predict)
    assert fitted == {"train.micro_batch_size": 4}, why
