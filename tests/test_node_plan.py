"""What the notebooks run, skip and say on each kind of node (lab_helpers.node_plan), from recorded nodes.

A CPU cannot produce an NVML reading or a GPU's memory verdict, so the nodes are recorded fixtures
(tests/node_fixtures.py) and, in the fast tests, the planner is replaced by a stand-in with the same interface:
model states from lab_helpers.planning.arithmetic (the real computation) plus a fixed activation cost per sample. The
planner itself is tested in test_planner.py; one slow test here asks the real planner.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from node_fixtures import NODES, node

from lab_helpers import node_plan
from lab_helpers.config.experiments import check_profile, load_experiments, pair_group, resolve
from lab_helpers.hardware.node import gpu_memory_gib
from lab_helpers.planning.arithmetic import GIB, model_states
from lab_helpers.planning.node_limits import reference_hint, smaller_model_checkpoint

ACTIVATION_GIB_PER_SAMPLE = {"1b": 2.0, "3b": 2.5, "7b": 3.0, "13b": 3.5}  # fixture: not measured figures
OVERHEAD_GIB = 1.0
MODEL_BY_FOLDER = {Path(smaller_model_checkpoint("gpu", m)).name: m for m in check_profile("gpu")["models"]}
SINGLE = list(load_experiments("single"))
MULTI = list(load_experiments("multi"))


class FixturePlanner:
    """Stand-in for lab.predict_experiment: gpu_used_gib = model states (/ ranks where sharded) + activations."""

    def __init__(self, the_node: dict) -> None:
        self.ranks = max(1, len(the_node["gpus"]))
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, exp_id: str, overrides) -> SimpleNamespace:
        self.calls.append((exp_id, dict(overrides)))
        run = resolve(exp_id, "gpu", overrides, check_files=False)
        states = model_states(exp_id, overrides=dict(overrides))
        gib = states.gib
        if run.experiment.strategy == "fsdp":
            gib /= self.ranks
        if run.experiment.options.get("offload_optimizer"):
            gib = states.counts.total * 4 / GIB / self.ranks  # bf16 weight and gradient shards only
        micro = run.recipe["train"]["micro_batch_size"]
        model = MODEL_BY_FOLDER[Path(run.recipe["checkpoint_dir"]).name]  # a substitute may change the model
        used = gib + ACTIVATION_GIB_PER_SAMPLE[model] * micro + OVERHEAD_GIB
        return SimpleNamespace(gpu_used_gib=used, peak_alloc_gib=used - OVERHEAD_GIB)

    def asked(self, exp_id: str) -> bool:
        return any(e == exp_id for e, _ in self.calls)


def oom_fixture(micro_by_exp: dict[str, int]):
    """Stand-in for lab.oom_demo_overrides on a node this CPU is not: the micro batch the planner would choose."""

    def choose(exp_id: str) -> tuple[dict, str]:
        micro = micro_by_exp.get(exp_id)
        if micro is None:
            return {}, "as defined: will OOM"
        return (
            {"train.micro_batch_size": micro, "train.global_batch_size": micro},
            f"micro batch raised to {micro} so that it will not fit",
        )

    return choose


def decide_all(name: str, exp_ids, *, oom=None, profile: str = "gpu"):
    the_node = node(name)
    planner = FixturePlanner(the_node)
    steps = {
        e: node_plan.decide(e, the_node, profile=profile, predict=planner, oom_overrides=oom or oom_fixture({}))
        for e in exp_ids
    }
    return steps, planner


@pytest.mark.slow
def test_every_recorded_node_gives_every_experiment_a_consistent_step():
    """The notebooks' final checks use expected_status: it must agree with whether the step runs, and say why."""
    for name in NODES:
        profile = "ci" if name == "none" else "gpu"
        steps, _ = decide_all(name, SINGLE + MULTI, profile=profile)
        for exp_id, step in steps.items():
            assert step.expected_status in ("ok", "oom", "skipped"), (name, exp_id, step)
            assert step.sentence, (name, exp_id)
            if not step.runs:
                assert step.expected_status == "skipped", (name, exp_id, step)


