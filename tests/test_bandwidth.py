"""``python -m lab_helpers bandwidth``: real torch.distributed collectives over gloo (2 processes on this CPU,
the ci profile), the bus-bandwidth arithmetic, the record, and ``plan --time`` taking the figure on this node."""

from __future__ import annotations

import json
import platform

import pytest

from lab_helpers.hardware import bandwidth
from lab_helpers.hardware.bandwidth import BandwidthResult, measured_link_gbs, save


def _result(**changes) -> BandwidthResult:
    base = dict(
        host=platform.node(), device_name="cpu", backend="gloo", world_size=2, size_bytes=2**20,
        all_reduce_busbw_gbs=1.5, all_gather_busbw_gbs=0.5, measured_at="2026-01-01T00:00:00+0000",
    )
    return BandwidthResult(**{**base, **changes})


@pytest.mark.slow  # spawns 2 processes that import torch: ~20 s on 2 cores
def test_measures_gloo_on_two_processes_and_records_it(tmp_path, monkeypatch, capsys):
    from lab_helpers.cli import main

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    assert main(["bandwidth", "--size-mib", "4"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce bus bandwidth" in out and "GB/s" in out
    [entry] = json.loads((tmp_path / "bandwidth.json").read_text()).values()
    assert entry["backend"] == "gloo" and entry["world_size"] == 2 and entry["size_bytes"] == 4 * 2**20
    assert entry["all_reduce_busbw_gbs"] > 0 and entry["all_gather_busbw_gbs"] > 0
    gbs, source = measured_link_gbs("cpu", tmp_path / "bandwidth.json")
    assert gbs == min(entry["all_reduce_busbw_gbs"], entry["all_gather_busbw_gbs"]) and "measured" in source


def test_one_rank_is_one_clear_error(capsys):
    from lab_helpers.cli import main

    assert main(["bandwidth", "--ranks", "1"]) == 2
    assert "at least 2 ranks" in capsys.readouterr().err


def test_only_this_hosts_figure_for_this_device_is_used(tmp_path):
    path = tmp_path / "bandwidth.json"
    save(_result(host="another-node"), path)
    assert measured_link_gbs("cpu", path) == (None, None)
    save(_result(), path)
    save(_result(device_name="NVIDIA H100 80GB HBM3", backend="nccl", all_gather_busbw_gbs=300.0,
                 all_reduce_busbw_gbs=350.0), path)
    assert measured_link_gbs("cpu", path)[0] == 0.5  # the slower collective
    assert measured_link_gbs(None, path)[0] == 300.0  # no GPU named: this node's GPUs
    assert measured_link_gbs("NVIDIA A100-SXM4-80GB", path) == (None, None)


def test_plan_time_takes_this_nodes_measured_figure(tmp_path, monkeypatch):
    """The plan command reads the file and passes the number in (the planner itself reads no file)."""
    from lab_helpers.present import plan_command as plan_cli

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    save(_result(device_name="NVIDIA A100-SXM4-80GB", backend="nccl", all_gather_busbw_gbs=20.0,
                 all_reduce_busbw_gbs=25.0))
    seen = {}

    def fake_predict(spec, **kwargs):  # records what the CLI passes; the formula is tested in test_timing
        seen.update(kwargs)
        raise plan_cli.PlanError("stop here")

    monkeypatch.setattr("lab_helpers.planning.planner.timing.predict_time", fake_predict)
    args = plan_cli.argparse.Namespace(gpu_name="NVIDIA A100-SXM4-80GB", link_gbs=None, sample_lengths=None)
    spec = plan_cli.spec_from_recipe(
        str(bandwidth.Path(__file__).parent.parent / "configs/gpu/open_llama_7b/full.yaml"), devices=4, strategy="ddp"
    )
    monkeypatch.setattr("lab_helpers.training.data_lengths.recipe_sample_lengths", lambda recipe: (None, "no data"))
    assert plan_cli._time(spec, args, recipe={}) == (None, "not predicted (stop here)", None)
    assert seen["link_gbs"] == 20.0 and "measured" in seen["link_gbs_source"]


# --------------------------------------------------------- the file read by the lab's rule


def test_a_fifo_at_bandwidth_json_is_skipped_in_one_line_by_plan_and_refused_by_save(tmp_path):
    """A FIFO at ``$LAB_RESULTS/bandwidth.json`` hung ``plan --time`` (multi-GPU) and ``bandwidth``. The real CLI
    now plans without a link figure and says why in one line; keeping a measurement there is one error line."""
    import os
    import subprocess
    import sys

    from conftest import REPO, cli

    os.mkfifo(tmp_path / "bandwidth.json")
    env = {**os.environ, "LAB_RESULTS": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cli("plan", "ddp", "--profile", "ci", "--time"), capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env)  # fmt: skip
    assert proc.returncode == 0 and "no link bandwidth" in proc.stdout, proc.stderr[-2000:]
    from lab_helpers.config.paths import shown_path  # a long temporary path is shown cut, as every message cuts it

    said = f"warning: {shown_path(tmp_path / 'bandwidth.json')}: not read: not a regular file (a FIFO)"
    assert proc.stderr.splitlines() == [said]
    keep = "from lab_helpers.hardware.bandwidth import *; save(BandwidthResult('h', 'cpu', 'gloo', 2, 1, 1, 1, 'now'))"
    proc = subprocess.run([sys.executable, "-c", keep], capture_output=True, text=True, timeout=60, env=env)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("lab_helpers.config.config_error.LabConfigError: ") and proc.returncode == 1, proc.stderr
    assert last.endswith(f"{shown_path(tmp_path / 'bandwidth.json')}: not written: not a regular file (a FIFO); remove it and measure again")


def test_a_link_or_an_oversize_bandwidth_json_is_not_read(tmp_path):
    """The file is data anyone may plant: a link to a file elsewhere is not followed, an oversize one not read."""
    elsewhere = tmp_path / "elsewhere.json"
    save(_result(), elsewhere)
    path = tmp_path / "bandwidth.json"
    path.symlink_to(elsewhere)
    with pytest.warns(UserWarning, match="not read: a symbolic link"):
        assert measured_link_gbs("cpu", path) == (None, None)
    path.unlink()
    path.write_text(elsewhere.read_text() + " " * bandwidth.FILE_MAX_BYTES)  # valid JSON, padded
    with pytest.warns(UserWarning, match="not read: .* bytes, more than"):
        assert measured_link_gbs("cpu", path) == (None, None)


@pytest.mark.parametrize(
    ("change", "why"),
    [({"all_gather_busbw_gbs": None}, "not numbers"), ({"all_reduce_busbw_gbs": "fast"}, "not numbers"),
     ({"all_gather_busbw_gbs": True}, "not numbers"), ({"all_gather_busbw_gbs": 1e-300}, "outside"),
     ({"all_reduce_busbw_gbs": float("nan")}, "not numbers"), ({"all_gather_busbw_gbs": 1e9}, "outside"),
     ({"measured_at": 5}, "measured_at")],
)  # fmt: skip
def test_a_missing_wrong_typed_or_absurd_field_is_unmeasured_in_one_line(tmp_path, change, why):
    """A field missing or of the wrong type was a KeyError or TypeError traceback; 1e-300 GB/s gave a step of
    1.88e+297 s. Each entry is now taken as unmeasured, with one line."""
    path = tmp_path / "bandwidth.json"
    save(_result(), path)
    [(key, entry)] = json.loads(path.read_text()).items()
    entry = {k: v for k, v in {**entry, **change}.items() if v is not None}
    path.write_text(json.dumps({key: entry}))
    with pytest.warns(UserWarning, match=f"ignored .*{why}.*: taken as unmeasured"):
        assert measured_link_gbs("cpu", path) == (None, None)
