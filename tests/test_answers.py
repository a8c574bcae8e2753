"""The answer key (`python -m lab_helpers answers`): every notebook question answered from each shipped reference,
its figures the records' own, what a reference cannot answer said, and no question without an entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab_helpers.config.paths import reference_dir
from lab_helpers.present import answers

REFERENCES = ("ci-cpu", "h100-80gb", "h200-141gb")


def _cli(*args: str, env_dir: Path) -> subprocess.Popen:
    import os

    env = {**os.environ, "LAB_RESULTS": str(env_dir)}
    return subprocess.Popen([sys.executable, "-m", "lab_helpers", "answers", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


_EACH_REFERENCE = """
import contextlib, io, json, sys, traceback
from lab_helpers.cli import main

done = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["answers", "--reference", name])
        except BaseException:
            code = -1
            traceback.print_exc()
    done[name] = (code, out.getvalue(), err.getvalue())
json.dump(done, sys.__stdout__)
"""


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, ci_assets) -> dict[str, tuple[int, str, str]]:
    """Each reference's key, made once for the module by the CLI's ``main`` (``answers --reference NAME``), the
    three in one child process: torch, litgpt and the planner's memo are paid for once, not three times;
    ``test_unknown_reference_is_one_line_and_exit_2`` runs the module entry point itself. The ci stand-ins'
    configs are built (``ci_assets``): the arithmetic of ci-cpu's answers counts them."""
    import os

    env = {**os.environ, "LAB_RESULTS": str(tmp_path_factory.mktemp("results"))}
    done = subprocess.run([sys.executable, "-c", _EACH_REFERENCE, *REFERENCES], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {name: tuple(result) for name, result in json.loads(done.stdout).items()}


def _records(name: str) -> dict[str, dict]:
    """The latest rank-0 record of each experiment (the smallest simulated world first), straight from the jsonl."""
    latest: dict[str, dict] = {}
    lines = (reference_dir() / f"{name}.jsonl").read_text().splitlines()
    records = sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: r.get("started_at") or "")
    for record in records:
        if record.get("rank") in (None, 0):
            world = record.get("simulated_world_size") or 1
            held = latest.get(record["experiment"])
            if held is None or world <= (held.get("simulated_world_size") or 1):
                latest[record["experiment"]] = record
    return latest


def _gib(value: float) -> str:
    return f"{value:.2f} GiB" if abs(value) >= 1 else f"{value * 1024:.1f} MiB"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _answer(output: str, section: str, n: int = 1) -> str:
    """The answer to a section's ``n``-th question (whitespace-normalised): by section, so a reworded question keeps
    its test."""
    flat = _flat(output)
    start = flat.index(f"--- {section} ---")
    for _ in range(n):
        start = flat.index("Answer (", start + 1)
    ends = [i for i in (flat.find(" Q1. ", start), flat.find(" Q2. ", start), flat.find(" --- ", start)) if i > 0]
    return flat[start : min(ends)] if ends else flat[start:]


def test_questions_come_from_every_notebook_keyed_by_section():
    questions = answers.notebook_questions()
    assert {q.notebook for q in questions} == {"00", "01", "02", "03", "04"}
    keys = [q.key for q in questions]
    assert len(keys) == len(set(keys)), keys
    sections = {q.section for q in questions if q.notebook == "01"}
    assert {"baseline", "grad-accum", "act-ckpt", "fill-gpu", "activations-by-hand"} <= sections, sections
    assert all(q.text.startswith(answers.MARK) and len(q.text) > 30 for q in questions)


def test_every_notebook_question_has_an_answer_entry():
    """A question without an entry fails here: write its answer function in lab_helpers/present/answers/ (its notebook's module)."""
    missing = answers.unanswered(answers.notebook_questions())
    assert not missing, "no answer entry for: " + "; ".join(f"{q.key}: {q.text[:80]}" for q in missing)


def test_a_new_question_is_reported_without_an_entry(tmp_path, monkeypatch):
    cells = [
        {"cell_type": "markdown", "source": ["## 3 · `grad-accum`: the big batch\n", "\n", "Prose.\n"]},
        {"cell_type": "markdown", "source": ["**Question.** What did it cost?\n", "Per sample?"]},
        {"cell_type": "markdown", "source": ["## 99 · `brand-new`: a section\n", "\n", "**Question.** And this?"]},
    ]
    (tmp_path / "01_single_gpu.ipynb").write_text(json.dumps({"cells": cells}))
    questions = answers.notebook_questions(tmp_path)
    assert [q.key for q in questions] == [("01", "grad-accum", 1), ("01", "brand-new", 1)]
    assert questions[0].text == "**Question.** What did it cost? Per sample?"
    assert [q.key for q in answers.unanswered(questions)] == [("01", "brand-new", 1)]
    monkeypatch.setattr(answers, "notebooks_dir", lambda: tmp_path)
    out = answers.report("ci-cpu")
    assert "no answer entry for this question yet" in out and "no answer entry: 01 brand-new Q1" in out


