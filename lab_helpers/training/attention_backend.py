"""Scaled-dot-product attention restricted to one backend around ``fit``: what the ``attention-flash`` experiment
switches on.

Why: on a GPU, bf16 attention's default backend may build a plan for every new sequence length (cuDNN's), a cost
the record shows as first-seen lengths; the flash backend builds none. ``torch.nn.attention.sdpa_kernel`` restricts
every ``scaled_dot_product_attention`` call inside it to the backends it names; a call no such backend can serve
raises instead of falling back, so a run that records ``ok`` ran the backend asked for. Validation and example
generation run with every backend (:func:`any_backend`): they are outside the timed loop, and generation's explicit
attention mask is one that flash attention on CUDA refuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from lab_helpers.config.recipe_defaults import ATTENTION_BACKENDS

FLAG = "--attention-backend"
"""The ``child_litgpt`` switch (``--attention-backend flash``), removed before litgpt's CLI reads the argv."""


@contextlib.contextmanager
def only_backend(name: str) -> Iterator[None]:
    """Attention restricted to the backend ``name`` (``recipe_defaults.ATTENTION_BACKENDS``) inside the block."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, ATTENTION_BACKENDS[name])):
        yield


def any_backend(function: Callable) -> Callable:
    """``function`` run with every attention backend torch has, whatever restriction is around it."""

    def unrestricted(*args, **kwargs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([backend for name, backend in SDPBackend.__members__.items() if name != "ERROR"]):
            return function(*args, **kwargs)

    return unrestricted
