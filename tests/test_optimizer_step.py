"""With every block checkpointed the peak moves to the optimizer
step, where AdamW's foreach update (CUDA's default) holds a parameter-sized temporary. The lever --
``optimizer.foreach=false`` or ``optimizer.fused=true`` -- reaches litgpt's optimizer as the run builds it, the
planner is asked with the same setting, and on the ci profile the measured peak and its phase follow the
prediction."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lab_helpers.config.experiments import parse_set_args, resolve
from lab_helpers.config.paths import lab_home
from lab_helpers.config.record_schema import GIB
from lab_helpers.node_plan import Step
from lab_helpers.planning import arithmetic
from lab_helpers.planning.activations_by_hand import experiment_spec
from lab_helpers.planning.planner import PlanError, predict, spec_from_recipe
from lab_helpers.planning.planner.spec import step_implementation
from lab_helpers.planning.predict import planner_inputs, predict_experiment
from lab_helpers.training.tensor_peak import PeakPhase


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _what_torch_ran(**kwargs) -> str:
    params = [torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(5))]
    optimizer = torch.optim.AdamW(params, lr=1e-3, **kwargs)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    with _Ops() as ops:
        optimizer.step()
    if any(name.startswith("_fused_adam") for name in ops.names):
        return "fused"
    if any(name.startswith("_foreach_") and name != "_foreach_add_" for name in ops.names):
        return "foreach"  # (every implementation counts its steps with one _foreach_add_ on a CPU)
    return "for-loop"


@pytest.mark.parametrize(
    ("foreach", "fused"), [(None, None), (True, None), (False, None), (None, True), (None, False), (False, True)]
)
def test_the_step_implementation_is_the_one_torch_runs(foreach, fused):
    """On this CPU, for every way a recipe can set the two arguments (None: left out). CUDA's default (foreach for
    CUDA tensors) cannot be run here; the planner's CUDA prediction is checked against a GPU's records."""
    given = {k: v for k, v in (("foreach", foreach), ("fused", fused)) if v is not None}
    assert step_implementation(foreach, fused, "cpu") == _what_torch_ran(**given)
    assert step_implementation(None, None, "cuda") == "foreach"


def test_the_lever_reaches_litgpts_optimizer_and_the_planner_alike(ci_assets):
    """``--set optimizer.foreach=false`` as the CLI reads it: the run's recipe carries it in optimizer.init_args,
    litgpt's own ``instantiate_torch_optimizer`` builds the optimizer with it, and the planner reads the same."""
    from litgpt.utils import instantiate_torch_optimizer

    overrides = parse_set_args(["optimizer.foreach=false"])
    run = resolve("act-ckpt", "ci", overrides, check_files=False)
    assert run.recipe["optimizer"]["init_args"]["foreach"] is False
    built = instantiate_torch_optimizer(run.recipe["optimizer"], [torch.nn.Parameter(torch.ones(2))])
    assert built.defaults["foreach"] is False and built.defaults["fused"] is None
    inputs = planner_inputs(run, None, device="cuda")
    spec = spec_from_recipe(inputs.pop("recipe"), **inputs)
    assert spec.optimizer_kwargs["foreach"] is False and spec.optimizer_step == "for-loop"
    asked = planner_inputs(resolve("act-ckpt", "ci", {}, check_files=False), None, device="cuda")
    recipe = asked.pop("recipe")  # the planner's own API takes the same spelling
    assert spec_from_recipe(recipe, overrides=overrides, **asked).optimizer_kwargs["foreach"] is False
    default = resolve("act-ckpt", "ci", {}, check_files=False)
    inputs = planner_inputs(default, None, device="cuda")
    assert spec_from_recipe(inputs.pop("recipe"), **inputs).optimizer_step == "foreach"  # CUDA's default


@pytest.fixture(scope="module")
def ci_spec():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)
    return experiment_spec("act-ckpt", "ci", device="cpu")


