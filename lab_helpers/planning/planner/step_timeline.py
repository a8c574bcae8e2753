"""One training step's memory over time as the planner traced it: live bytes by part after every allocation and free,
the phases, and what is alive at the peak. The breakdown is one moment; this shows memory moving within a step.
Traced at full depth (the extrapolated trace keeps no timeline) on one device: a strategy's analytic terms and the
CUDA context are not in it. ``step_memory`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .accounting import CATEGORIES, resolved_categories
from .spec import TrainingSpec


@dataclass(frozen=True)
class StepTimeline:
    """``bytes_by_part[part][i]``: live bytes of that part after event ``i`` (an allocation, a free or a phase
    start, in the order the step ran them). ``phases``: (name, kind, first event, last event), kind one of fwd,
    bwd, step, val."""

    model: str
    bytes_by_part: dict[str, list[int]]
    phases: list[tuple[str, str, int, int]]

    @property
    def total_bytes(self) -> list[int]:
        return [sum(values) for values in zip(*self.bytes_by_part.values(), strict=True)]

    @property
    def peak_index(self) -> int:
        total = self.total_bytes
        return max(range(len(total)), key=lambda i: (total[i], -i))

    def alive_at(self, index: int) -> dict[str, int]:
        return {part: values[index] for part, values in self.bytes_by_part.items()}

    def phase_at(self, index: int) -> str:
        names = [name for name, _, first, last in self.phases if first <= index <= last]
        return names[-1] if names else ""


def step_timeline(spec: TrainingSpec) -> StepTimeline:
    from .tracer import trace_training

    result = trace_training(spec)
    records, phases = result.timeline  # type: ignore[misc]
    roles = [role for role, _ in resolved_categories(records, phases)]
    events: list[tuple[int, int, int]] = [(phase.t_start, 0, k) for k, phase in enumerate(phases)]
    for i, record in enumerate(records):
        events.append((record.t_alloc, 1, i))
        if record.t_free != float("inf"):
            events.append((int(record.t_free), 2, i))
    events.sort()
    live = dict.fromkeys(CATEGORIES, 0)
    series: dict[str, list[int]] = {part: [] for part in CATEGORIES}
    starts: list[int] = []
    for position, (_, kind, index) in enumerate(events):
        if kind == 0:
            starts.append(position)
        else:
            sign = 1 if kind == 1 else -1
            live[roles[index]] += sign * records[index].nbytes
        for part in CATEGORIES:
            series[part].append(live[part])
    ends = [*(start - 1 for start in starts[1:]), len(events) - 1]
    spans = [(p.name, p.kind, start, end) for p, start, end in zip(phases, starts, ends, strict=True)]
    return StepTimeline(model=str(spec.model_config.name), bytes_by_part=series, phases=spans)