def test_no_gpu_runs_everything_on_ci_stand_ins_except_what_needs_cuda():
    steps, planner = decide_all("none", SINGLE + MULTI, profile="ci")
    needs_cuda = {"qlora-7b", "adamw-8bit", "attention-flash"}  # bitsandbytes' kernels; flash attention's lesson
    assert {e for e, s in steps.items() if not s.runs} == needs_cuda  # recorded as skipped
    assert {e for e, s in steps.items() if s.expected_status != "ok"} == needs_cuda
    assert steps["qlora-7b"].expected_status == "skipped" and "CUDA" in steps["qlora-7b"].sentence
    assert "ci-llama-xs" in steps["baseline"].sentence and "rank 0 of 4" in steps["ddp"].sentence
    # no GPU, so every one-node multi-GPU experiment runs as rank 0 of 4, simulated; the two loopback
    # nodes stay real, one-gpu stays one process
    simulated = {e for e, s in steps.items() if s.simulate_world}
    assert simulated == set(MULTI) - {"one-gpu", "multi-node"} and steps["ddp"].simulate_world == 4
    assert steps["ddp"].overrides == {"train.global_batch_size": 8}  # 4 ranks x micro 2 x 1, as each of 2 ranks
    assert not planner.calls  # the ci profile never waits for the planner to decide
    note = node_plan.section_note(node("none"), section="single", profile="ci")
    assert "ci-cpu" in note


def test_reference_hint_names_only_shipped_files():
    from lab_helpers.present.tables import reference_dir

    shipped = {p.stem for p in reference_dir().glob("*.jsonl")}
    named = re.search(r"shipped today: ([^;]+);", reference_hint()).group(1).split(", ")
    assert set(named) <= shipped and named, (named, shipped)


def test_one_gpu_runs_one_gpu_and_offload_and_simulates_what_needs_two():
    """DDP and FSDP run as rank 0 of 4 alone on the one GPU (memory real, no communication); only the
    two-node run, which needs 2 GPUs however it is played, is skipped."""
    steps, _ = decide_all("H100-80GB", MULTI)
    for exp_id in ("ddp", "ddp-course", "fsdp", "fsdp-course", "fsdp-bs8", "fsdp-grad-op"):
        assert steps[exp_id].runs and steps[exp_id].simulate_world == 4, steps[exp_id]
        assert "rank 0 of 4" in steps[exp_id].sentence and "no communication" in steps[exp_id].sentence
    assert [e for e, s in steps.items() if not s.runs] == ["multi-node"]
    assert "needs at least 2 GPUs" in steps["multi-node"].sentence and "reference results" in steps["multi-node"].sentence
    assert steps["one-gpu"].runs and steps["one-gpu"].expected_status == "ok"
    offload = steps["deepspeed-offload"]
    # 128 GiB of host RAM cannot hold the 13B's 16 B/param of offloaded optimizer: the 7B instead, said so
    assert offload.runs and offload.overrides["checkpoint_dir"].endswith("open_llama_7b")
    assert "runs the 7B" in offload.sentence
    note = node_plan.section_note(node("H100-80GB"), section="multi", profile="gpu")
    assert "one-gpu" in note and "rank 0 of 4" in note and "two-node run" in note and "skipped" in note


def test_four_h100s_run_the_whole_multi_gpu_section_as_defined():
    steps, _ = decide_all("4xH100", MULTI)
    assert all(step.runs and step.expected_status == "ok" for step in steps.values()), steps
    assert "checkpoint_dir" not in steps["deepspeed-offload"].overrides  # 1007 GiB of host RAM: the 13B


def test_h100_oom_demos_run_as_defined_and_expect_an_oom():
    steps, _ = decide_all("H100-80GB", ["baseline", "full-13b", "full-7b"])
    for exp_id in ("baseline", "full-13b"):
        assert steps[exp_id].runs and steps[exp_id].expected_status == "oom" and steps[exp_id].overrides == {}
        assert "fits as defined" not in steps[exp_id].sentence
    assert steps["full-7b"].expected_status == "ok" and "fits this NVIDIA H100" in steps["full-7b"].sentence


def test_h200_runs_full_13b_in_a_precision_whose_states_do_not_fit_and_expects_the_oom():
    """Where the oom decision swaps the precision (the states lesson on an H200), the step runs that precision,
    checks it against this GPU, and expects the OOM; the decision itself is tested with the real planner below."""
    substitute = {"full-13b": ({"precision": "bf16-mixed"}, "runs in bf16-mixed instead: no batch size helps")}
    steps, planner = decide_all("H200-141GB", ["full-13b"], oom=lambda e: substitute[e])
    step = steps["full-13b"]
    assert step.overrides == {"precision": "bf16-mixed"} and step.expected_status == "oom"
    assert "no batch size helps" in step.sentence
    assert ("full-13b", step.overrides) in planner.calls  # what runs was checked against this GPU


