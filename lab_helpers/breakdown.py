"""The parts of a GPU's memory that the planner predicts and the plots stack, in that order.

Its own module so that presenting (compare) can name the parts without importing the planner (torch, litgpt).
"""

BREAKDOWN_PARTS = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "temporaries",
    "communication_buffers",
    "cuda_context",
)
