"""The traced op costs kept on disk between processes (planner/ops_cache): the same ops back, or a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lab_helpers.planning.activations_by_hand import experiment_spec
from lab_helpers.planning.planner import calibration, ops_cache


@pytest.fixture
def spec():
    return experiment_spec("grad-accum", "ci")


def test_a_trace_is_kept_and_read_back_as_the_same_ops(spec, tmp_path, monkeypatch):
    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(calibration, "_OPS_CACHE", {})
    traced = calibration.traced_ops(spec, 48)
    [kept] = tmp_path.glob("*.json")
    monkeypatch.setattr(calibration, "_OPS_CACHE", {})  # a new process: only the disk remembers
    monkeypatch.setattr("lab_helpers.planning.planner.tracer.trace", _no_trace)
    assert calibration.traced_ops(spec, 48) == traced  # every op, count and note, from the file
    # another length, another key: traced again (here: refused, so the test sees it is not read from the file)
    with pytest.raises(AssertionError, match="traced"):
        calibration.traced_ops(spec, 40)
    kept.write_text("{not json")  # a damaged file is a miss, never an error
    with pytest.warns(UserWarning, match="not JSON"):
        assert ops_cache.load(kept.stem) is None


def test_the_key_follows_the_code_and_0_turns_it_off(spec, tmp_path, monkeypatch):
    key = ops_cache.key_for(repr(spec), 48)
    assert key == ops_cache.key_for(repr(spec), 48) != ops_cache.key_for(repr(spec), 49)
    monkeypatch.setattr(ops_cache, "code_digest", lambda: "other planner code")
    assert ops_cache.key_for(repr(spec), 48) != key  # changed code never reads an old trace
    monkeypatch.setenv(ops_cache.CACHE_ENV, "0")
    assert ops_cache.cache_dir() is None and ops_cache.load(key) is None
    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path / "a file"))
    (tmp_path / "a file").write_text("")
    ops_cache.store(key, calibration.traced_ops(spec, 48))  # an unusable folder: nothing kept, nothing raised
    assert ops_cache.load(key) is None


def _no_trace(spec):
    raise AssertionError("traced: the ops were not read from the cache")


def test_a_memory_plan_is_kept_and_read_back_equal_in_a_new_process(spec, tmp_path, monkeypatch):
    """Every run's launcher, notebook kernel and CLI call traced its run's plan again; now the first one keeps it."""
    import dataclasses

    from lab_helpers.planning.planner import plan as plan_module

    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(plan_module, "_CACHE", {})
    planned = plan_module.predict(spec)
    [kept] = tmp_path.glob("*.json")
    monkeypatch.setattr(plan_module, "_CACHE", {})  # a new process: only the disk remembers
    monkeypatch.setattr(plan_module, "_predict", _no_trace)
    assert plan_module.predict(spec) == planned  # every field, from the file
    with pytest.raises(AssertionError, match="traced"):  # another spec, another key
        plan_module.predict(dataclasses.replace(spec, micro_batch_size=spec.micro_batch_size + 1))
    kept.write_text('{"peak_alloc_gib": 1.0, "not a field": 2}')  # another layout is a miss, never an error
    monkeypatch.setattr(plan_module, "_CACHE", {})
    with pytest.raises(AssertionError, match="traced"), pytest.warns(UserWarning, match="not MemoryPlan's fields"):
        plan_module.predict(spec)


def test_a_plan_json_cannot_hold_is_answered_and_not_kept(spec, tmp_path, monkeypatch):
    """A GPU size given as a numpy number made the plan's ``fits`` numpy's bool, which JSON cannot hold: keeping
    the plan raised a TypeError and lost the answer (fa27540). The answer stands; nothing is kept."""
    import dataclasses

    import numpy as np

    from lab_helpers.planning.planner import plan as plan_module

    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(plan_module, "_CACHE", {})
    planned = plan_module.predict(dataclasses.replace(spec, gpu_memory_gib=np.int64(24)))
    assert planned.fits and not list(tmp_path.glob("*.json"))


# ----------------------------------------------------------------- caches that cannot lie


def test_another_litgpt_or_torch_is_another_key(spec, monkeypatch):
    """litgpt 0.5.13 has no ``__version__``: the key read "?" for every litgpt, and a node upgraded between classes
    served the old plans. The key now holds each one's installed version (its dist-info)."""
    import importlib.metadata

    real = importlib.metadata.version
    key = ops_cache.key_for(repr(spec), 48)
    for package in ("litgpt", "torch"):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, p=package: "9.9.9" if name == p else real(name))
        ops_cache.code_digest.cache_clear()
        assert ops_cache.key_for(repr(spec), 48) != key, package
    monkeypatch.setattr(importlib.metadata, "version", real)
    ops_cache.code_digest.cache_clear()
    assert ops_cache.key_for(repr(spec), 48) == key


