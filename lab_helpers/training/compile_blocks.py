"""Each transformer block compiled before ``fit``: what the ``compile`` and ``compile-static`` experiments switch on.

Why the lab does it itself: litgpt 0.5.13's ``pretrain`` compiles its model, its ``finetune`` scripts do not. The
lab compiles region by region, as torchtune does: ``block.compile()`` on every ``Block`` of the model litgpt built,
right before litgpt's own ``fit`` (as ``activation_checkpointing`` wraps them). Every block runs the same code, so
torch compiles it once (the blocks' weights are inputs of the graph) and compile time stays short. Compilation
happens at the first forward and backward (warm-up); a new sequence length may recompile (torch then compiles one
graph for any length: automatic dynamic shapes); the report says how long compiling took and how often it recompiled
(:class:`CompileWatch`). Validation and example generation run eagerly (:func:`eager`): they are outside the timed
loop, and their other grad mode and KV-cache inputs would only add compiles.

``compile_mode`` "reduce-overhead" records CUDA graphs; on a CPU the child compiles with "default" instead
(:func:`effective_mode`) and the record's ``compiled`` says which ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab_helpers.config.recipe_defaults import CUDA_GRAPH_MODES

FLAG = "--compile"
"""The ``child_litgpt`` switch with its target (``--compile blocks``), removed before litgpt's CLI reads the argv."""
MODE_FLAG = "--compile-mode"
"""``--compile-mode MODE`` (``recipe_defaults.COMPILE_MODES``; without it: "default")."""

METRICS_KEPT = 4096
"""Compilations torch keeps the metrics of (its default keeps 64: a long run's recompiles must not fall off)."""


def effective_mode(requested: str, *, on_cuda: bool) -> tuple[str, str]:
    """(the mode torch.compile is given, why it differs from ``requested`` or ""): CUDA graphs need CUDA."""
    if requested in CUDA_GRAPH_MODES and not on_cuda:
        return "default", f"{requested}'s CUDA graphs need CUDA"
    return requested, ""


def compile_blocks(model: Any, mode: str) -> int:
    """``block.compile(mode=mode)`` on every transformer block of ``model`` (a litgpt GPT or Fabric's wrapper around
    one); returns how many. Raises ValueError for a model without ``transformer.h``, so a wrong model fails loudly
    instead of training uncompiled."""
    gpt = getattr(model, "module", model)
    blocks = getattr(getattr(gpt, "transformer", None), "h", None)
    if blocks is None:
        raise ValueError(f"compiling blocks needs a litgpt GPT (with transformer.h); got {type(gpt).__name__}")
    for block in blocks:
        block.compile(mode=mode)
    return len(blocks)


def eager(function: Callable) -> Callable:
    """``function`` (litgpt's validate, generate_example) run with compiled code set aside
    (``torch.compiler.set_stance("force_eager")``)."""

    def run_eagerly(*args, **kwargs):
        import torch

        with torch.compiler.set_stance("force_eager"):
            return function(*args, **kwargs)

    return run_eagerly


class CompileWatch:
    """What torch compiled from :meth:`start` on, from its own records (``torch._dynamo.utils.get_compilation_metrics``:
    one entry per frame compiled, forward and the backward compiled at the first backward, each with its duration and,
    for a recompilation, the guard that failed)."""

    def __init__(self) -> None:
        self._before = 0
        self.compiled: str | None = None  # what was compiled, e.g. "blocks (22, mode default)"

    def start(self, compiled: str) -> None:
        from torch._dynamo import utils

        utils.set_compilation_metrics_limit(METRICS_KEPT)
        self._before = len(utils.get_compilation_metrics())
        self.compiled = compiled

    def _metrics(self) -> list[Any]:
        from torch._dynamo.utils import get_compilation_metrics

        return get_compilation_metrics()[self._before :]

    def fields(self) -> dict[str, Any]:
        """``compiled``, ``compile_s`` and ``recompiles`` for the report (all None where nothing was compiled)."""
        if self.compiled is None:
            return {"compiled": None, "compile_s": None, "recompiles": None}
        metrics = self._metrics()
        return {
            "compiled": self.compiled,
            "compile_s": sum(m.duration_us or 0 for m in metrics) / 1e6,
            "recompiles": sum(1 for m in metrics if m.recompile_reason),
        }

    def reasons(self) -> list[str]:
        """Why each recompilation happened (the failed guard), for the run's log."""
        if self.compiled is None:
            return []
        return [m.recompile_reason for m in self._metrics() if m.recompile_reason]
