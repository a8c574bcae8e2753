"""Each transformer block compiled before ``fit`` (the ``compile`` and ``compile-static`` experiments).

litgpt 0.5.13's ``finetune`` scripts do not compile. Region by region, as torchtune does: every block runs the same
code, so torch compiles it once (the weights are graph inputs) and compile time stays short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab_helpers.config.recipe_defaults import CUDA_GRAPH_MODES

FLAG = "--compile"
MODE_FLAG = "--compile-mode"

METRICS_KEPT = 4096  # torch keeps 64 compilations' metrics by default: a long run's recompiles must not fall off


def effective_mode(requested: str, *, on_cuda: bool) -> tuple[str, str]:
    if requested in CUDA_GRAPH_MODES and not on_cuda:
        return "default", f"{requested}'s CUDA graphs need CUDA"
    return requested, ""


def compile_blocks(model: Any, mode: str) -> int:
    gpt = getattr(model, "module", model)
    blocks = getattr(getattr(gpt, "transformer", None), "h", None)
    if blocks is None:
        raise ValueError(f"compiling blocks needs a litgpt GPT (with transformer.h); got {type(gpt).__name__}")
    for block in blocks:
        block.compile(mode=mode)
    return len(blocks)


def eager(function: Callable) -> Callable:
    """For validation and generation: outside the timed loop, and their grad mode and KV-cache inputs would only add
    compiles."""

    def run_eagerly(*args, **kwargs):
        import torch

        with torch.compiler.set_stance("force_eager"):
            return function(*args, **kwargs)

    return run_eagerly


class CompileWatch:
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
        if self.compiled is None:
            return {"compiled": None, "compile_s": None, "recompiles": None}
        metrics = self._metrics()
        return {
            "compiled": self.compiled,
            "compile_s": sum(m.duration_us or 0 for m in metrics) / 1e6,
            "recompiles": sum(1 for m in metrics if m.recompile_reason),
        }

    def reasons(self) -> list[str]:
        if self.compiled is None:
            return []
        return [m.recompile_reason for m in self._metrics() if m.recompile_reason]
