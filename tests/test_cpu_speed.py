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