@pytest.mark.slow
@pytest.mark.parametrize("name", ["H100-80GB", "A100-40GB", "A10G-24GB", "H200-141GB"])
def test_oom_demonstrations_keep_the_course_lesson(name):
    """The real planner, asked about each node's GPU (device cuda, sizes from the NVML fixtures): the course's
    batch runs wherever it is predicted not to fit (on an 80 GB GPU: baseline at 32, full-13b at 1); on an H200,
    which holds both as defined, baseline's batch is raised at least 20 % over the GPU, and full-13b keeps its
    lesson (the model states alone exceed the GPU) in bf16-mixed instead of an activations OOM."""
    from lab_helpers.planning import predict

    memory = gpu_memory_gib(node(name))
    baseline, baseline_why = predict.oom_demo_overrides("baseline", profile="gpu", gpu_memory_gib=memory, device="cuda")
    full_13b, full_13b_why = predict.oom_demo_overrides("full-13b", profile="gpu", gpu_memory_gib=memory, device="cuda")
    if name != "H200-141GB":
        assert (baseline, full_13b) == ({}, {}), (baseline_why, full_13b_why)
        assert "runs as the course defines it" in baseline_why and "will OOM" in full_13b_why
        return
    assert baseline["train.micro_batch_size"] > 32 and "at least 20% over" in baseline_why
    raised = predict.predict_experiment(
        "baseline", profile="gpu", overrides=baseline, gpu_memory_gib=memory, device="cuda"
    )
    assert raised.gpu_used_gib >= memory * (1 + predict.OOM_DEMO_MARGIN)
    assert full_13b == {"precision": "bf16-mixed"}, full_13b_why
    assert "model states alone" in full_13b_why and "no batch size helps" in full_13b_why
    assert model_states("full-13b", overrides=full_13b).gib > memory > model_states("full-13b").gib


def test_only_full_13b_teaches_that_model_states_alone_exceed_the_course_gpu():
    from lab_helpers.planning import predict

    assert predict.teaches_model_states("full-13b") and not predict.teaches_model_states("baseline")


@pytest.mark.slow
def test_a10g_keeps_every_lesson_as_defined_smaller_substituted_or_skipped_naming_the_substitute():
    """LAB.md's "done when" for a 24 GB node: every experiment runs as defined, runs smaller, runs as a named
    substitute that keeps its lesson, or is skipped with a sentence naming the experiment that ran instead."""
    steps, planner = decide_all("A10G-24GB", SINGLE)
    for exp_id in ("full-3b", "full-7b"):
        assert not steps[exp_id].runs and "model states alone" in steps[exp_id].sentence, steps[exp_id]
        assert not planner.asked(exp_id)  # decided by arithmetic, without a slow planner call
    assert "trained here by lora-7b and qlora-7b" in steps["full-7b"].sentence
    assert "trained here by lora-3b" in steps["full-3b"].sentence
    # QLoRA-13B where LoRA-13B does not fit
    lora_13b = steps["lora-13b"]
    assert lora_13b.runs and lora_13b.overrides["quantize"] == "bnb.nf4" and "runs instead QLoRA-13B" in lora_13b.sentence
    # a technique's lesson on the largest model that fits
    for exp_id in ("act-ckpt", "adamw-8bit", "full-13b-sgd"):
        step = steps[exp_id]
        assert step.runs and "checkpoint_dir" in step.overrides and f"runs instead {exp_id} on the" in step.sentence
        assert step.sentence.count("the largest that fits") == 1
    assert "open_llama_3b" in steps["full-13b-sgd"].overrides["checkpoint_dir"]  # 3B at 4 B/param fits 24 GB
    # small-batch stays a small batch without accumulation; grad-accum keeps its global batch
    small = steps["small-batch"]
    assert small.runs and small.overrides == {"train.micro_batch_size": 2, "train.global_batch_size": 2}
    assert "without accumulation" in small.sentence
    assert steps["grad-accum"].overrides == {"train.micro_batch_size": 2} and "global batch stays 32" in steps[
        "grad-accum"
    ].sentence
    assert steps["lora-7b"].runs and steps["lora-1b"].overrides == {}
    for exp_id, step in steps.items():
        assert step.runs or "trained here by" in step.sentence, (exp_id, step)


