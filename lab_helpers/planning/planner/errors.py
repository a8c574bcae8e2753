"""The planner's one error type, so callers (CLI, notebooks, runner) can show a single clear line."""

from __future__ import annotations


class PlanError(ValueError):
    """Its message is one line naming the problem, fit to print as is."""


class UnknownModel(PlanError):
    """A model not built or downloaded yet (the ci stand-ins), which the caller may know how to fetch."""


class PlannerUnavailable(RuntimeError):
    """Raised rather than numbers that could be nonsense after a torch upgrade."""
