"""One step's memory over time: the planner's timeline (planner.step_timeline), the same step
measured on this CPU as live tensor bytes per op (step_memory_measure), and the figure (step_memory) -- on the ci
stand-in of full-7b and its act-ckpt pair, with real litgpt code."""

from __future__ import annotations

import pytest

from lab_helpers.config.record_schema import GIB
from lab_helpers.planning.activations_by_hand import experiment_spec
from lab_helpers.planning.planner import predict
from lab_helpers.planning.planner.step_timeline import step_timeline
from lab_helpers.present import step_memory
from lab_helpers.training.step_memory_measure import MeasuredTimeline, main, measure_step, refusal


@pytest.fixture(scope="module")
def specs():
    from lab_helpers.assets import prepare_ci

    prepare_ci(progress=lambda *_: None)
    return {exp: experiment_spec(exp, "ci") for exp in ("full-7b", "act-ckpt")}


@pytest.mark.slow  # two full-depth traces of the ci 7b stand-in: ~20 s on 2 cores
def test_the_planned_timeline_peaks_where_the_planner_does(specs):
    for exp, spec in specs.items():
        timeline = step_timeline(spec)
        peak = timeline.peak_index
        assert timeline.total_bytes[peak] == pytest.approx(predict(spec).peak_alloc_gib * GIB, rel=1e-6), exp
        assert sum(timeline.alive_at(peak).values()) == timeline.total_bytes[peak]
        kinds = [kind for _, kind, _, _ in timeline.phases if kind != "val"]
        assert kinds[:3] == ["fwd", "bwd", "step"] and kinds[-1] == "step"
        # before the first step there are no optimizer states; after it, AdamW's two moments per parameter
        first_step = next(start for _, kind, start, _ in timeline.phases if kind == "step")
        assert timeline.alive_at(first_step - 1)["optimizer_states"] == 0
        assert timeline.alive_at(len(timeline.total_bytes) - 1)["optimizer_states"] > 0
    plain, checkpointed = (step_timeline(specs[e]) for e in ("full-7b", "act-ckpt"))
    assert max(checkpointed.bytes_by_part["activations"]) < max(plain.bytes_by_part["activations"]) / 4


@pytest.mark.slow  # the real step, twice, with every op counted: ~30 s on 2 cores
def test_the_measured_step_on_this_cpu_peaks_where_the_planner_says(specs):
    for exp, spec in specs.items():
        measured = measure_step(spec)
        assert measured.device == "cpu" and "live tensor bytes" in measured.quantity
        assert [kind for _, kind, _, _ in measured.phases] == ["fwd", "bwd", "step", "fwd", "bwd", "fwd", "bwd", "step"]
        assert max(measured.total_bytes) == pytest.approx(predict(spec).peak_alloc_gib * GIB, rel=0.01), exp
        assert MeasuredTimeline.from_json(measured.to_json()) == measured


def test_what_is_not_measured_says_why(specs):
    import dataclasses

    spec = specs["full-7b"]
    assert refusal(spec) is None
    assert "full fine-tuning" in refusal(dataclasses.replace(spec, method="lora"))
    assert "-true precision" in refusal(dataclasses.replace(spec, precision="bf16-mixed"))
    assert "torch optimizer" in refusal(dataclasses.replace(spec, optimizer="AdamW8bit"))
    with pytest.raises(ValueError, match="full fine-tuning"):
        measure_step(dataclasses.replace(spec, method="lora"))


@pytest.mark.slow  # the child process imports torch and litgpt and runs the step: ~30 s
def test_the_measuring_process_prints_the_curve(specs, capsys):
    assert main(["full-7b", "ci"]) == 0
    curve = MeasuredTimeline.from_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert max(curve.total_bytes) == pytest.approx(predict(specs["full-7b"]).peak_alloc_gib * GIB, rel=0.01)


@pytest.mark.slow  # a trace and a measured step of the ci 7b stand-in: ~30 s
def test_the_figure_shows_both_panels_and_says_what_they_are(specs, capsys):
    figure = step_memory.plot_step("act-ckpt", profile="ci")
    left, right = figure.axes[:2]
    assert "planner" in left.get_title() and "measured on this CPU" in right.get_title()
    assert any("peak" in text.get_text() and "activations" in text.get_text() for text in left.texts)
    assert figure._repr_png_().startswith(b"\x89PNG")
    assert "live tensor bytes after each op" in capsys.readouterr().out


def test_a_drawing_cell_of_the_step_must_show_an_image():
    from notebook_images import draws

    assert draws('lab.plot_step("full-7b", profile=PROFILE)')  # as the notebooks call it
