"""02's "Named, not run" table (``lab_helpers.planning.parallelisms``): each parallelism's model
states per GPU for the 7B, checked against the parameter counts by part and the bytes per parameter, and
docs/parallelisms.md's generated table current."""

from __future__ import annotations

import math

import pytest

from lab_helpers.config.record_schema import GIB
from lab_helpers.planning import arithmetic, parallelisms
from lab_helpers.planning.decision import LAB_GPU_GIB, SIMULATED_WORLD
from lab_helpers.planning.parallelisms import Setting


@pytest.fixture(scope="module")
def parts() -> parallelisms.ModelParts:
    from lab_helpers.config.experiments import resolve, resolve_path

    run = resolve(parallelisms.EXPERIMENT, "gpu", check_files=False)
    return parallelisms.model_parts(str(resolve_path(run.recipe["checkpoint_dir"])))


def _rows(n: int, per_node: int | None = None, nodes: int = 2, **how) -> dict[str, parallelisms.Parallelism]:
    setting = Setting(n, per_node or n, nodes, LAB_GPU_GIB, "test")
    return {row.name.split(" (")[0]: row for row in parallelisms.rows(setting, **how)}


def test_the_7b_counted_by_part_adds_up_to_the_arithmetics_count(parts):
    counts = arithmetic.model_states(parallelisms.EXPERIMENT).counts
    assert parts.total == counts.total and parts.root == counts.outside_blocks
    assert (parts.name, parts.layers, parts.experts) == ("open_llama_7b", 32, 0)  # dense: no experts
    norms = parts.total - parts.block_linear - parts.embedding - parts.head - parts.final_norm
    assert 0 < norms == 2 * parts.layers * parts.hidden  # each block's two RMSNorms, nothing else outside the linears
    assert parts.block * parts.layers + parts.root == parts.total


def test_tensor_parallel_at_2_halves_the_split_layers_states_and_keeps_the_norms_whole(parts):
    per_param = arithmetic.model_states(parallelisms.EXPERIMENT).trained.total  # 2 + 2 + 4 in bf16-true
    assert per_param == 8
    split = parts.block_linear + parts.embedding + parts.head
    whole = parts.total - split
    one, two = (per_param * split / GIB, per_param * whole / GIB)
    rows = _rows(2)
    assert rows["Tensor parallel"].per_gpu_gib == pytest.approx(one / 2 + two)
    assert rows["Sequence parallel"].per_gpu_gib == rows["Tensor parallel"].per_gpu_gib  # the same model states
    assert rows["Tensor parallel"].formula.startswith(f"{per_param}/N; the norms ({whole:,} parameters) {per_param}")
    # FSDP, the row the lab runs: 8/N between steps, 2 + 6/N while FSDP1 accumulates
    fsdp = rows["FSDP full shard"]
    assert fsdp.runs_here and fsdp.per_gpu_gib == pytest.approx(per_param * parts.total / 2 / GIB)
    assert f"{parts.total * (2 + 6 / 2) / GIB:.1f} GiB while accumulating" in fsdp.figure
    assert fsdp.formula.startswith("8/N; 2 + 6/N")


def test_pipeline_context_expert_and_node_shardings_at_4_gpus_on_2_nodes(parts):
    rows = _rows(4)
    full = 8 * parts.total / GIB
    assert rows["Context parallel"].per_gpu_gib == pytest.approx(full)  # splits activations, not model states
    largest = math.ceil(parts.layers / 4) * parts.block + max(parts.embedding, parts.head + parts.final_norm)
    assert rows["Pipeline parallel"].per_gpu_gib == pytest.approx(8 * largest / GIB)
    assert rows["Expert parallel"].per_gpu_gib == pytest.approx(full)  # the 7B is dense
    assert "is dense" in rows["Expert parallel"].figure
    assert rows["HSDP"].per_gpu_gib == pytest.approx(full / 4)  # 8/G whatever M
    assert rows["ZeRO++"].per_gpu_gib == pytest.approx(full / 8 + 2 * parts.total / 4 / GIB)  # 8/(GM) + 2/G
    assert rows["HSDP"].formula.startswith("8/G whatever M") and rows["ZeRO++"].formula.startswith("8/(G × M) + 2/G")


def test_parameter_offload_keeps_the_planners_zero3_working_set_and_18_bytes_a_parameter_on_the_host(parts):
    from lab_helpers.config.recipe_defaults import DS_PREFETCH_BUCKET_NUMEL, DS_REDUCE_BUCKET_NUMEL

    row = _rows(4)["ZeRO-Infinity / parameter offload"]
    live = min(parts.total, 10**9, parts.block + DS_PREFETCH_BUCKET_NUMEL) + parts.root
    assert row.per_gpu_gib == pytest.approx((2 * live + 2 * DS_REDUCE_BUCKET_NUMEL) / GIB)
    assert row.formula.endswith("host: 2 + 16 = 18")
    assert f"host {18 * parts.total / GIB:.0f} GiB" in row.figure


def test_expert_parallel_splits_a_mixture_of_experts_models_experts():
    mixtral = parallelisms.model_parts("checkpoints/mistralai/Mixtral-8x7B-v0.1")  # litgpt's config, on meta
    assert 0.9 < mixtral.experts / mixtral.total < 1
    row = _rows(8, model=mixtral)["Expert parallel"]
    assert row.per_gpu_gib == pytest.approx(8 * (mixtral.experts / 8 + mixtral.total - mixtral.experts) / GIB)
    assert "dense" not in row.figure


def test_the_setting_comes_from_the_node():
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total_gib": 79.2}
    eight = parallelisms.node_setting({"gpus": [gpu] * 8})
    assert (eight.ranks, eight.per_node, eight.nodes, eight.gpu_gib) == (8, 8, 2, 79.2)
    one = parallelisms.node_setting({"gpus": [gpu]})  # one GPU: LAB.md's 4, as a simulated rank plays
    assert (one.ranks, one.gpu_gib) == (SIMULATED_WORLD, 79.2) and "this node has 1 GPU" in one.words
    none = parallelisms.node_setting({})
    assert (none.ranks, none.gpu_gib) == (SIMULATED_WORLD, LAB_GPU_GIB) and "none here" in none.words


def test_tensor_parallel_all_reduces_the_activations_four_times_a_block(parts):
    traffic = parallelisms.tensor_parallel_traffic(4)
    assert traffic.all_reduces == 4 * parts.layers
    assert traffic.tensor_bytes == traffic.micro_batch * traffic.tokens * parts.hidden * 2  # bf16
    assert traffic.link_bytes_per_gpu == pytest.approx(traffic.all_reduces * 1.5 * traffic.tensor_bytes)


def test_docs_table_is_the_generated_one():
    """docs/parallelisms.md's table: `python scripts/write_parallelisms_doc.py` rewrites it."""
    from lab_helpers.config.paths import lab_home

    text = (lab_home() / "docs" / "parallelisms.md").read_text(encoding="utf-8")
    assert parallelisms.with_doc_block(text) == text, "out of date: run python scripts/write_parallelisms_doc.py"
    assert parallelisms.doc_block() in text