def test_l40s_runs_full_3b_smaller_and_skips_full_7b():
    steps, _ = decide_all("L40S-48GB", ["full-3b", "full-7b"])
    assert steps["full-3b"].runs and steps["full-3b"].overrides == {"train.micro_batch_size": 4}
    assert not steps["full-7b"].runs and steps["full-7b"].expected_status == "skipped"


def test_v100_takes_the_fp16_route_with_loss_scaling():
    steps, planner = decide_all("V100-32GB", ["baseline", "bf16-true", "bf16-mixed", "qlora-7b"])
    assert not steps["bf16-true"].runs and "loss scaling" in steps["bf16-true"].sentence
    mixed = steps["bf16-mixed"]
    assert mixed.runs and mixed.overrides["precision"] == "16-mixed" and "loss scaling" in mixed.sentence
    assert ("bf16-mixed", {"precision": "16-mixed"}) in planner.calls  # the fits question asked in fp16
    assert resolve("bf16-mixed", "gpu", mixed.overrides, check_files=False).recipe["precision"] == "16-mixed"
    assert steps["qlora-7b"].overrides["precision"] == "16-true"  # litgpt refuses quantization + mixed
    assert "precision" not in steps["baseline"].overrides  # fp32 runs as defined
    note = node_plan.section_note(node("V100-32GB"), section="single", profile="gpu")
    assert "16-mixed" in note and "GradScaler" in note


def test_missing_bitsandbytes_skips_qlora_with_the_fix():
    the_node = node("H100-80GB")
    the_node["packages"]["bitsandbytes"] = None
    step = node_plan.decide("qlora-7b", the_node, profile="gpu", predict=FixturePlanner(the_node))
    assert not step.runs and "pip install" in step.sentence


def test_a_skipped_step_is_recorded_with_its_reason(results):
    from lab_helpers.record.records import load_results

    steps, _ = decide_all("A10G-24GB", ["full-7b"])
    records = steps["full-7b"].run()
    assert records[0]["status"] == "skipped" and "model states alone" in records[0]["reason"]
    stored = load_results(results / "runs.jsonl")
    assert list(stored["status"]) == ["skipped"] and list(stored["experiment"]) == ["full-7b"]


@pytest.mark.slow
def test_the_real_planner_answers_the_fits_question_on_an_a10g():
    """The default predictor is the lab's planner (about 10 s for TinyLlama with LoRA on a CPU)."""
    step = node_plan.decide("lora-1b", node("A10G-24GB"), profile="gpu")
    assert step.runs and step.expected_status == "ok" and "fits this NVIDIA A10G" in step.sentence


def test_check_node_overview_answers_with_model_states_only():
    a10g = node_plan.overview(node("A10G-24GB")).set_index("experiment")
    column = a10g.columns[-1]
    assert "A10G" in column
    assert a10g.loc["full-7b", column].startswith("no") and not a10g.loc["lora-7b", column].startswith("no")
    none = node_plan.overview(node("none")).set_index("experiment")
    assert "80 GiB GPU (none here)" in none.columns[-1]
    assert none.loc["full-13b", none.columns[-1]].startswith("no")  # LAB.md: 13B states exceed 80 GB


def test_a_planner_failure_never_stops_a_run():
    """A prediction is advice: when the planner cannot answer, the experiment runs as defined and says why."""

    def broken(exp_id, overrides):
        raise RuntimeError("tracing failed")

    step = node_plan.decide("lora-7b", node("A10G-24GB"), profile="gpu", predict=broken)
    assert step.runs and step.overrides == {} and "no prediction (RuntimeError: tracing failed)" in step.sentence


AGREEMENT_NODES = ("none", "H100-80GB", "H200-141GB", "A10G-24GB", "V100-32GB", "4xA100-80GB")