def test_section_keys():
    assert answers.section_key("## 3 · `grad-accum`: the big batch at the small batch's memory") == "grad-accum"
    assert answers.section_key("## 6 · Timeline: where the GPUs wait") == "timeline-where-the-gpus-wait"
    assert answers.section_key("### Activations by hand") == "activations-by-hand"


@pytest.mark.parametrize("name", REFERENCES)
def test_the_cli_answers_every_question(outputs, name):
    code, out, err = outputs[name]
    assert code == 0, err[-2000:]
    assert "Traceback" not in out + err
    flat = _flat(out)
    for q in answers.notebook_questions():
        assert _flat(q.text.replace(answers.MARK, f"Q{q.n}.")) in flat, q.key
    assert flat.count(f"Answer ({name}):") == len(answers.notebook_questions())
    assert "no answer entry" not in out
    assert max(len(line) for line in out.splitlines()) <= answers.WIDTH
    assert f"{name} cannot answer" in out


def test_h200_figures_are_the_records_own(outputs):
    out, r = outputs["h200-141gb"][1], _records("h200-141gb")
    saved = r["full-7b"]["peak_alloc_gib"] - r["act-ckpt"]["peak_alloc_gib"]
    assert f"Saved {_gib(saved)}" in _answer(out, "act-ckpt", 2)
    extra = r["ddp-course"]["peak_alloc_gib"] - r["ddp"]["peak_alloc_gib"]
    per_param = extra * 2**30 / r["ddp-course"]["predicted"]["total_params"]
    course = _answer(out, "ddp-course")
    assert f"holds {_gib(extra)} more" in course and f"per parameter {per_param:.2f} B" in course
    grew = r["fsdp-bs8"]["peak_alloc_gib"] - r["fsdp"]["peak_alloc_gib"]
    assert f"+{_gib(grew)}" in _answer(out, "fsdp-bs8")
    ck = r["act-ckpt"]["predicted"]["breakdown_gib"]
    phases = _answer(out, "act-ckpt")
    assert (
        f"temporaries, {_gib(r['full-7b']['predicted']['breakdown_gib']['temporaries'])} -> {_gib(ck['temporaries'])}"
        in phases
    )
    assert "simulated rank" in _answer(out, "ddp")
    predicted = {e: _gib(r[e]["predicted"]["peak_alloc_gib"]) for e in ("full-7b", "act-ckpt")}
    assert f"the peak only {predicted['full-7b']} -> {predicted['act-ckpt']}" in phases
    lever = _answer(out, "the-lever-how-adamw-steps")
    assert "the foreach step as stored with h200-141gb's run; the for-loop step traced by the planner now" in lever
    assert f"the foreach step {_gib(r['act-ckpt']['peak_alloc_gib'])} against" in lever
    assert "moves back to the backward" in lever and "did not run `act-ckpt` with the for-loop step" in lever


def test_the_profile_regime_is_the_records_own(outputs):
    """03's profiler question: the H200's profiled small-batch, by the bound rule on its device-idle share; the
    references without a profiled run say so."""
    from lab_helpers.present.tables import REGIME_WORDS
    from lab_helpers.record.time_bound import band

    summary = next(
        r["torch_profile_summary"] for r in map(json.loads, (reference_dir() / "h200-141gb.jsonl").open())
        if r["experiment"] == "small-batch" and r.get("torch_profile_summary")
    )  # fmt: skip
    busy = 100 - summary["device_idle_pct"]
    said = _answer(outputs["h200-141gb"][1], "one-profiler-trace-which-regime")
    assert f"{REGIME_WORDS[band(busy)]} (`bound: {band(busy)}`): device busy {busy:.0f} % of the step" in said
    for name in ("ci-cpu", "h100-80gb"):
        assert "has no profiled run" in _answer(outputs[name][1], "one-profiler-trace-which-regime")


