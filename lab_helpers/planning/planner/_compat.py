"""Guarded access to the private torch APIs the tracer relies on.

``FakeTensorMode`` (torch._subclasses) and ``TorchDispatchMode`` (torch.utils._python_dispatch) are not public.
They are imported here only, and a behavioural self-check runs once so that a torch upgrade which changes their
semantics produces a clear :class:`PlannerUnavailable`, never silently wrong numbers.
"""

from __future__ import annotations

import functools
import weakref

import torch

from .errors import PlannerUnavailable

TESTED_TORCH = ((2, 4), (2, 13))  # inclusive range of major.minor versions the tracer was verified on


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def _imports():
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves, tree_map
    except ImportError as err:  # pragma: no cover - depends on the torch build
        raise PlannerUnavailable(
            f"torch {torch.__version__} lacks the fake-tensor APIs the planner traces with ({err}); "
            f"the planner was verified on torch {TESTED_TORCH[0]}..{TESTED_TORCH[1]}"
        ) from None
    return FakeTensorMode, TorchDispatchMode, tree_leaves, tree_map


@functools.lru_cache(maxsize=1)
def check_tracing_supported() -> None:
    """Fail loudly unless fake tensors allocate, share and free storages as the tracer assumes."""
    version = _torch_version()
    if not (TESTED_TORCH[0] <= version <= (TESTED_TORCH[1][0], TESTED_TORCH[1][1] + 99)):
        raise PlannerUnavailable(
            f"torch {torch.__version__} is outside the range the planner's tracer was verified on "
            f"({TESTED_TORCH[0]}..{TESTED_TORCH[1]}); re-verify lab_helpers.planning.planner before trusting predictions"
        )
    FakeTensorMode, _, _, _ = _imports()
    freed: list[int] = []
    with FakeTensorMode():
        x = torch.empty(1024, dtype=torch.float32)
        st = x.untyped_storage()
        if st.nbytes() != 4096:
            raise PlannerUnavailable(f"torch {torch.__version__}: fake storages do not report their size")
        view = x[:10]
        if view.untyped_storage() is not st:
            raise PlannerUnavailable(f"torch {torch.__version__}: fake views no longer share one storage object")
        ref = weakref.ref(st, lambda _ref: freed.append(1))
        del x, view, st
    del ref
    if not freed:
        raise PlannerUnavailable(f"torch {torch.__version__}: fake storages are not freed when their tensors die")


def fake_tensor_mode():
    check_tracing_supported()
    FakeTensorMode, _, _, _ = _imports()
    return FakeTensorMode()


def metadata_queries() -> tuple[dict, type | None]:
    """({}, None) where this torch has none. The autograd engine asks a tensor's device thousands of times per backward;
    answering in the tracker, as the fake mode would, skips a round trip through the mode stack: a tenth of a trace."""
    try:
        from torch._subclasses.fake_tensor import _DISPATCH_META_HANDLERS, FakeTensor
    except ImportError:  # pragma: no cover - depends on the torch build
        return {}, None
    return dict(_DISPATCH_META_HANDLERS), FakeTensor


def dispatch_mode_base():
    return _imports()[1]


def pytree():
    _, _, tree_leaves, tree_map = _imports()
    return tree_leaves, tree_map