@pytest.mark.parametrize("name", AGREEMENT_NODES)
def test_run_all_and_the_notebooks_make_the_same_decision_for_every_experiment(name, monkeypatch):
    """``run-all`` (scripts/run-lab.sh) and the notebooks' cells used to decide apart (a V100 skipped
    bf16 in run-all and ran it in 16-mixed in 01; a 24 GB GPU shrank micro batches only in 01). The real
    ``lab.run_all`` runs here on a recorded node (node fixtures: this CPU cannot be an H100 or a V100), with the
    planner's "does it fit" answered by the fixture planner above and the training itself stood in for: what it
    would run or skip, with which overrides, is compared with ``node_plan.decide`` for each experiment, and each
    run it chooses passes run_experiment's own gate (``decision.blocked``) on that node."""
    from lab_helpers import lab
    from lab_helpers.hardware import node as node_module
    from lab_helpers.planning import decision
    from lab_helpers.planning import predict as plans

    the_node = node(name)
    profile = "ci" if name == "none" else "gpu"
    planner = FixturePlanner(the_node)
    oom = oom_fixture({})
    monkeypatch.setattr(node_module, "describe_node", lambda: node(name))
    monkeypatch.setattr(plans, "predict_experiment", lambda e, *, overrides=None, **kw: planner(e, overrides or {}))
    monkeypatch.setattr(plans, "oom_demo_overrides", lambda e, **kw: oom(e))
    ran: dict[str, tuple] = {}
    simulated = {}
    monkeypatch.setattr(lab, "run_experiment", lambda e, **kw: simulated.update({e: kw.get("simulate_world")})
                        or ran.update({e: (True, kw["overrides"], None)}) or [])  # fmt: skip
    monkeypatch.setattr(lab, "record_skipped", lambda e, **kw: ran.update({e: (False, kw["overrides"], kw["reason"])}) or [])

    for section in ("single", "multi"):
        lab.run_all(section=section, profile=profile, echo=False)
    notebook = {e: node_plan.decide(e, the_node, profile=profile) for e in SINGLE + MULTI}

    assert set(ran) == set(notebook)
    for exp_id, step in notebook.items():
        runs, overrides, reason = ran[exp_id]
        assert (runs, overrides) == (step.runs, step.overrides), f"{name} {exp_id}: {ran[exp_id]} vs {step}"
        assert simulated.get(exp_id) == (step.simulate_world if runs else None), (name, exp_id)
        if not runs:
            assert reason == step.sentence, (name, exp_id)
            continue
        run = resolve(exp_id, profile, step.overrides, check_files=False, simulate_world=step.simulate_world)
        gate = decision.blocked(run, the_node)
        assert gate is None, (name, exp_id, step.overrides, gate)
    if name == "V100-32GB":  # the disagreement a review found, now one answer
        assert ran["bf16-mixed"][0] and ran["bf16-mixed"][1]["precision"] == "16-mixed" and not ran["bf16-true"][0]
    if name == "A10G-24GB":
        assert ran["grad-accum"][:2] == (True, {"train.micro_batch_size": 2})


def test_lab_models_skips_every_other_size_and_the_final_check_expects_it(monkeypatch):
    """A GPU slice prepares one size (LAB_MODELS=1b): 01's other sizes are decided skipped, named so, on both
    profiles; an unknown size is one line."""
    from lab_helpers.config.config_error import LabConfigError

    monkeypatch.setenv("LAB_MODELS", "1b")
    for name, profile in (("none", "ci"), ("H200-141GB", "gpu")):
        steps, _ = decide_all(name, SINGLE, profile=profile)
        skipped = {e for e, s in steps.items() if "LAB_MODELS=1b" in s.sentence}
        assert skipped == {e for e in SINGLE if resolve(e, profile, check_files=False).experiment.model != "1b"}, (name, skipped)
        assert all(steps[e].expected_status == "skipped" and not steps[e].runs for e in skipped)
        assert steps["small-batch"].runs
    monkeypatch.setenv("LAB_MODELS", "1b,70b")
    with pytest.raises(LabConfigError, match="LAB_MODELS=1b,70b: unknown model size 70b; choose from 1b, 3b, 7b, 13b"):
        node_plan.decide("small-batch", node("none"), profile="ci")


# ----------------------------------------------------------------------------------------------- pairs

PAIRED = {e: x.pair for e, x in load_experiments().items() if x.pair}
PAIR_NODES = ("A10G-24GB", "L40S-48GB", "A100-40GB", "H100-80GB", "H200-141GB", "V100-32GB", "4xA100-80GB", "none")


