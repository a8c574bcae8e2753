"""lab_helpers: run, measure, record, predict and plot fine-tuning experiments for the lab.

The notebooks import this one package; every experiment runs in its own process so a crash, an OOM or an
interrupt never takes the notebook kernel (or the run log) with it.
"""

__version__ = "0.1.0"
