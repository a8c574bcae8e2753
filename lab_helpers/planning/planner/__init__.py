"""Predict a fine-tuning run's GPU memory before it runs, on a CPU, with no weights downloaded.

The planner traces litgpt's real model, loss and optimizer on fake CPU tensors (``tracer``), accounts every
storage the step allocates (``accounting``), and adds what one traced device cannot show: sharding, buckets,
offload, paged state and the CUDA context (``analytic``). ``spec`` reads litgpt recipes. ``python -m lab_helpers plan``
is ``lab_helpers.present.plan_command``, a layer above: it gathers what the planner takes as arguments (this node's GPU,
records, CPU rates, link bandwidth) and prints.

The names below are imported on first use (PEP 562): tracing needs torch (seconds to import), and
``python -m lab_helpers`` builds the ``plan`` subcommand's arguments for every command, ``results`` included.
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