def _runs_at(step) -> tuple[str, int, int]:
    """(checkpoint, micro batch, global batch) a running step trains with."""
    train = resolve(step.exp_id, step.profile, step.overrides, check_files=False).recipe
    return str(train["checkpoint_dir"]), train["train"]["micro_batch_size"], train["train"]["global_batch_size"]


@pytest.mark.parametrize("name", PAIR_NODES)
def test_every_pair_runs_at_the_same_settings_or_the_step_says_why(name):
    """Compared experiments run at the same settings on a node (the same model and micro batch), or the
    sentence of the one that names its pair says why not, and what to compare instead."""
    paired = sorted({*PAIRED, *PAIRED.values()})
    steps, _ = decide_all(name, paired, profile="ci" if name == "none" else "gpu")
    for exp_id, pair in PAIRED.items():
        mine, theirs = steps[exp_id], steps[pair]
        fills = resolve(exp_id, mine.profile, check_files=False).options.get("fill_gpu")
        both = mine.runs and theirs.runs and mine.expected_status == theirs.expected_status == "ok"
        if both and not fills and _runs_at(mine)[0] == _runs_at(theirs)[0]:  # one model: one micro batch, always
            assert _runs_at(mine)[1] == _runs_at(theirs)[1], (name, exp_id, mine.overrides, theirs.overrides)
        if mine.runs and theirs.runs and not fills and _runs_at(mine)[:2] == _runs_at(theirs)[:2]:
            assert f"its pair {pair}" not in mine.sentence, (name, exp_id, mine.sentence)
            continue
        clause = mine.sentence.partition(f"its pair {pair} ")[2]  # the clause after the pair's name
        assert clause, (name, exp_id, pair, mine, theirs)
        if fills:  # the micro batch differs on purpose: fill-gpu takes the largest that fits when it starts
            assert "largest that fits" in clause and "train.micro_batch_size" not in mine.overrides
        elif not mine.runs:
            assert "reference results" in clause, clause
        else:
            assert "does not run here" in clause or "model here" in clause or "runs at micro batch" in clause
            asked = ast.literal_eval(re.search(r"overrides=(\{.*?\})\)", clause).group(1)) if "overrides=" in clause else {}
            assert f"lab.predict_experiment({pair!r}, profile={mine.profile!r}" in clause
            # what it names is the pair at this run's model and micro batch
            prediction = resolve(pair, mine.profile, asked, check_files=False).recipe
            assert (str(prediction["checkpoint_dir"]), prediction["train"]["micro_batch_size"]) == _runs_at(mine)[:2]


def test_a10g_runs_bf16_true_at_bf16_mixeds_micro_batch_keeping_its_global_batch():
    """The one that fits a larger micro batch moves down to its pair's (the other cannot move up), keeping its global
    batch; decided alone, bf16-true would run at 4 against bf16-mixed's 2 (the fixture planner's A10G)."""
    from lab_helpers.planning import decision

    steps, _ = decide_all("A10G-24GB", ["bf16-true", "bf16-mixed"])
    alone = decision._decide_alone("bf16-true", node("A10G-24GB"), profile="gpu", predict=FixturePlanner(node("A10G-24GB")))
    assert alone.overrides == {"train.micro_batch_size": 4}
    assert steps["bf16-true"].overrides == steps["bf16-mixed"].overrides == {"train.micro_batch_size": 2}
    assert _runs_at(steps["bf16-true"])[2] == 32 and steps["bf16-true"].expected_status == "ok"
    assert "micro batch 4 -> 2 so that it compares with bf16-mixed" in steps["bf16-true"].sentence
    assert "bf16-true" not in steps["bf16-mixed"].sentence  # it did not move, and the two compare


def test_small_batch_its_pairs_and_theirs_run_at_one_micro_batch(monkeypatch):
    """A group (small-batch with grad-accum and length-grouped) runs at the smallest micro batch any of them fits:
    here grad-accum's activations are made to cost more, so it fits only 1; small-batch (no accumulation) shrinks
    micro and global batch with it, and length-grouped follows small-batch, its pair."""

    class Heavier(FixturePlanner):
        def __call__(self, exp_id, overrides):
            plan = super().__call__(exp_id, overrides)
            if exp_id == "grad-accum":
                plan.gpu_used_gib += 1.5
            return plan

    the_node = node("A10G-24GB")
    planner = Heavier(the_node)
    group = pair_group("small-batch")
    steps = {e: node_plan.decide(e, the_node, profile="gpu", predict=planner) for e in group}
    assert steps["grad-accum"].overrides == {"train.micro_batch_size": 1}
    for exp_id in set(group) - {"grad-accum"}:  # both defined without accumulation
        assert steps[exp_id].overrides == {"train.micro_batch_size": 1, "train.global_batch_size": 1}, steps[exp_id]
        assert "micro and global batch 2 -> 1" in steps[exp_id].sentence
        assert "1 is the largest grad-accum fits here" in steps[exp_id].sentence


