"""Rank 0 of an N-rank run measured alone on one device (``--simulate-world N``), and the communication arithmetic.

The fast tests check what is derived before anything runs (the run's world, the command, the record's fields, the
cluster environment Lightning is given) and the per-optimizer-step byte counts from the recipes' own numbers. The
two slow tests run real simulated ranks (Lightning's FSDP2 and DeepSpeed ZeRO-3 code on torch's fake process
group, the smallest ci model) and hold the planner's per-rank prediction to the 10 % target on them;
``benchmarks/planner_multi_check.py`` does the same for every strategy at N = 2, 4, 8.
"""

from __future__ import annotations

import pytest
import torch

from lab_helpers import launch
from lab_helpers.config.experiments import LabConfigError, resolve
from lab_helpers.config.record_schema import GIB, record_problems
from lab_helpers.planning import arithmetic
from lab_helpers.record.run_record import base_record

SMALL = {"checkpoint_dir": "checkpoints/lab-ci/ci-llama-xs"}  # the smallest model: process start dominates


def test_a_simulated_run_plays_the_world_in_one_process(ci_assets, tmp_path):
    run = resolve("fsdp", "ci", simulate_world=4, check_files=False)
    assert (run.world_size, run.ranks_run, run.simulated_world_size) == (4, 1, 4)
    micro, global_ = run.recipe["train"]["micro_batch_size"], run.recipe["train"]["global_batch_size"]
    assert run.gradient_accumulation == global_ // (micro * 4)  # the world's accumulation, not one process's
    argv = launch.command(run, tmp_path)
    assert argv[argv.index("--devices") + 1] == "1" and argv[argv.index("--simulate-world") + 1] == "4"
    assert launch.ranks(run) == [0]  # one record: rank 0
    record = base_record(run)
    assert (record["world_size"], record["simulated_world_size"]) == (1, 4)
    assert record_problems({**record, "status": "ok"}) == []
    from lab_helpers.planning.predict import planner_inputs

    assert planner_inputs(run, None, device="cpu")["devices"] == 4  # the planner is asked about the world


@pytest.mark.parametrize(
    ("exp_id", "world", "message"),
    [
        ("one-gpu", 4, "runs on one device"),
        ("multi-node", 4, "spans nodes"),
        ("fsdp", 1, ">= 2"),
        ("ddp", 3, "not divisible"),  # the ci global batch 4 does not split into micro 2 x 3 ranks
    ],
)
def test_a_simulated_world_that_cannot_run_says_why(ci_assets, exp_id, world, message):
    with pytest.raises(LabConfigError, match=message):
        resolve(exp_id, "ci", simulate_world=world, check_files=False)


def test_the_cluster_environment_says_rank_0_of_the_world():
    from lab_helpers.training.distributed.simulated import SimulatedRankEnvironment

    env = SimulatedRankEnvironment(8)
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (8, 0, 0, 0)
    assert env.creates_processes_externally  # Lightning starts no other process
    env.set_world_size(8)
    with pytest.raises(ValueError, match="simulated world is 8"):
        env.set_world_size(1)
    with pytest.raises(ValueError, match="at least 2"):
        SimulatedRankEnvironment(1)


def test_the_course_settings_reach_the_command_and_the_planner(ci_assets, tmp_path):
    from lab_helpers.planning.predict import planner_inputs

    course, lab = (resolve(e, "ci", check_files=False) for e in ("ddp-course", "ddp"))
    assert "--no-bucket-view" in launch.command(course, tmp_path / "c")
    assert "--no-bucket-view" not in launch.command(lab, tmp_path / "l")
    assert planner_inputs(course, None, device="cpu")["ddp_gradient_as_bucket_view"] is False
    fsdp_course = resolve("fsdp-course", "ci", check_files=False)
    argv = launch.command(fsdp_course, tmp_path / "f")
    assert argv[argv.index("--wrap") + 1] == "none"
    assert planner_inputs(fsdp_course, None, device="cpu")["fsdp_wrap_blocks"] is False


