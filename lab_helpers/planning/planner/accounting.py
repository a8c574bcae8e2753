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

from ._compat import dispatch_mode_base, metadata_queries, pytree

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporaries")
_CUDA_ROUND_BYTES = 512  # CUDA caching allocator rounds every block up to a multiple of 512 bytes


def cuda_rounded_bytes(nbytes: int) -> int:
    if nbytes <= 0:
        return 0
    return -(-nbytes // _CUDA_ROUND_BYTES) * _CUDA_ROUND_BYTES


@dataclass
class AllocRecord:
    nbytes: int  # rounded like the CUDA allocator
    t_alloc: int
    phase: int
    t_free: float = float("inf")
    category: str | None = None  # set for parameters, gradients, optimizer_states
    raw_nbytes: int = 0  # the storage's own size, before rounding (what scales with the micro-batch)


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
        raw = storage.nbytes()
        nbytes = cuda_rounded_bytes(raw)
        self.clock += 1
        record = AllocRecord(nbytes, self.clock, len(self.phases) - 1, category=category, raw_nbytes=raw)
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
        self.phases = replay(self.records, self.phases, [r.nbytes for r in self.records])


def resolved_categories(records: list[AllocRecord], phases: list[Phase]) -> list[tuple[str, bool]]:
    """Roles not marked go by lifetime: what a forward allocates and keeps past its end is an activation, anything else
    a temporary. Depends on the timeline's structure only, never on sizes."""
    out = []
    for rec in records:
        cat, step = rec.category, False
        if cat is None:
            alloc_phase = phases[rec.phase] if rec.phase >= 0 else None
            if alloc_phase is not None and alloc_phase.kind == "fwd" and rec.t_free > alloc_phase.t_end:
                cat = "activations"
            else:
                cat = "temporaries"
                step = alloc_phase is not None and alloc_phase.kind == "step"
        out.append((cat, step))
    return out


def replay(records: list[AllocRecord], phases: list[Phase], sizes: list[int]) -> list[Phase]:
    """Each phase's peak (the most bytes live from its start to the next phase's, first reached) and the breakdown then.
    The tracer replays sizes computed for another micro batch on the same timeline: one trace, several batch sizes."""
    events: list[tuple[int, int, int]] = []  # (clock, kind, index): kind 0 begin, 1 alloc, 2 free
    for k, ph in enumerate(phases):
        events.append((ph.t_start, 0, k))
    for i, rec in enumerate(records):
        events.append((rec.t_alloc, 1, i))
        if rec.t_free != float("inf"):
            events.append((int(rec.t_free), 2, i))
    events.sort()
    out = [Phase(p.name, p.kind, p.t_start, p.t_end) for p in phases]
    current, phase = 0, -1
    for clock, kind, index in events:
        if kind == 0:
            phase = index
            out[index].peak_bytes, out[index].t_peak = current, clock
        elif kind == 1:
            current += sizes[index]
            if phase >= 0 and current > out[phase].peak_bytes:
                out[phase].peak_bytes, out[phase].t_peak = current, clock
        else:
            current -= sizes[index]
    # a second sweep: live bytes by role at each phase's peak moment
    roles = resolved_categories(records, phases)
    wanted: dict[int, list[int]] = {}
    for k, ph in enumerate(out):
        wanted.setdefault(ph.t_peak, []).append(k)
    sums = dict.fromkeys(CATEGORIES, 0)
    step_temp = 0

    def snapshot(clock: int) -> None:
        for k in wanted.get(clock, ()):
            out[k].by_category = dict(sums)
            out[k].step_temporaries = step_temp

    for clock, kind, index in events:
        if kind:
            cat, step = roles[index]
            sign = 1 if kind == 1 else -1
            sums[cat] += sign * sizes[index]
            if step:
                step_temp += sign * sizes[index]
        snapshot(clock)
    return out


def make_dispatch_tracker(accountant: StorageAccountant, shortcuts: dict | None = None, on_op=None):
    """``shortcuts`` (``loss_outputs.SHORTCUTS``) make an op's outputs directly, or return None to run it; ``on_op`` is
    told of every op that ran (the time model's op costs)."""
    base = dispatch_mode_base()
    tree_leaves, _ = pytree()

    queries, fake_type = metadata_queries()
    shortcuts = shortcuts or {}

    class _Tracker(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            query = queries.get(func)
            if query is not None and len(args) == 1 and type(args[0]) is fake_type:
                return query(args)  # a device or size: no storage to report
            shortcut = None if kwargs else shortcuts.get(func)
            out = shortcut(args) if shortcut is not None else None
            if out is None:
                out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    accountant.track(leaf)
            if on_op is not None:
                on_op(func, args, kwargs, out)
            return out

    return _Tracker()