_PLANTED = """
import json, os, sys, warnings
from pathlib import Path
from lab_helpers.planning.activations_by_hand import experiment_spec
from lab_helpers.planning.planner import plan
spec = experiment_spec("grad-accum", "ci")
first = plan.predict(spec).to_dict()
[entry] = Path(os.environ["LAB_TRACE_CACHE"]).glob("*.json")
for what in sys.argv[1:]:
    entry.unlink()
    if what == "fifo":
        os.mkfifo(entry)
    elif what == "link to /dev/zero":
        entry.symlink_to("/dev/zero")
    elif what == "oversize":
        entry.write_text(json.dumps({**first, "notes": ["x" * (9 * 2**20)]}))
    plan._CACHE.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        again = plan.predict(spec).to_dict()
    kept = json.loads(entry.read_text()) if entry.is_file() and not entry.is_symlink() else None
    stored = {k: v for k, v in first.items() if k != "fits"}  # the fields: fits is derived from them
    print(json.dumps([what, again == first, kept == stored, [str(w.message) for w in said]]), flush=True)
"""


def test_a_fifo_a_link_or_an_oversize_entry_is_a_miss_and_replaced(tmp_path):
    """A FIFO at a plan's key hung `plan` and `run`; a link to /dev/zero read until MemoryError. Each is now read by
    the lab's rule (paths.read_lab_file): refused at once in one line, traced again, and replaced by the plan."""
    cases = ["fifo", "link to /dev/zero", "oversize"]
    env = {**os.environ, "LAB_TRACE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _PLANTED, *cases], capture_output=True, text=True, timeout=120,
                          env=env)  # fmt: skip
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a[0] for a in answers] == cases, proc.stderr[-2000:]
    for what, same_answer, replaced, said in answers:
        assert same_answer and replaced, what
        assert len(said) == 1 and said[0].startswith("trace cache ") and "traced again" in said[0], (what, said)
    assert "a FIFO" in answers[0][3][0] and "symbolic link" in answers[1][3][0] and "bytes" in answers[2][3][0]


@pytest.mark.parametrize(
    ("field", "value"),
    [("peak_alloc_gib", 7.5), ("peak_alloc_gib", float("nan")), ("peak_alloc_gib", -3.0), ("peak_alloc_gib", "abc"),
     ("breakdown_gib", {"parameters": 1.0}), ("micro_batch_size", 64), ("devices", True), ("fits", True),
     ("notes", [1]), ("whole_run_peak_alloc_gib", float("inf"))],
)  # fmt: skip
def test_an_edited_plan_entry_is_a_miss_traced_again_and_replaced(spec, tmp_path, monkeypatch, field, value):
    """``peak_alloc_gib: 7.5`` in small-batch's entry was printed by `plan` and stored as the run's prediction (the
    real peak is 0.035); NaN and -3.0 were printed as figures; a wrong type was a traceback. Each is now a miss."""
    from lab_helpers.planning.planner import plan as plan_module

    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(plan_module, "_CACHE", {})
    planned = plan_module.predict(spec)
    [kept] = tmp_path.glob("*.json")
    good = kept.read_text()
    kept.write_text(json.dumps({**json.loads(good), field: value}))
    monkeypatch.setattr(plan_module, "_CACHE", {})
    with pytest.warns(UserWarning, match="trace cache .* not used .* traced again"):
        assert plan_module.predict(spec) == planned
    assert json.loads(kept.read_text()) == json.loads(good)  # replaced by the traced plan


def test_an_edited_ops_entry_is_a_miss(spec, tmp_path, monkeypatch):
    """The traced ops (calibration's) are checked too: an op's count NaN or text, a note that is no text."""
    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(calibration, "_OPS_CACHE", {})
    traced = calibration.traced_ops(spec, 48)
    [kept] = tmp_path.glob("*.json")
    good = json.loads(kept.read_text())
    assert ops_cache.load(kept.stem) == traced
    op, count = good["micro_batch"][0]
    for bad in ({**good, "micro_batch": [[{**op, "flops": float("nan")}, count], *good["micro_batch"][1:]]},
                {**good, "micro_batch": [[{**op, "bytes": "many"}, count]]},
                {**good, "micro_batch": [[op, -1]]}, {**good, "notes": [None]}, {**good, "extra": 1}, [1, 2]):  # fmt: skip
        kept.write_text(json.dumps(bad))
        with pytest.warns(UserWarning, match="not used"):
            assert ops_cache.load(kept.stem) is None, bad


def test_an_edited_compiled_block_entry_is_refused():
    from lab_helpers.planning.compile_launches import kept_block
    from lab_helpers.planning.planner.levers import CompiledBlock

    good = {"eager_forward": 40.0, "eager_backward": 80.0, "compiled_forward": 10.0, "compiled_backward": 20.0,
            "source": "measured"}  # fmt: skip
    assert kept_block(good) == CompiledBlock(**good)
    for bad in ({**good, "eager_forward": float("nan")}, {**good, "compiled_forward": "x"},
                {**good, "eager_forward": 0, "eager_backward": 0}, {**good, "source": 1}, {"eager_forward": 1}, None):  # fmt: skip
        assert isinstance(kept_block(bad), str), bad