def test_communication_per_optimizer_step_from_the_4_gpu_recipes():
    """DDP 2Ψ, FSDP (2a + 1)Ψ − aΨ_root and SHARD_GRAD_OP 2Ψ on the 4-GPU 32/4 recipes, derived from the recipe's
    numbers: 32 samples / (4 per GPU x 4 GPUs) = 2 micro-batches per optimizer step; DDP and FSDP1 sync once (no_sync
    before the last), FSDP gathers each block twice and the root unit once in every micro-batch, SHARD_GRAD_OP
    keeps what it gathered until the step's last backward."""
    for exp_id in ("ddp", "fsdp", "fsdp-grad-op"):
        train = resolve(exp_id, "gpu", check_files=False).recipe["train"]
        micro_batches = train["global_batch_size"] // (train["micro_batch_size"] * 4)
        assert (train["global_batch_size"], train["micro_batch_size"], micro_batches) == (32, 4, 2)
        found = arithmetic.communication(exp_id, ranks=4)
        assert found.micro_batches == micro_batches
        a, root = micro_batches, found.root_share
        expected = {"ddp": 2, "fsdp": 2 * a + 1 - a * root, "fsdp-grad-op": 2}[exp_id]
        assert found.psi_multiple == pytest.approx(expected)
        assert found.per_gpu_gib == pytest.approx(found.psi_multiple * found.psi_gib * 3 / 4)  # ring, N = 4
    text = arithmetic.communication("fsdp").markdown()
    assert "4.92Ψ per optimizer step" in text and "lower bound" in text and "GPU-to-GPU link" in text
    offload = arithmetic.communication("deepspeed-offload").markdown()
    assert "GPU→host" in offload and "PCIe" in offload  # the offload's host-device transfers, over their link


def test_the_tensor_count_follows_a_storage_resized_in_place():
    """FSDP2 frees a unit's gathered weights with ``untyped_storage().resize_(0)`` and gathers into the same
    storage again: the count must follow, or every gathered unit stays counted (a +100 % error on FSDP)."""
    from lab_helpers.training.tensor_peak import LiveTensorPeak

    with LiveTensorPeak() as tensors:
        held = torch.empty(2**20, dtype=torch.uint8)
        assert tensors.current_bytes == 2**20
        held.untyped_storage().resize_(0)
        assert tensors.current_bytes == 0
        held.untyped_storage().resize_(2**19)
        assert tensors.current_bytes == 2**19 and tensors.peak_bytes == 2**20


def _simulated(exp_id: str, world: int, results) -> dict:
    from lab_helpers.lab import run_experiment

    micro = resolve(exp_id, "ci", SMALL, check_files=False).recipe["train"]["micro_batch_size"]
    overrides = {**SMALL, "train.global_batch_size": micro * world * 2}  # 2 micro-batches per step, as on 4 GPUs
    [record] = run_experiment(
        exp_id, profile="ci", overrides=overrides, simulate_world=world, echo=False, summary=False, quick=True,
        results_path=results / "runs.jsonl",
    )  # fmt: skip
    assert record["status"] == "ok", record.get("error")
    assert (record["world_size"], record["simulated_world_size"], record["rank"]) == (1, world, 0)
    assert f"simulated rank 0 of {world}" in record["strategy_used"]
    return record


def _within_target(record: dict) -> float:
    measured, predicted = record["peak_tensor_gib"], record["predicted_peak_alloc_gib"]
    assert measured and predicted, record
    error = (predicted - measured) / measured
    assert abs(error) <= 0.10, f"{record['experiment']}: predicted {predicted * GIB:.0f} B, measured {measured * GIB:.0f} B"
    return error


@pytest.mark.slow
def test_a_simulated_fsdp_rank_is_measured_and_predicted_within_10_percent(ci_assets, results):
    record = _simulated("fsdp", 4, results)
    assert "fsdp2 (ModelParallelStrategy" in record["strategy_used"]
    _within_target(record)


@pytest.mark.slow
def test_a_simulated_zero3_offload_rank_is_measured_and_predicted_within_10_percent(ci_assets, results):
    record = _simulated("deepspeed-offload", 8, results)
    assert "deepspeed zero3 + cpu offload" in record["strategy_used"]
    _within_target(record)


def test_tables_and_plots_never_put_a_simulated_rank_in_a_real_runs_row():
    import pandas as pd

    from lab_helpers.present.tables import comparison_table
    from lab_helpers.record.records import simulated_label

    real = [{"experiment": "fsdp", "rank": r, "world_size": 4, "status": "ok", "peak_tensor_gib": 0.05,
             "started_at": "2026-01-01T00:00:00+00:00"} for r in range(4)]  # fmt: skip
    simulated = {"experiment": "fsdp", "rank": 0, "world_size": 1, "simulated_world_size": 4, "status": "ok",
                 "peak_tensor_gib": 0.06, "started_at": "2026-01-02T00:00:00+00:00"}  # fmt: skip
    table = comparison_table(pd.DataFrame([*real, simulated, {**real[0], "experiment": "ddp"}]), order=["fsdp", "ddp"])
    label = simulated_label("fsdp", 4)
    assert list(table["experiment"]) == ["fsdp", label, "ddp"]  # its own row, right after the real run's
    assert "no communication" in label and "simulated" in label
    assert table.set_index("experiment").loc[label, "peak_tensor_gib"] == pytest.approx(0.06)
