"""Predict a fine-tuning run's GPU memory before it runs, on a CPU, with no weights downloaded.

The planner traces litgpt's real model, loss and optimizer on fake CPU tensors (``tracer``), accounts every
storage the step allocates (``accounting``), and adds what one traced device cannot show: sharding, buckets,
offload, paged state and the CUDA context (``analytic``). ``spec`` reads litgpt recipes; ``cli`` is
``python -m lab_helpers plan``.
"""

from .errors import PlanError, PlannerUnavailable
from .fit import FitResult, fit
from .plan import MemoryPlan, plan_recipe, predict
from .spec import TrainingSpec, spec_from_recipe
from .timing import TimePlan, predict_time

__all__ = [
    "FitResult",
    "MemoryPlan",
    "PlanError",
    "PlannerUnavailable",
    "TimePlan",
    "TrainingSpec",
    "fit",
    "plan_recipe",
    "predict",
    "predict_time",
    "spec_from_recipe",
]