def test_h100_figures_are_the_records_own(outputs):
    out, r = outputs["h100-80gb"][1], _records("h100-80gb")
    parts = r["baseline"]["predicted"]["breakdown_gib"]
    assert f"The largest predicted part is activations: {_gib(max(parts.values()))}" in _answer(out, "baseline")
    saved = r["lora-7b"]["peak_alloc_gib"] - r["qlora-7b"]["peak_alloc_gib"]
    assert f"({_gib(saved)} saved" in _answer(out, "qlora-7b")
    share = 100 * r["lora-3b"]["peak_alloc_gib"] / r["full-3b"]["peak_alloc_gib"]
    assert f"`lora-3b` needs {share:.0f} %" in _answer(out, "lora-3b")
    reserved = r["small-batch"]["peak_reserved_gib"] - r["small-batch"]["peak_alloc_gib"]
    assert f"= {_gib(reserved)}" in _answer(out, "small-batch")


def test_ci_figures_are_the_records_own_and_what_a_cpu_cannot_answer(outputs):
    out, r = outputs["ci-cpu"][1], _records("ci-cpu")
    sgd = r["full-13b"]["peak_tensor_gib"] - r["full-13b-sgd"]["peak_tensor_gib"]
    assert f"{_gib(sgd)} less" in _answer(out, "full-13b-sgd")
    from lab_helpers.present.speed_pairs import compare
    from lab_helpers.record.records import conformed, read_records

    every = [conformed(x) for x in read_records(reference_dir() / "ci-cpu.jsonl")]  # both runs of each
    verdict = compare(every, "grad-accum", "small-batch")  # the one rule the key reads
    assert f"Per sample: {verdict.words()}" in _answer(out, "grad-accum")
    assert "a CPU has no GPU memory" in _answer(out, "full-7b")
    assert "did not run `act-ckpt`" not in _answer(out, "act-ckpt")  # ci-cpu runs the beyond-the-course ones too
    assert "recorded `qlora-7b` as skipped" in out or "`qlora-7b` record has no prediction" in out


def test_the_lever_measured_where_a_reference_ran_it():
    """01's lever (`optimizer.foreach=false` on act-ckpt) from a reference that ran both steps: the H200's records of
    benchmarks/optimizer_step.sh beside h200-141gb's. Both predictions are the stored ones (nothing traced), the
    measured peaks are the records' own, and the later step variants never stand for `act-ckpt` as defined."""
    from lab_helpers.record.records import conformed, read_records

    lever = Path(__file__).resolve().parent.parent / "benchmarks" / "optimizer_step_h200.records.jsonl"
    bench = [conformed(r) for r in read_records(lever)]
    ref = [conformed(r) for r in read_records(reference_dir() / "h200-141gb.jsonl")]
    f = answers.Facts("h200-lever", ref + bench)
    assert not (f.record("act-ckpt").get("overrides") or {}).keys() & {"optimizer.foreach", "optimizer.fused"}
    said = answers.ANSWERS[("01", "the-lever-how-adamw-steps", 1)](f)
    assert not said.missing, said.missing
    peak = {r["predicted"]["optimizer_step"]: r["peak_alloc_gib"] for r in bench}
    assert "the foreach and the for-loop steps as stored with h200-lever's runs" in said.text
    assert f"the for-loop step {_gib(peak['for-loop'])} in backward against" in said.text
    fell = peak["foreach"] - peak["for-loop"]
    assert f"{_gib(peak['foreach'])} -> {_gib(peak['for-loop'])} ({_gib(fell)};" in said.text
    saved = f.peak("full-7b") - f.peak("act-ckpt")  # against the as-defined run, the foreach step's
    assert f"Saved {_gib(saved)}" in answers.ANSWERS[("01", "act-ckpt", 2)](f).text and saved > 0


def test_unknown_reference_is_one_line_and_exit_2(tmp_path):
    process = _cli("--reference", "no-such-gpu", env_dir=tmp_path)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert len(err.strip().splitlines()) == 1 and all(name in err for name in REFERENCES), err


def test_notebook_filter_and_markdown():
    out = answers.report("ci-cpu", notebook="03", markdown=True)
    assert "## 03_compare" in out and "01_single_gpu" not in out and "**Answer (ci-cpu).**" in out


@pytest.mark.parametrize("notebook", ["99", "1"])
def test_unknown_notebook_is_one_line_and_exit_2(tmp_path, notebook):
    """A typo in --notebook printed a key of "0 of 0 questions" and exited 0, as if the notebook asked nothing."""
    process = _cli("--reference", "ci-cpu", "--notebook", notebook, env_dir=tmp_path)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, (out, err)
    assert not out and len(err.strip().splitlines()) == 1 and "00, 01, 02, 03, 04" in err, err
