"""Imports flow one way: the layers in ``.importlinter``, checked by import-linter (a maintained tool) in the
fast tier, plus what a static graph cannot show (what importing a lower layer pulls in at run time)."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import lab_helpers

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / ".importlinter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(config: Path, *, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if pythonpath is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold():
    """Layers (every module named: exhaustive), no cycles between siblings, a planner that probes nothing."""
    result = _lint(CONTRACTS, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 kept, 0 broken" in result.stdout


def test_every_module_has_a_layer():
    """The contract is exhaustive over the package: a new module cannot stay outside the layers."""
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    layers = config["importlinter:contract:layers"]
    assert layers["containers"].split() == ["lab_helpers"] and layers.getboolean("exhaustive")
    named = {name.strip() for line in layers["layers"].splitlines() for name in line.split(":") if name.strip()}
    package = Path(lab_helpers.__file__).parent
    children = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    children |= {p.parent.name for p in package.glob("*/__init__.py")}
    assert named == children


def test_the_lower_layers_pull_in_nothing_above_them_when_imported():
    """At run time too: importing the recording, running and planning layers loads no presenting or
    orchestration module (a module-level side effect the static graph would still allow is caught here)."""
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    lines = [line for line in config["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]
    above = sorted(f"lab_helpers.{n.strip()}" for line in lines[:3] for n in line.split(":"))
    lower = ["lab_helpers.record.run_record", "lab_helpers.planning.predict", "lab_helpers.launch", "lab_helpers.record.records"]
    code = (
        "import sys, importlib\n"
        f"for m in {lower!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m in {above!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_linter_catches_an_upward_import_and_a_cycle(tmp_path):
    """The check can fail: a lower module that imports a higher one lazily (inside a function) is caught."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "top.py").write_text("from toy import bottom\n")
    (package / "bottom.py").write_text("def f():\n    from toy import top  # lazy, still an import\n")
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_package = toy\n\n"
        "[importlinter:contract:layers]\nname = toy layers\ntype = layers\ncontainers =\n    toy\n"
        "exhaustive = true\nlayers =\n    top\n    bottom\n"
    )
    result = _lint(config, cwd=tmp_path, pythonpath=tmp_path)
    assert result.returncode != 0
    assert "toy.bottom is not allowed to import toy.top" in result.stdout


def test_no_cycles_even_through_annotations(tmp_path):
    """The contracts skip imports under ``TYPE_CHECKING``; ``farm-studio look`` does not. A circle made only of
    annotation imports (planning's decision -> micro_batch / pairs -> decision, for ``Predict`` and ``Decision``)
    is still a circle: the shared types live below the modules that use them (``planning.decision_types``)."""
    config = tmp_path / "acyclic.ini"
    config.write_text(
        "[importlinter]\nroot_package = lab_helpers\nexclude_type_checking_imports = False\n\n"
        "[importlinter:contract:acyclic]\nname = No cycles, annotations counted\ntype = acyclic_siblings\n"
        "ancestors =\n    lab_helpers\n"
    )
    result = _lint(config, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout
