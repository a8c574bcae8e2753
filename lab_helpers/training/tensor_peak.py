"""The peak of live tensor bytes in a training process on a CPU: the CPU counterpart of max_memory_allocated.

A CPU's RSS is mostly the runtime, libraries and free lists, so it cannot be compared with the planner's live-tensor
prediction. Each storage is counted from the op that makes it until Python frees it, rounded as CUDA's allocator
rounds. A Python call per op makes the ci profile's tiny models 2-3x slower (``LAB_TENSOR_PEAK=0`` turns it off).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from lab_helpers.config.record_schema import GIB

ROUND_BYTES = 512  # CUDA's caching allocator rounds every allocation up to a multiple of this


def rounded(nbytes: int) -> int:
    return 0 if nbytes <= 0 else -(-nbytes // ROUND_BYTES) * ROUND_BYTES


class LiveTensorPeak(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.whole_run_peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def seed(self, tensors: Iterable[torch.Tensor]) -> None:
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
"""FSDP2 frees and re-gathers weights with ``UntypedStorage.resize_``, which a dispatch mode does not see."""


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
"""The loop is cut at the calls the training process wraps: a stretch that ends at ``backward`` is the forward."""


class PeakPhase:
    """Without a timeline or a sync: a peak that grew since the last boundary is credited to the stretch that ended."""

    def __init__(self, peak: Callable[[], float]) -> None:
        self._peak = peak
        self._last = peak()
        self.phase: str | None = None

    def boundary(self, ended: str) -> None:
        now = self._peak()
        if now > self._last:
            self._last, self.phase = now, ended

    def wrap(self, function: Callable, name: str, *, before: str) -> Callable:

        @functools.wraps(function)  # keeps what others marked on it (an LR scheduler's _wrapped_by_lr_sched)
        def wrapped(*args, **kwargs):
            self.boundary(before)
            try:
                return function(*args, **kwargs)
            finally:
                self.boundary(name)

        return wrapped
