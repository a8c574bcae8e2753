"""The traced op costs kept on disk between processes (planner/ops_cache): the same ops back, or a miss."""

from __future__ import annotations

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
    with pytest.raises(AssertionError, match="traced"):
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