def test_a_pair_is_decided_the_same_whichever_the_notebook_asks_first_and_asks_no_new_prediction():
    """Each experiment of a group is decided from the same alone-decisions: the order does not matter, and moving
    one to its pair's micro batch asks the planner nothing the alone-decisions did not (the real planner memoizes
    its predictions, so a group costs what its experiments cost alone)."""
    from lab_helpers.planning import decision

    group = [*pair_group("act-ckpt"), *pair_group("bf16-true"), *pair_group("grad-accum")]
    forward, planner = decide_all("A10G-24GB", group)
    backward, _ = decide_all("A10G-24GB", list(reversed(group)))
    assert forward == backward
    alone = FixturePlanner(node("A10G-24GB"))
    for exp_id in group:
        decision._decide_alone(exp_id, node("A10G-24GB"), profile="gpu", predict=alone, oom_overrides=oom_fixture({}))
    key = lambda calls: {(e, tuple(sorted(o.items()))) for e, o in calls}  # noqa: E731
    assert key(planner.calls) == key(alone.calls)


def test_a10g_techniques_on_the_1b_name_their_pair_full_7b_and_its_prediction_there():
    steps, _ = decide_all("A10G-24GB", ["full-7b", "act-ckpt", "adamw-8bit"])
    assert not steps["full-7b"].runs
    for exp_id in ("act-ckpt", "adamw-8bit"):
        sentence = steps[exp_id].sentence
        assert "its pair full-7b does not run here, so compare with the planner's prediction for full-7b on the 1B " \
               "model at micro batch 4: lab.predict_experiment('full-7b', profile='gpu', overrides={'checkpoint_dir': " \
               f"{steps[exp_id].overrides['checkpoint_dir']!r}}})" in sentence, sentence  # fmt: skip
        assert sentence.count("its pair") == 1


def test_v100_bf16_mixed_names_its_skipped_pair_and_ci_names_adamw_8bits():
    steps, _ = decide_all("V100-32GB", ["bf16-true", "bf16-mixed"])
    assert "its pair bf16-true does not run here" in steps["bf16-mixed"].sentence
    assert "lab.predict_experiment('bf16-true', profile='gpu', overrides={'train.micro_batch_size': 4})" in steps[
        "bf16-mixed"
    ].sentence
    steps, _ = decide_all("none", ["full-7b", "adamw-8bit"], profile="ci")
    assert not steps["adamw-8bit"].runs and steps["adamw-8bit"].expected_status == "skipped"
    assert "compare it with its pair full-7b in the reference results" in steps["adamw-8bit"].sentence


def test_run_all_only_names_this_sections_experiments_or_says_which_is_wrong(tmp_path, monkeypatch):
    """``lab.run_all(only=...)`` with a typo (or a multi experiment in the single section) ran nothing and said
    nothing: returned []; a single name given as a string was read as its letters, the same. Now a name the section
    lacks is one line before anything runs, and one string is one experiment."""
    from lab_helpers import lab
    from lab_helpers.config.config_error import LabConfigError
    from lab_helpers.planning.decision import section_decisions

    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    with pytest.raises(LabConfigError, match=r"'basline' is not an experiment of section 'single' \(did you mean 'baseline'"):
        lab.run_all(section="single", profile="ci", only=["basline"], echo=False)
    with pytest.raises(LabConfigError, match=r"'fsdp' is not an experiment of section 'single': it is in section 'multi'"):
        lab.run_all(section="single", profile="ci", only=["baseline", "fsdp"], echo=False)
    assert not any(tmp_path.iterdir())  # nothing ran, nothing was recorded
    planner = FixturePlanner(node("none"))
    chosen = section_decisions("single", node("none"), profile="ci", only="grad-accum", predict=planner)
    assert [exp_id for exp_id, _ in chosen] == ["grad-accum"]
