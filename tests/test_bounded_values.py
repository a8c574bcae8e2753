"""The values: one bounded reader (``lab_helpers/config/yaml_values.py``) for ``--set`` and recipe files. An alias
bomb cost ``plan`` 63 s and 4.5 GB; a 5000-digit integer, nesting 5000 deep and ``--gpu-memory-gib 1e308`` were
tracebacks. Each is now one line and exit 2, at once, on the real CLI."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import REPO, cli

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.experiments import parse_set_args
from lab_helpers.config.yaml_values import MAX_DEPTH, load_yaml

RECIPE = REPO / "configs" / "ci" / "ci-llama-xs" / "full.yaml"


def _alias_bomb(levels: int = 9) -> str:
    """``[&b0 [x,...x10], &b1 [*b0 x10], ...]``: 10**levels strings once expanded, a few hundred characters."""
    parts = ["&b0 [" + ",".join(["x"] * 10) + "]"]
    parts += [f"&b{i} [" + ",".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


BAD_VALUES = {
    "alias bomb": (_alias_bomb(), "anchors and aliases"),
    "one alias": ("[&a 1, *a]", "anchors and aliases"),
    "5000 digits": ("9" * 5000, "a number of 5,000 characters"),
    "5000 digits, tagged": ("!!int '" + "9" * 5000 + "'", "a number of 5,000 characters"),
    "5000 deep": ("[" * 5000 + "]" * 5000, "cannot read the value"),  # libyaml stops at 1000 levels itself
    "500 deep": ("[" * 500 + "]" * 500, f"nested deeper than {MAX_DEPTH} levels"),
    "5000 deep, unclosed": ("[" * 5000, "cannot read the value"),
}


@pytest.mark.parametrize(("value", "said"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_a_bad_set_value_is_one_clear_error(value, said):
    started = time.monotonic()
    with pytest.raises(LabConfigError) as info:
        parse_set_args([f"train.micro_batch_size={value}"])
    assert said in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 300
    assert time.monotonic() - started < 1


def test_what_a_recipe_needs_still_reads():
    assert parse_set_args(["train.epochs=3", "a=[1, {b: x}]", "out_dir=2024-01-01", "c=0.0002"]) == {
        "train.epochs": 3,
        "a": [1, {"b": "x"}],
        "out_dir": "2024-01-01",
        "c": 0.0002,
    }
    assert load_yaml("a: 'x & *y'", what="t") == {"a": "x & *y"}
    assert load_yaml("n: 12345678901234567890", what="t") == {"n": 12345678901234567890}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAB_PROFILE": "ci"}
    return subprocess.run(cli(*args), env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("plan", str(RECIPE), "--set", f"train.micro_batch_size={_alias_bomb()}"), "anchors and aliases"),
        (("run", "grad-accum", "--set", f"train.max_steps={_alias_bomb()}"), "anchors and aliases"),
        (("plan", str(RECIPE), "--set", "train.epochs=" + "9" * 5000), "a number of 5,000 characters"),
        (("plan", str(RECIPE), "--set", "train.epochs=" + "[" * 5000), "cannot read the value"),
        (("plan", str(RECIPE), "--fit", "--device", "cpu", "--gpu-memory-gib", "1e308"), "at most 100,000"),
    ],
    ids=["plan-alias-bomb", "run-alias-bomb", "5000-digits", "5000-deep", "gpu-memory-1e308"],
)
def test_the_cli_refuses_in_one_line_and_exit_2(args, said, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    out = _cli(*args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(out.stderr.splitlines()) == 1 and said in out.stderr, out.stderr[-2000:]
    assert len(out.stderr) < 400  # the value is never expanded into the message
    assert not (tmp_path / "results" / "runs.jsonl").exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"checkpoint_dir: x\ntrain:\n  micro_batch_size: {_alias_bomb()}\n", "anchors and aliases"),
        ("checkpoint_dir: x\ntrain:\n  epochs: " + "9" * 5000 + "\n", "a number of 5,000 characters"),
        ("checkpoint_dir: x\ntrain: " + "[" * 200 + "]" * 200 + "\n", f"nested deeper than {MAX_DEPTH}"),
    ],
    ids=["alias-bomb", "5000-digits", "200-deep"],
)
def test_a_recipe_file_is_read_through_the_same_bounds(text, said, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    out = _cli("plan", str(recipe))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and said in out.stderr, out.stderr[-2000:]