def _with(spec, **optimizer):
    """``spec`` with ``optimizer.init_args`` set: ``foreach=False``, or an override as ``--set`` spells it."""
    given = {key.removeprefix("optimizer."): value for key, value in optimizer.items()}
    return dataclasses.replace(spec, optimizer_kwargs={**spec.optimizer_kwargs, **given})


def test_the_planner_traces_the_step_the_recipe_asks_for(ci_spec):
    """The ci stand-in of act-ckpt on a CPU: torch's default there is the for-loop; foreach=true adds one
    temporary the size of all parameters at the step's peak; fused makes none, and the peak leaves the step."""
    default, loop, each, fused = (
        predict(s) for s in (ci_spec, _with(ci_spec, foreach=False), _with(ci_spec, foreach=True), _with(ci_spec, fused=True))
    )
    assert (default.optimizer_step, loop.optimizer_step, each.optimizer_step, fused.optimizer_step) == (
        "for-loop", "for-loop", "foreach", "fused",
    )  # fmt: skip
    assert default.peak_alloc_gib == loop.peak_alloc_gib
    assert each.peak_phase.endswith("-step")
    # exp_avg_sq.sqrt() of every parameter at once; the for-loop's are one parameter's (the ci model's embedding)
    assert each.breakdown_gib["temporaries"] == pytest.approx(each.breakdown_gib["parameters"], rel=0.02)
    assert loop.breakdown_gib["temporaries"] < each.breakdown_gib["temporaries"] * 0.6
    assert not fused.peak_phase.endswith("-step") and fused.peak_alloc_gib < loop.peak_alloc_gib < each.peak_alloc_gib
    cuda = predict(dataclasses.replace(ci_spec, device="cuda"))
    assert cuda.optimizer_step == "foreach" and cuda.peak_alloc_gib > each.peak_alloc_gib  # + CUDA context, cuBLAS


def test_a_fused_step_is_one_multi_tensor_kernel_in_the_time_model(ci_spec):
    from lab_helpers.planning.planner.tracer import trace

    cuda = dataclasses.replace(ci_spec, device="cuda")
    each, fused = (trace(s).op_costs for s in (cuda, _with(cuda, fused=True)))
    assert any(op.name == "_fused_adamw_" and op.kernels >= 1 for op, _ in fused.optimizer_step)
    assert fused.kernels_per_optimizer_step() < each.kernels_per_optimizer_step()


def test_settings_torch_refuses_are_refused_before_a_trace(ci_spec):
    with pytest.raises(PlanError, match="fused and foreach cannot both be true"):
        predict(_with(ci_spec, foreach=True, fused=True))
    plan = predict(_with(ci_spec, capturable=True))  # needs CUDA tensors: traced without it, and said so
    assert any("capturable=True traced as False" in note for note in plan.notes)


def test_the_phase_of_a_peak_is_the_stretch_in_which_it_grew():
    peak = [0]
    phases = PeakPhase(lambda: peak[0])

    def backward():
        peak[0] = 5

    def step():
        peak[0] = 9

    backward, step = phases.wrap(backward, "backward", before="forward"), phases.wrap(step, "optimizer step", before="x")
    assert phases.phase is None
    peak[0] = 3
    backward()
    assert phases.phase == "backward"  # the forward's 3 came first, then backward's 5
    step()
    assert phases.phase == "optimizer step"
    peak[0] = 9
    backward()
    assert phases.phase == "optimizer step"  # equal is not higher: the first time counts


def test_the_lever_is_the_other_step_and_a_step_runs_it_where_it_runs(ci_spec):
    on_cpu, on_gpu = predict(ci_spec), predict(dataclasses.replace(ci_spec, device="cuda"))
    assert arithmetic.step_lever(on_gpu) == {"optimizer.foreach": False}  # a GPU's default is foreach
    assert arithmetic.step_lever(on_cpu) == {"optimizer.foreach": True}  # a CPU shows what a GPU's default costs
    step = Step("act-ckpt", "gpu", True, {"train.micro_batch_size": 2}, "ok", "runs smaller")
    lever = step.with_overrides(arithmetic.step_lever(on_gpu))
    assert lever.overrides == {"train.micro_batch_size": 2, "optimizer.foreach": False} and lever.runs


