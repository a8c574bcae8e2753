"""The whole process's peak beside the training loop's, as the training process measures them."""

from __future__ import annotations

import torch

from lab_helpers.training.child_report import reset_cuda_peaks, whole_run_peak_gib
from lab_helpers.training.tensor_peak import LiveTensorPeak


def test_the_whole_run_peak_survives_the_training_loops_reset():
    """One live-tensor count over the process: ``seed`` (at fit's start) restarts the training peak only."""
    with LiveTensorPeak() as peak:
        model = torch.nn.Linear(256, 256)  # 256 KiB of weight
        staging = torch.empty(1024, 1024)  # a 4 MiB load-time buffer (a checkpoint tensor being copied in)
        del staging
        peak.seed(list(model.parameters()))  # training starts: what is live now is the baseline
        out = model(torch.ones(8, 256)).sum()
        out.backward()
    assert peak.whole_run_peak_bytes >= 4 * 2**20  # the load-time buffer counts for the whole run
    assert peak.peak_bytes < 2**20  # ... not for the training loop
    assert peak.whole_run_peak_gib >= peak.peak_gib


def test_whole_run_peak_is_the_larger_known_peak():
    assert whole_run_peak_gib(3.0, 2.0) == 3.0 and whole_run_peak_gib(None, 2.0) == 2.0
    assert whole_run_peak_gib(None, None) is None
    if not torch.cuda.is_available():
        assert reset_cuda_peaks() is None  # no CUDA: nothing measured before the reset
