"""Types shared by ``decision``, ``micro_batch`` and ``pairs``, in a module below all three so that the helpers name
them without importing ``decision`` (no circle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class PlanLike(Protocol):
    gpu_used_gib: float
    peak_alloc_gib: float


Predict = Callable[[str, Mapping[str, Any]], PlanLike]
OomOverrides = Callable[[str], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class Decision:
    """One experiment on this node: whether it runs, with which overrides, what status to expect, and why."""

    exp_id: str
    profile: str
    runs: bool
    overrides: dict[str, Any] = field(default_factory=dict)
    expected_status: str = "ok"  # ok | oom | skipped
    sentence: str = ""
    # run as rank 0 of this many ranks alone on one device (lab_helpers.training.distributed.simulated), or None
    simulate_world: int | None = None