def _record(plan, *, peak: float, phase: str, foreach: bool | None, predicted: float | None = None) -> dict:
    args = {} if foreach is None else {"foreach": foreach}
    return {
        "experiment": "act-ckpt", "status": "ok", "rank": None, "device_name": "cpu (test)",
        "predicted_peak_alloc_gib": plan.peak_alloc_gib if predicted is None else predicted,
        "config": {"optimizer": {"class_path": "torch.optim.AdamW", "init_args": args}},
        "peak_alloc_gib": None, "peak_tensor_gib": peak, "peak_phase": phase,
    }  # fmt: skip


def test_the_sentences_are_computed_from_the_plans_and_the_runs_of_exactly_them(ci_spec):
    plain = predict(experiment_spec("full-7b", "ci", device="cpu"))
    ckpt = predict(ci_spec)
    other = predict(_with(ci_spec, **arithmetic.step_lever(ckpt)))
    lines = arithmetic.checkpointing_words(ckpt, plain).splitlines()
    assert lines[0].startswith("Activations (predicted): full-7b ") and f"{plain.breakdown_gib['activations']:.3g} GiB" in lines[0]
    assert f"act-ckpt {ckpt.peak_alloc_gib:.3g} GiB in the optimizer step" in lines[1]
    assert "The peak moved from backward to the optimizer step." in lines[1]
    assert f"the for-loop step (optimizer.foreach=false) holds {ckpt.breakdown_gib['temporaries']:.3g} GiB" in lines[2]
    lever = arithmetic.step_lever_words(ckpt, other)
    assert lever == (
        "The foreach step (optimizer.foreach=true) updates every parameter in one op, so each intermediate is the size "
        f"of all parameters at once: the planner predicts {other.peak_alloc_gib:.3g} GiB in the optimizer step, "
        f"{other.peak_alloc_gib - ckpt.peak_alloc_gib:+.3g} GiB against the for-loop step's {ckpt.peak_alloc_gib:.3g} "
        "GiB in the optimizer step."
    )  # no runs given: nothing measured
    records = [
        _record(ckpt, peak=0.5, phase="backward", foreach=None, predicted=ckpt.peak_alloc_gib * 1.01),  # another run
        _record(other, peak=other.peak_alloc_gib * 1.001, phase="optimizer step", foreach=True),
        _record(ckpt, peak=ckpt.peak_alloc_gib * 0.999, phase="optimizer step", foreach=False),
    ]
    measured = arithmetic.step_lever_words(ckpt, other, records=records).splitlines()[-1]
    assert measured == (
        f"Measured: for-loop step {ckpt.peak_alloc_gib * 0.999:.3g} GiB in the optimizer step (predicted "
        f"{ckpt.peak_alloc_gib:.3g} GiB, -0.10%); foreach step {other.peak_alloc_gib * 1.001:.3g} GiB in the optimizer "
        f"step (predicted {other.peak_alloc_gib:.3g} GiB, +0.10%)."
    )
    only_one = arithmetic.step_lever_words(ckpt, other, records=records[:2]).splitlines()[-1]
    assert "for-loop step not run yet" in only_one
    assert "no other optimizer step" in arithmetic.step_lever_words(ckpt, ckpt)


