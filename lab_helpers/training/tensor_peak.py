"""The peak of live tensor bytes in a training process on a CPU: the CPU counterpart of max_memory_allocated.

Why: on a GPU the lab reads ``torch.cuda.max_memory_allocated()``. A CPU has no such counter, and the host RSS
it does have is mostly the Python runtime, torch's libraries and the allocator's free lists, so comparing it
with the planner's prediction teaches nothing. What the planner predicts is the bytes of live tensors at the
worst moment of a step. This module measures exactly that on the real training loop: a ``TorchDispatchMode``
sees every op's outputs, and each storage is counted from the op that makes it until Python frees it (a weakref
on the storage, as the planner's accountant does for fake tensors). Sizes are rounded up to 512 bytes like
CUDA's caching allocator rounds every block, so the number is what ``max_memory_allocated`` would report for
the same tensors on a GPU.

Only what exists when the mode starts must be told explicitly (``seed``): the model's parameters and buffers.
``peak_bytes`` is the peak since the last ``seed`` (the training loop: ``child_litgpt`` seeds when ``fit`` starts);
``whole_run_peak_bytes`` the peak since the mode first started (checkpoint load included), as litgpt's
``max_memory_allocated`` would be over the whole process.
It costs a Python call per op, never on a GPU. On the ci profile's tiny models that makes the training loop
about 2-3x slower (their ops are tiny): CPU times are stand-ins anyway, and ``LAB_TENSOR_PEAK=0`` turns the
count off where a CPU timing matters more than the memory figure.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from lab_helpers.config.record_schema import GIB

ROUND_BYTES = 512
"""CUDA's caching allocator rounds every allocation up to a multiple of 512 bytes."""


def rounded(nbytes: int) -> int:
    return 0 if nbytes <= 0 else -(-nbytes // ROUND_BYTES) * ROUND_BYTES


class LiveTensorPeak(TorchDispatchMode):
    """Counts the bytes of live tensor storages while active; ``peak_bytes`` is the most held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.whole_run_peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def seed(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that already exist (parameters, buffers) and reset the peak to what they hold."""
        for tensor in tensors:
            self._track(tensor)
        self.peak_bytes = self.current_bytes

    def __enter__(self):
        _watch_storage_resizes()
        _RESIZE_WATCHERS.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        if self in _RESIZE_WATCHERS:
            _RESIZE_WATCHERS.remove(self)
        return super().__exit__(*exc)

    def _track(self, tensor: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(tensor):
            # a DTensor (FSDP2's shards) reports its global size but holds only its local tensor: count that
            attrs, _ = tensor.__tensor_flatten__()
            for attr in attrs:
                inner = getattr(tensor, attr)
                if isinstance(inner, torch.Tensor):
                    self._track(inner)
            return
        if tensor.device.type != "cpu" or tensor.is_meta:
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._sizes:
            return
        size = rounded(storage.nbytes())
        self._sizes[key] = size
        self._refs[key] = weakref.ref(storage, lambda _ref, key=key: self._free(key))
        self.current_bytes += size
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            if self.current_bytes > self.whole_run_peak_bytes:
                self.whole_run_peak_bytes = self.current_bytes

    def _resized(self, storage: torch.UntypedStorage) -> None:
        """A storage changed size in place (FSDP2 frees and re-allocates gathered weights with ``resize_``)."""
        key = id(storage)
        if key not in self._sizes:
            return
        size = rounded(storage.nbytes())
        self.current_bytes += size - self._sizes[key]
        self._sizes[key] = size
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            if self.current_bytes > self.whole_run_peak_bytes:
                self.whole_run_peak_bytes = self.current_bytes

    def _free(self, key: int) -> None:
        self._refs.pop(key, None)
        self.current_bytes -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def whole_run_peak_gib(self) -> float:
        return self.whole_run_peak_bytes / GIB


_RESIZE_WATCHERS: list[LiveTensorPeak] = []
"""The active counters. ``UntypedStorage.resize_`` is not an operator a dispatch mode sees: FSDP2 frees each
unit's gathered weights by resizing their storage to 0 and gathers into the same storage again, so the counter
hears of a resize through the wrapper below (installed by the first counter, a no-op while none is active)."""


def _watch_storage_resizes() -> None:
    original = torch.UntypedStorage.resize_
    if getattr(original, "_lab_watched", False):
        return

    def resize_(storage, size):
        out = original(storage, size)
        for watcher in _RESIZE_WATCHERS:
            watcher._resized(storage)
        return out

    resize_._lab_watched = True  # type: ignore[attr-defined]
    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]


PEAK_PHASES: tuple[str, ...] = (
    "forward",
    "backward",
    "before the optimizer step",
    "optimizer step",
    "after the optimizer step",
    "validation",
    "example generation",
    "end of training",
)
"""Where in the training loop a measured peak can be (``peak_phase`` in a record). The loop is cut at the calls
the training process wraps -- ``fabric.backward``, ``optimizer.step``, litgpt's ``validate`` and
``generate_example`` -- and at the end of ``fit``: a stretch that ends at a backward call is that micro-batch's
forward (data, model, loss), the call itself its backward, and so on."""


class PeakPhase:
    """The phase of the training loop in which a peak was first reached, without a timeline: ``peak`` reads the
    peak so far (``LiveTensorPeak.peak_bytes`` on a CPU, ``torch.cuda.max_memory_allocated`` on a GPU: both
    host-side counters, no synchronisation), and at every boundary a peak that grew since the last one is
    credited to the stretch that just ended. ``phase`` is None until the peak grows past where it started."""

    def __init__(self, peak: Callable[[], float]) -> None:
        self._peak = peak
        self._last = peak()
        self.phase: str | None = None

    def boundary(self, ended: str) -> None:
        """The stretch ``ended`` (one of ``PEAK_PHASES``) is over."""
        now = self._peak()
        if now > self._last:
            self._last, self.phase = now, ended

    def wrap(self, function: Callable, name: str, *, before: str) -> Callable:
        """``function`` as the phase ``name``, the stretch before each call as ``before``."""

        @functools.wraps(function)  # keeps what others marked on it (an LR scheduler's _wrapped_by_lr_sched)
        def wrapped(*args, **kwargs):
            self.boundary(before)
            try:
                return function(*args, **kwargs)
            finally:
                self.boundary(name)

        return wrapped
