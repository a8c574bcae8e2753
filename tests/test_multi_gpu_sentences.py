"""02's sentences other than FSDP's (tests/test_fsdp_sentences.py) against the lab's code, configs and shipped
records: the sampling interval it names, the batches it no longer types, what it says no shipped
record measured, the offload's wait as a prediction, and the "Named, not run" section."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import nbformat
import pytest

from lab_helpers.config.experiments import gradient_accumulation_steps, resolve
from lab_helpers.config.paths import reference_dir

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "02_multi_gpu.ipynb"


def _cells() -> list[nbformat.NotebookNode]:
    return nbformat.read(NOTEBOOK, as_version=4).cells


def _cell(start: str) -> str:
    """The one Markdown cell of 02 that starts with ``start``, on one line (a phrase may wrap)."""
    found = [c.source for c in _cells() if c.cell_type == "markdown" and c.source.startswith(start)]
    assert len(found) == 1, (start, len(found))
    return " ".join(found[0].split())


def _shipped(exp_id: str) -> list[dict]:
    return [
        record
        for path in sorted(reference_dir().glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and (record := json.loads(line)).get("experiment") == exp_id
    ]


def test_the_sampling_interval_02_and_03_name_is_the_runners():
    from lab_helpers.launch.runner import run_command
    from lab_helpers.launch.sampler import TimelineSampler

    interval = inspect.signature(run_command).parameters["sample_interval_s"].default
    assert interval == inspect.signature(TimelineSampler).parameters["interval_s"].default
    assert f"every {interval * 1000:g} ms (the runner's default `sample_interval_s`)" in _cell("# 02 · Multiple GPUs")
    timeline = [c.source for c in nbformat.read(ROOT / "notebooks" / "03_compare.ipynb", as_version=4).cells
                if c.cell_type == "markdown" and c.source.startswith("## The GPU timeline of one run")]  # fmt: skip
    assert f"every {interval * 1000:g} ms (the runner's default `sample_interval_s`)" in " ".join(timeline[0].split())
    callers = [p for p in (ROOT / "lab_helpers").rglob("*.py") if "sample_interval_s=" in p.read_text(encoding="utf-8")]
    assert not callers, f"a run may sample at another interval than 02 says: {callers}"


def test_02_types_no_batch_and_prints_it_from_the_recipes():
    from lab_helpers.present.multi_gpu import SCALING_GPUS, batch_words

    ddp = _cell("## 2 · `ddp`")
    assert not re.search(r"\b(16|32) samples|\b32 for `ddp`|32 / \(4", ddp), ddp
    one, multi = resolve("one-gpu", "gpu", check_files=False), resolve("ddp", "gpu", check_files=False)
    text = batch_words({}, "one-gpu", "ddp")
    micro, glob = one.recipe["train"]["micro_batch_size"], one.recipe["train"]["global_batch_size"]
    assert f"one-gpu: {glob} = {micro} × {one.gradient_accumulation} × 1" in text
    train = multi.recipe["train"]
    spelled = [f"{train['micro_batch_size']} × {gradient_accumulation_steps(multi.recipe, world_size=n)} × {n}"
               for n in SCALING_GPUS]  # fmt: skip
    assert f"ddp: {train['global_batch_size']} = " + " = ".join(spelled) in text
    assert one.gradient_accumulation > 1  # so 02 says the course's one-GPU run (no accumulation) is not `one-gpu`
    assert f"micro batch {micro}" in _cell("## 1 · `one-gpu`")
    assert f"at batch {micro} with no accumulation" in _cell("## 1 · `one-gpu`")
    assert "accumulate alike" in _cell("**Question.** Compare `peak_alloc_gib` of every rank")


def test_what_02_says_no_shipped_record_measured():
    """02 says no shipped `ddp` record has communication in it (all simulated ranks), that the `fsdp` rows are
    simulated too (fsdp-bs8's sentence), and that no shipped record has run `deepspeed-offload`: a real run shipped
    later must change those sentences, and fails here until it does."""
    assert "every `ddp` record there is a simulated rank" in _cell("## 2 · `ddp`")
    assert "their `fsdp` rows are simulated ranks" in _cell("## 4 · `fsdp-bs8`")
    for exp_id in ("ddp", "fsdp", "fsdp-bs8"):
        real = [r for r in _shipped(exp_id) if (r.get("world_size") or 1) > 1]
        assert _shipped(exp_id) and not real, (exp_id, len(real))
    assert "no shipped record has run `deepspeed-offload`" in _cell("## 5 · `deepspeed-offload`")
    assert not _shipped("deepspeed-offload")


def test_the_offloads_wait_is_said_as_the_time_models_prediction(monkeypatch):
    from types import SimpleNamespace

    from lab_helpers.present import multi_gpu, plan_command

    plan = SimpleNamespace(devices=4, device_name="NVIDIA H100 80GB HBM3", gradient_accumulation_iters=4,
                           micro_batch_size=4, compute_s=3.0, offload_s=9.0, optimizer_host_s=8.0,
                           offload_transfer_s=1.0, step_s=12.0, communication_s=0.0)  # fmt: skip
    monkeypatch.setattr(plan_command, "experiment_time", lambda exp_id, profile: (plan, "", None))
    text = multi_gpu.offload_time_words()
    assert text.startswith("Predicted by the time model, not measured")
    assert "compute 3 s, then wait 9 s for the offload (the CPU's Adam step 8 s" in text
    assert "PCIe 1 s): 75 % of the 12 s step" in text and "not included" in text
    monkeypatch.setattr(plan_command, "experiment_time", lambda exp_id, profile: (None, "no GPU to time on", None))
    assert multi_gpu.offload_time_words() == "deepspeed-offload: no time prediction (no GPU to time on)"
    code = [c.source for c in _cells() if c.cell_type == "code" and "offload_time_words()" in c.source]
    assert len(code) == 1 and 'node_plan.decide("deepspeed-offload"' in code[0]


def test_the_named_not_run_section_is_one_call_and_one_question():
    cells = _cells()
    start = [i for i, c in enumerate(cells) if c.source.startswith("## 8 · Named, not run")]
    assert len(start) == 1
    section = []
    for cell in cells[start[0] + 1 :]:
        if cell.cell_type == "markdown" and cell.source.startswith("#"):
            break
        section.append(cell)
    code = [c.source for c in section if c.cell_type == "code"]
    assert [line.split("#")[0].strip() for line in code] == ["parallelisms.show(NODE)"]
    assert len([c for c in section if c.source.startswith("**Question.**")]) == 1
    link = re.search(r"\]\(\.\./(docs/parallelisms\.md)\)", cells[start[0]].source)
    assert link and (ROOT / link.group(1)).is_file()


@pytest.fixture(scope="module")
def h200_key() -> str:
    from lab_helpers.present import answers

    return " ".join(answers.report("h200-141gb", notebook="02").split())


def test_the_ddp_answer_says_each_runs_accumulation_from_its_record(h200_key):
    ddp = h200_key[h200_key.index("--- ddp ---") : h200_key.index("--- ddp-course ---")]
    one = resolve("full-7b", "gpu", check_files=False)  # h200-141gb ran full-7b, not one-gpu
    multi = resolve("ddp", "gpu", check_files=False, simulate_world=4)
    assert (f"`full-7b` accumulates {one.gradient_accumulation} micro-batches per optimizer step" in ddp
            and f"`ddp` on 4 GPUs {multi.gradient_accumulation}" in ddp)  # fmt: skip
    assert "Not like for like" in ddp and "no accumulation" in ddp
