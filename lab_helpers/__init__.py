"""Run, measure, record, predict and plot the lab's fine-tuning experiments. Each runs in its own process, so a
crash, an OOM or an interrupt never takes the notebook kernel with it.
"""

__version__ = "0.1.0"
