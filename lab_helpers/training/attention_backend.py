"""Attention restricted to one backend around ``fit`` (the ``attention-flash`` experiment).

bf16 attention's default backend (cuDNN) may build a plan for every new sequence length; flash builds none. Under
``sdpa_kernel`` a call the backend cannot serve raises instead of falling back, so a run that records ``ok`` ran it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from lab_helpers.config.recipe_defaults import ATTENTION_BACKENDS

FLAG = "--attention-backend"


@contextlib.contextmanager
def only_backend(name: str) -> Iterator[None]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, ATTENTION_BACKENDS[name])):
        yield


def any_backend(function: Callable) -> Callable:
    """For validation and generation: outside the timed loop, and generation's explicit mask is one flash on CUDA
    refuses."""

    def unrestricted(*args, **kwargs):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([backend for name, backend in SDPBackend.__members__.items() if name != "ERROR"]):
            return function(*args, **kwargs)

    return unrestricted