@pytest.mark.slow  # three extrapolated 7B traces: ~15 s on 2 cores
def test_on_the_7b_the_foreach_temporary_is_the_parameters_and_the_for_loop_moves_the_peak_back_to_backward():
    ckpt, plain = (predict_experiment(e, profile="gpu", device="cuda") for e in ("act-ckpt", "full-7b"))
    assert ckpt.optimizer_step == "foreach" and ckpt.peak_phase.endswith("-step")
    assert plain.peak_phase.endswith("-backward")
    activations_fell = plain.breakdown_gib["activations"] - ckpt.breakdown_gib["activations"]
    assert plain.peak_alloc_gib - ckpt.peak_alloc_gib < activations_fell / 4  # oversold: most of it is not the peak
    assert ckpt.breakdown_gib["temporaries"] == pytest.approx(ckpt.breakdown_gib["parameters"], rel=0.01)
    loop = predict_experiment("act-ckpt", profile="gpu", device="cuda", overrides=arithmetic.step_lever(ckpt))
    fused = predict_experiment("act-ckpt", profile="gpu", device="cuda", overrides={"optimizer.fused": True})
    assert loop.optimizer_step == "for-loop" and loop.peak_phase.endswith("-backward")
    assert ckpt.peak_alloc_gib - loop.peak_alloc_gib > ckpt.breakdown_gib["temporaries"] * 0.8
    assert fused.peak_alloc_gib == pytest.approx(loop.peak_alloc_gib) and fused.peak_phase == loop.peak_phase
    # the same three runs measured on an H200 (benchmarks/optimizer_step.sh gpu): each is the run of exactly that
    # prediction, its peak in the phase the planner names
    from lab_helpers.record.records import load_results

    measured = load_results(lab_home() / "benchmarks" / "optimizer_step_h200.records.jsonl")
    last = arithmetic.step_lever_words(ckpt, loop, records=measured).splitlines()[-1]
    by_step = {r["predicted"]["optimizer_step"]: r for r in measured.to_dict("records")}
    assert last == (
        f"Measured: foreach step {by_step['foreach']['peak_alloc_gib']:.1f} GiB in the optimizer step (predicted "
        f"{ckpt.peak_alloc_gib:.1f} GiB, within 0.01%); for-loop step {by_step['for-loop']['peak_alloc_gib']:.1f} GiB "
        f"in backward (predicted {loop.peak_alloc_gib:.1f} GiB, within 0.01%)."
    )
    assert by_step["fused"]["peak_alloc_gib"] == pytest.approx(fused.peak_alloc_gib, rel=1e-4)
    assert by_step["fused"]["peak_phase"] == "backward"


@pytest.mark.slow  # two ci training runs in quick mode: ~2.5 min on 2 cores
def test_on_the_ci_profile_the_measured_peak_moves_as_predicted(ci_assets, results):
    """The act-ckpt stand-in with each step: measured live tensors within 1 % of the planner, in the phase it
    names, and the foreach step's extra peak measured as predicted (within 5 % of the difference)."""
    from lab_helpers.lab import run_experiment

    runs = {}
    for foreach in (True, False):
        [record] = run_experiment("act-ckpt", profile="ci", overrides={"optimizer.foreach": foreach}, echo=False, quick=True)
        assert record["status"] == "ok", record.get("error")
        assert record["peak_tensor_gib"] == pytest.approx(record["predicted_peak_alloc_gib"], rel=0.01)
        assert record["peak_phase"] == arithmetic.phase_words(record["predicted"]["peak_phase"]).removeprefix("the ")
        log = (results / record["log_path"]).read_text()
        assert f"foreach={foreach} fused=None on cpu: the {'foreach' if foreach else 'for-loop'} step" in log
        runs[foreach] = record
    measured = runs[True]["peak_tensor_gib"] - runs[False]["peak_tensor_gib"]
    predicted = runs[True]["predicted_peak_alloc_gib"] - runs[False]["predicted_peak_alloc_gib"]
    assert predicted > 0 and measured == pytest.approx(predicted, rel=0.05)
    assert measured * GIB > 0.4 * runs[True]["predicted"]["breakdown_gib"]["parameters"] * GIB
