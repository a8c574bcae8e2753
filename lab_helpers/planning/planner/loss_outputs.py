"""The cross-entropy ops' outputs, made directly instead of through their fake kernels: a faster trace, the same one.

Why: litgpt's chunked cross-entropy calls ``log_softmax`` and ``nll_loss`` once per 128 rows of logits (for full
fine-tuning, micro batch x sequence / 128 times a step). On fake tensors these ops run their meta kernels, which
are Python decompositions of several milliseconds each, and FakeTensor's cache misses on every chunk, because each
chunk is a view at another storage offset. A full fine-tune at micro batch 32 spent over half its trace there.
Their outputs are new contiguous tensors whose shapes and dtypes follow from the inputs alone, so the tracker makes
them with one ``torch.empty`` each: the same storages, in the same order, with the same sizes.

Only the plain case is shortcut (contiguous input, 2-D for nll_loss, no class weights, the argument count the
schema has); anything else runs the op as usual. ``tests/test_planner.py`` checks that a trace's timeline is the
same record for record with and without the shortcut.
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
    """``nll_loss_forward(self, target, weight, reduction, ignore_index)`` on (N, C) log-probabilities: the loss,
    (N,) without reduction and a scalar with one, and the total weight, a scalar; both in the input's dtype."""
    if len(args) != 5:
        return None
    x, _target, weight, reduction, _ignore = args
    if weight is not None or x.dim() != 2 or not x.is_contiguous():
        return None
    loss_shape = (x.shape[0],) if reduction == 0 else ()
    return _empty(loss_shape, x.dtype, x), _empty((), x.dtype, x)


def _nll_loss_backward(args: tuple):
    """``nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)``: the
    gradient of the (N, C) input, shaped like it."""
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
