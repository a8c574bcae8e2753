"""Predict a fine-tuning run's GPU memory before it runs, on a CPU, with no weights downloaded: litgpt's real step
traced on fake tensors (``tracer``), every storage accounted (``accounting``), plus what one traced device cannot
show (``analytic``). ``python -m lab_helpers plan`` (``present.plan_command``) gathers the node's facts and prints.

Names are imported on first use (PEP 562): tracing needs torch (seconds to import), and ``python -m lab_helpers``
builds the ``plan`` subcommand's arguments for every command.
"""

from __future__ import annotations

from lab_helpers.config.lazy_exports import attach

# public name -> the submodule that defines it
_EXPORTS = {
    "PlanError": "errors",
    "PlannerUnavailable": "errors",
    "FitResult": "fit",
    "fit": "fit",
    "MemoryPlan": "plan",
    "plan_recipe": "plan",
    "predict": "plan",
    "TrainingSpec": "spec",
    "spec_from_recipe": "spec",
    "TimePlan": "timing",
    "predict_time": "timing",
}

__all__ = sorted(_EXPORTS, key=str.casefold)


__getattr__, __dir__ = attach(__name__, {name: f".{module}" for name, module in _EXPORTS.items()})
