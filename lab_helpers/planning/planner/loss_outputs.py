"""The cross-entropy ops' outputs made directly instead of by their fake kernels: the same trace, faster.

litgpt's chunked cross-entropy calls ``log_softmax`` and ``nll_loss`` per 128 rows of logits; their meta kernels
take milliseconds each and FakeTensor's cache misses every chunk (a view at another offset): over half of a full
fine-tune's trace at micro batch 32. Only the plain case is shortcut; tests/test_planner.py checks that a trace's
timeline is the same record for record with and without.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _empty(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=like.device)


def _log_softmax(args: tuple):
    """``_log_softmax(self, dim, half_to_float)``: the input's shape, fp32 when ``half_to_float``."""
    if len(args) != 3:
        return None
    x, _dim, half_to_float = args
    if not x.is_contiguous():
        return None
    return _empty(x.shape, torch.float32 if half_to_float else x.dtype, x)


def _nll_loss_forward(args: tuple):
    """On (N, C) log-probabilities: the loss ((N,), or a scalar with a reduction) and the total weight, both in the
    input's dtype."""
    if len(args) != 5:
        return None
    x, _target, weight, reduction, _ignore = args
    if weight is not None or x.dim() != 2 or not x.is_contiguous():
        return None
    loss_shape = (x.shape[0],) if reduction == 0 else ()
    return _empty(loss_shape, x.dtype, x), _empty((), x.dtype, x)


def _nll_loss_backward(args: tuple):
    if len(args) != 7:
        return None
    _grad, x, _target, weight, _reduction, _ignore, _total = args
    if weight is not None or x.dim() != 2 or not x.is_contiguous():
        return None
    return _empty(x.shape, x.dtype, x)


SHORTCUTS: dict = {
    aten._log_softmax.default: _log_softmax,
    aten.nll_loss_forward.default: _nll_loss_forward,
    aten.nll_loss_backward.default: _nll_loss_backward,
}
"""op -> a function of its positional arguments that returns its outputs, or None to run the op itself."""
