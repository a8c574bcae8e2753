"""The planner's one error type, so callers (CLI, notebooks, runner) can show a single clear line."""

from __future__ import annotations


class PlanError(ValueError):
    """Bad input for a prediction: unknown model, a recipe litgpt would reject, an impossible layout.

    The message is one line that names the problem, fit to print as-is.
    """


class UnknownModel(PlanError):
    """A ``checkpoint_dir`` that names no litgpt config and holds no ``model_config.yaml``: a model not built or
    downloaded yet (the ci stand-ins), which the caller may know how to fetch."""


class PlannerUnavailable(RuntimeError):
    """The tracing machinery (private torch APIs) does not behave as this planner was built for.

    Raised instead of returning numbers that could be nonsense after a torch upgrade.
    """
