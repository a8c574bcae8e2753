"""Account every storage a traced training step allocates, with its lifetime and its role.

A ``TorchDispatchMode`` sees each op's outputs; their storages are recorded with an allocation time and freed
through a weakref callback when the last tensor using them dies (fake tensors keep Python storage objects alive
exactly as long as real ones). Sizes are rounded like CUDA's caching allocator so totals are comparable with
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ._compat import dispatch_mode_base, pytree

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporaries")
_CUDA_ROUND_BYTES = 512  # CUDA caching allocator rounds every block up to a multiple of 512 bytes


def cuda_rounded_bytes(nbytes: int) -> int:
    if nbytes <= 0:
        return 0
    return -(-nbytes // _CUDA_ROUND_BYTES) * _CUDA_ROUND_BYTES


@dataclass
class AllocRecord:
    nbytes: int
    t_alloc: int
    phase: int
    t_free: float = float("inf")
    category: str | None = None  # set for parameters, gradients, optimizer_states


@dataclass
class Phase:
    name: str
    kind: str  # "fwd", "bwd", "step", "val"
    t_start: int
    t_end: int = -1
    peak_bytes: int = 0
    t_peak: int = -1
    by_category: dict[str, int] = field(default_factory=dict)
    step_temporaries: int = 0  # temporaries allocated inside an optimizer step (these shard with the optimizer)


class StorageAccountant:
    """Records allocations and frees; turns them into per-phase peak breakdowns."""

    def __init__(self) -> None:
        self.records: list[AllocRecord] = []
        self.phases: list[Phase] = []
        self._live: dict[int, int] = {}  # id(storage) -> record index
        self._refs: dict[int, weakref.ref] = {}
        self.clock = 0
        self.current_bytes = 0

    # --- allocation bookkeeping -------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str | None = None) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        index = self._live.get(key)
        if index is not None:
            if category is not None:
                self.records[index].category = category
            return
        nbytes = cuda_rounded_bytes(storage.nbytes())
        self.clock += 1
        record = AllocRecord(nbytes, self.clock, len(self.phases) - 1, category=category)
        self.records.append(record)
        self._live[key] = len(self.records) - 1
        self._refs[key] = weakref.ref(storage, lambda _ref, key=key: self._free(key))
        self.current_bytes += nbytes
        if self.phases and self.current_bytes > self.phases[-1].peak_bytes:
            self.phases[-1].peak_bytes = self.current_bytes
            self.phases[-1].t_peak = self.clock

    def _free(self, key: int) -> None:
        index = self._live.pop(key, None)
        self._refs.pop(key, None)
        if index is None:
            return
        self.clock += 1
        record = self.records[index]
        record.t_free = self.clock
        self.current_bytes -= record.nbytes

    def mark(self, tensor: torch.Tensor, category: str) -> None:
        """Give an already tracked storage its role (a gradient, an optimizer state)."""
        index = self._live.get(id(tensor.untyped_storage()))
        if index is None:
            self.track(tensor, category)
        else:
            self.records[index].category = category

    # --- phases ------------------------------------------------------------------------------------------------
    def begin(self, name: str, kind: str) -> None:
        self.clock += 1
        self.phases.append(Phase(name, kind, self.clock, peak_bytes=self.current_bytes, t_peak=self.clock))

    def end(self) -> None:
        self.clock += 1
        self.phases[-1].t_end = self.clock

    def summarize(self) -> None:
        """Fill each phase's breakdown at its peak. Roles not marked are decided by lifetime:
        what a forward allocates and keeps past its end is an activation, everything else a temporary."""
        kinds = [p.kind for p in self.phases]
        for phase in self.phases:
            sums = dict.fromkeys(CATEGORIES, 0)
            step_temp = 0
            t = phase.t_peak
            for rec in self.records:
                if rec.t_alloc > t or rec.t_free <= t:
                    continue
                cat = rec.category
                if cat is None:
                    alloc_phase = self.phases[rec.phase] if rec.phase >= 0 else None
                    if alloc_phase is not None and kinds[rec.phase] == "fwd" and rec.t_free > alloc_phase.t_end:
                        cat = "activations"
                    else:
                        cat = "temporaries"
                        if alloc_phase is not None and kinds[rec.phase] == "step":
                            step_temp += rec.nbytes
                sums[cat] += rec.nbytes
            phase.by_category = sums
            phase.step_temporaries = step_temp


def make_dispatch_tracker(accountant: StorageAccountant):
    """A dispatch mode that reports every op output's storage to ``accountant``."""
    base = dispatch_mode_base()
    tree_leaves, _ = pytree()

    class _Tracker(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    accountant.track(leaf)
            return out

    return _Tracker()
