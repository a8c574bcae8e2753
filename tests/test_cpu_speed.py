"""This CPU's measured rates (lab_helpers.hardware.cpu_speed): measured once, then read from the cache."""

from __future__ import annotations

from lab_helpers.hardware import cpu_speed


def test_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_speed.CACHE_ENV, str(tmp_path / "fresh.json"))
    first = cpu_speed.measure_cpu_rates()
    assert first.matmul_flops_per_s > 1e8 and first.adam_params_per_s > 1e5

    def no_measuring(*_args, **_kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(cpu_speed, "_measure_matmul", no_measuring)
    assert cpu_speed.measure_cpu_rates() == first


def test_an_edited_or_linked_cache_entry_is_measured_again(tmp_path, monkeypatch):
    """The cache is data anyone may edit. A rate of 1e-300, NaN or text (float('fast') was a traceback),
    or the file a link to another (read through before), is measured again and the entry replaced."""
    import json
    import os
    import platform

    import pytest
    import torch

    path = tmp_path / "cpu_speed.json"
    monkeypatch.setenv(cpu_speed.CACHE_ENV, str(path))
    monkeypatch.setattr(cpu_speed, "_measure_matmul", lambda: 2e10)
    monkeypatch.setattr(cpu_speed, "_measure_adam", lambda: 3e7)
    key = f"{platform.node()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}"
    measured = cpu_speed.CpuRates(2e10, 3e7)
    for bad in (1e-300, float("nan"), "fast", True, None):
        path.write_text(json.dumps({key: {"matmul_flops_per_s": bad, "adam_params_per_s": 3e7}}))
        assert cpu_speed.measure_cpu_rates() == measured, bad
        assert json.loads(path.read_text())[key] == {"matmul_flops_per_s": 2e10, "adam_params_per_s": 3e7}
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({key: {"matmul_flops_per_s": 5e9, "adam_params_per_s": 1e6}}))
    path.unlink()
    path.symlink_to(elsewhere)
    with pytest.warns(UserWarning, match="not read .*symbolic link.*measured again"):
        assert cpu_speed.measure_cpu_rates() == measured  # not the linked file's 5e9
