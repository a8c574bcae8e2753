"""The FSDP sentences (02's prose, multi.yaml's `teaches:` lines, the answer key on the shipped h200 reference)
against ``arithmetic``'s counts, so that they cannot drift from what the lab runs again.

The counts themselves are pinned, and checked against torch's real collectives, in tests/test_communication.py."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from lab_helpers.config.experiments import load_experiments
from lab_helpers.planning import arithmetic

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "02_multi_gpu.ipynb"

# what 02 and the answer key said before, each wrong for the FSDP the lab runs
WRONG = ("3Ψ per micro-batch", "2Ψ instead of 3Ψ", "6Ψ", "4Ψ", "4 against 6", "do not change (8/N",
         "3 model-sized", "in every micro-batch**: 3Ψ")  # fmt: skip


def _cell(start: str) -> str:
    """The one Markdown cell of 02 that starts with ``start`` (found by content, not by index)."""
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells
             if c.cell_type == "markdown" and c.source.startswith(start)]  # fmt: skip
    assert len(cells) == 1, (start, len(cells))
    return " ".join(cells[0].split())  # one line: a phrase may wrap


@pytest.fixture(scope="module")
def counts() -> dict[str, arithmetic.Communication]:
    return {
        "ddp": arithmetic.communication("ddp"),
        "fsdp": arithmetic.communication("fsdp"),
        "fsdp2": arithmetic.communication("fsdp", fsdp_impl="fsdp2"),
        "fsdp-course": arithmetic.communication("fsdp-course"),
        "fsdp-grad-op": arithmetic.communication("fsdp-grad-op"),
        "grad-op2": arithmetic.communication("fsdp-grad-op", fsdp_impl="fsdp2"),
    }


def test_02_states_the_bytes_per_param_fsdp1_holds_while_it_accumulates():
    per_param = arithmetic.fsdp_bytes_per_param("fsdp")
    assert per_param == {"sharded": "8/N", "accumulating": "2 + 6/N"}  # bf16-true: 2 + 2 + 4 B, the gradients whole
    fsdp, bs8 = _cell("## 3 · `fsdp`"), _cell("## 4 · `fsdp-bs8`")
    for cell in (fsdp, bs8):
        assert f"{per_param['accumulating']} bytes/param" in cell and per_param["sharded"] in cell
    assert arithmetic.fsdp_bytes_per_param("fsdp-bs8") == per_param  # the same sharding and precision
    # the one unit holds the whole weights and the whole gradient (the planner's 2Ψ of communication buffers)
    assert "all the weights and all the gradients" in _cell("## 3b · `fsdp-course`")


def test_02_states_arithmetics_formulas_for_each_fsdp(counts):
    talk, course, grad_op = (_cell(s) for s in ("**Communication per optimizer step.**", "## 3b · `fsdp-course`",
                                                "## 4b · `fsdp-grad-op`"))  # fmt: skip
    assert counts["fsdp"].volume.formula == "(2a + 1)Ψ − aΨ_root"
    for cell in (talk, course, grad_op):
        assert counts["fsdp"].volume.formula in cell
    assert counts["fsdp2"].volume.formula in talk and f"{counts['ddp'].volume.formula} whatever a" in talk
    # the course's one unit: (a + 1)Ψ, 2Ψ at its one micro-batch
    one = counts["fsdp-course"]
    assert (one.volume.formula, one.micro_batches) == ("(a + 1)Ψ", 1)
    assert f"**{one.psi_multiple:g}Ψ** ({one.volume.formula} with a micro-batches)" in course
    # SHARD_GRAD_OP under no_sync: 2Ψ whatever a; FSDP2's 2aΨ on the CPU ranks
    assert counts["fsdp-grad-op"].volume.formula == "2Ψ" and "**2Ψ whatever a**" in grad_op
    assert f"({counts['grad-op2'].volume.formula})" in grad_op


FSDP_CELLS = ("## 3 · `fsdp`", "**Communication per optimizer step.**", "## 3b · `fsdp-course`", "## 4 · `fsdp-bs8`",
              "## 4b · `fsdp-grad-op`")  # fmt: skip


def test_nothing_in_02_or_the_yaml_says_the_old_fsdp_counts():
    """ZeRO-3's 3Ψ per micro-batch (02's DeepSpeed cells) is right: DeepSpeed reduce-scatters every backward."""
    cells = [_cell(start) for start in FSDP_CELLS]
    teaches = [e.teaches for e in load_experiments("multi").values() if e.strategy == "fsdp"]
    for text in cells + teaches:
        found = [w for w in WRONG if w in text]
        assert not found, (found, text[:120])


def test_multi_yaml_teaches_arithmetics_counts(counts):
    experiments = load_experiments("multi")
    assert counts["fsdp"].volume.formula in experiments["fsdp"].teaches
    assert arithmetic.fsdp_bytes_per_param("fsdp")["accumulating"] in experiments["fsdp"].teaches
    course = experiments["fsdp-course"].teaches
    assert counts["fsdp-course"].volume.formula in course and counts["fsdp"].volume.formula in course
    assert f"{counts['fsdp-course'].psi_multiple:g}Ψ at the course's one micro-batch" in course
    grad_op = experiments["fsdp-grad-op"].teaches
    assert f"{counts['fsdp-grad-op'].volume.formula} whatever the accumulation" in grad_op
    assert counts["fsdp"].volume.formula in grad_op


@pytest.fixture(scope="module")
def h200_key() -> str:
    from lab_helpers.present import answers

    return " ".join(answers.report("h200-141gb", notebook="02").split())


def _answer(key: str, section: str) -> str:
    start = key.index("Answer (", key.index(f"--- {section} ---"))
    end = key.find(" --- ", start)
    return key[start : end if end > 0 else None]


def test_the_h200_answer_key_says_arithmetics_counts(h200_key, counts):
    from lab_helpers.config.record_schema import GIB

    fsdp = _answer(h200_key, "fsdp")
    assert counts["fsdp"].total_words() in fsdp  # (2a + 1)Ψ − aΨ_root at a = 2 = 4.92Ψ
    for a in (1, 4):
        assert f"{arithmetic.communication('fsdp', micro_batches=a).psi_multiple:.3g}Ψ" in fsdp
    assert "once per step" in fsdp and "no_sync" in fsdp
    course = _answer(h200_key, "fsdp-course")
    assert f"the one unit's {counts['fsdp-course'].total_words()}" in course  # (a + 1)Ψ at a = 1 = 2Ψ
    assert arithmetic.communication("fsdp", micro_batches=1).total_words() in course
    assert f"{2 * counts['fsdp'].volume.psi_bytes / GIB:.2f} GiB whatever N" in course  # weights + gradient: 2Ψ
    grad_op = _answer(h200_key, "fsdp-grad-op")
    full, two = counts["fsdp"], counts["fsdp-grad-op"]
    assert f"({full.total_words()}) against {two.per_gpu_gib:.2f} GiB ({two.total_words()})" in grad_op
    assert f"{full.per_gpu_gib - two.per_gpu_gib:.2f} GiB saved" in grad_op
    assert "first forward to its last backward" in grad_op
    assert not re.search(r"\b3Ψ\b", fsdp + course + grad_op)


def test_02_named_not_run_compares_tensor_parallel_with_fsdps_sharded_bytes():
    """The "Named, not run" question says FSDP and tensor parallel both leave 8/N between steps: FSDP's sharded
    figure (arithmetic), and tensor parallel's formula in the table (planning.parallelisms) has the same 8/N."""
    from lab_helpers.planning import parallelisms

    sharded = arithmetic.fsdp_bytes_per_param("fsdp")["sharded"]
    question = " ".join(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells
                        if c.cell_type == "markdown" and "Tensor parallel and FSDP" in c.source).split()  # fmt: skip
    assert f"{sharded} bytes/param per GPU between steps" in " ".join(question)
    rows = {r.name: r for r in parallelisms.rows(parallelisms.reference_setting())}
    assert rows["FSDP full shard (runs: `fsdp`)"].formula.startswith(sharded)
    assert rows["Tensor parallel"].formula.startswith(f"{sharded};")


def test_the_13b_answers_give_fsdp_the_bytes_it_holds_while_accumulating():
    """01's "make 13B fit" answer and 04's routes list FSDP at what a GPU holds while Lightning accumulates under
    FSDP1's no_sync (the gradients whole), 01's with the sharded figure between steps beside it."""
    from lab_helpers.planning.decision import SIMULATED_WORLD
    from lab_helpers.present import answers

    key = " ".join(answers.report("h200-141gb", notebook="01").split())
    full_13b = _answer(key, "full-13b")
    per_param = {
        k: v.replace("N", str(SIMULATED_WORLD)) for k, v in arithmetic.fsdp_bytes_per_param("full-13b").items()
    }
    assert f"while a step accumulates ({per_param['accumulating']}:" in full_13b
    sharded = arithmetic.model_states("full-13b").trained.total / SIMULATED_WORLD  # 8/N at N = 4
    assert per_param["sharded"] == f"{arithmetic.model_states('full-13b').trained.total:g}/{SIMULATED_WORLD}"
    assert f"{sharded:.3g} B/param between steps" in full_13b
    routes = _answer(" ".join(answers.report("h200-141gb", notebook="04").split()), "things-to-try")
    assert f"({per_param['accumulating']} B/param while a step accumulates)" in routes
