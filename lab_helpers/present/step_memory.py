"""One training step's memory over time, the planner's timeline by part beside the same step measured: the planner's
breakdown is one moment, and this shows the moments around it (activations piling up and draining, AdamW's states
arriving). This module only draws.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from lab_helpers.config.record_schema import GIB

MEASURE_TIMEOUT_S = 900  # a 7B model built and stepped once on a GPU, or a tiny one on a busy CPU
PHASE_SHADES = {"fwd": "#e8f0fe", "bwd": "#fdecea", "step": "#e6f4ea"}
PHASE_WORDS = {"fwd": "forward", "bwd": "backward", "step": "optimizer step"}


def planned(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None):
    """The planner's step timeline for an experiment as it runs on ``profile`` (validation left out)."""
    from lab_helpers.planning.activations_by_hand import experiment_spec
    from lab_helpers.planning.planner.step_timeline import StepTimeline, step_timeline

    timeline = step_timeline(experiment_spec(exp_id, profile, overrides))
    first = min(start for _, kind, start, _ in timeline.phases if kind != "val")
    return StepTimeline(
        model=timeline.model,
        bytes_by_part={part: values[first:] for part, values in timeline.bytes_by_part.items()},
        phases=[(n, k, a - first, b - first) for n, k, a, b in timeline.phases if k != "val"],
    )


def measured(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None):
    """With CUDA in its own process: the kernel must not keep a CUDA context beside the training runs that follow."""
    import torch

    from lab_helpers.training.step_memory_measure import MeasuredTimeline, measure_step, spec_for_experiment

    if not torch.cuda.is_available():
        try:
            return measure_step(spec_for_experiment(exp_id, profile, dict(overrides or {}))), None
        except ValueError as err:
            return None, str(err)
    command = [sys.executable, "-m", "lab_helpers.training.step_memory_measure", exp_id, profile, json.dumps(dict(overrides or {}))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {done.returncode}"
    return MeasuredTimeline.from_json(done.stdout.strip().splitlines()[-1]), None


def _shade(ax: Any, phases: list[tuple[str, str, int, int]]) -> None:
    seen: set[str] = set()
    for _, kind, start, end in phases:
        label = PHASE_WORDS.get(kind) if kind not in seen else None
        seen.add(kind)
        ax.axvspan(start, end + 1, color=PHASE_SHADES.get(kind, "#f4f4f4"), zorder=0, label=label)


def _peak_label(parts: Mapping[str, int]) -> str:
    """What is alive at the peak, in GiB, three parts to a line."""
    alive = [f"{part.replace('_', ' ')} {value / GIB:.3g}" for part, value in parts.items() if value]
    return "alive (GiB): " + "\n".join(", ".join(alive[i : i + 3]) for i in range(0, len(alive), 3))


def plot_step(exp_id: str, *, profile: str, overrides: Mapping[str, Any] | None = None):
    """Returns a LabFigure: a PNG in any notebook."""
    from lab_helpers.present.figure_display import breakdown_colors, new_figure

    plan = planned(exp_id, profile=profile, overrides=overrides)
    real, why_not = measured(exp_id, profile=profile, overrides=overrides)
    figure, (left, right) = new_figure(13.0, 5.0, 1, 2)
    colors = breakdown_colors()
    _shade(left, plan.phases)
    events = range(len(plan.total_bytes))
    parts = [part for part, values in plan.bytes_by_part.items() if any(values)]
    left.stackplot(
        events,
        *[[v / GIB for v in plan.bytes_by_part[part]] for part in parts],
        labels=[part.replace("_", " ") for part in parts],
        colors=[colors[part] for part in parts],
        linewidth=0,
    )
    peak = plan.peak_index
    peak_gib = plan.total_bytes[peak] / GIB
    left.plot([peak], [peak_gib], marker="v", color="black", markersize=9)
    left.annotate(
        f"peak {peak_gib:.3g} GiB in {plan.phase_at(peak)}\n{_peak_label(plan.alive_at(peak))}",
        (peak, peak_gib), xytext=(0.02, 0.97), textcoords="axes fraction", va="top", fontsize=7,
        bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85},
    )
    left.set_title(f"{exp_id}: the planner's traced step ({plan.model})", fontsize=9)
    left.set_xlabel("allocation events of the step, in order")
    left.set_ylabel("GiB live (2^30 bytes)")
    left.set_ylim(0, peak_gib * 1.6)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4)
    if real is None:
        right.text(0.5, 0.5, f"not measured here:\n{why_not}", ha="center", va="center", wrap=True, fontsize=9)
        right.set_axis_off()
    else:
        _shade(right, real.phases)
        right.plot(range(len(real.total_bytes)), [v / GIB for v in real.total_bytes], color="black", linewidth=1)
        top = max(range(len(real.total_bytes)), key=lambda i: (real.total_bytes[i], -i))
        top_gib = real.total_bytes[top] / GIB
        right.plot([top], [top_gib], marker="v", color="#b00020", markersize=9)
        right.annotate(
            f"measured peak {top_gib:.3g} GiB (planner {peak_gib:.3g})",
            (top, top_gib), xytext=(0.02, 0.97), textcoords="axes fraction", va="top", fontsize=7,
        )
        right.set_ylim(0, max(top_gib, peak_gib) * 1.6)
        right.set_title(f"the same step measured on {'this GPU' if real.device == 'cuda' else 'this CPU'}", fontsize=9)
        right.set_xlabel("allocator events" if real.device == "cuda" else "ops, in order")
        right.set_ylabel("GiB live")
    print(
        "Left: the planner's trace of the step (its first optimizer step creates AdamW's states; then "
        "the steady micro-batches), stacked by part; the peak is marked with what is alive."
    )
    if real is not None:
        print(f"Right: {real.quantity}, the same loop with litgpt's model and random weights.")
    else:
        print(f"Right: not measured here ({why_not}).")
    return figure
