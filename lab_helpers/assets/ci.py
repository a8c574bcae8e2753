"""Every offline asset the ``ci`` profile needs, built once and cached; ``assets.prepare`` is the entry point."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lab_helpers.config.paths import checkpoints_dir, data_dir

from .checkpoints import CI_MODELS, CI_ORG, build_checkpoint, checkpoint_is_built
from .data import alpaca_is_built, make_alpaca_json
from .tokenizer import tokenizer_is_built, train_tokenizer

CI_DATASETS: dict[str, dict] = {
    "alpaca_short": {"file": "alpaca_short.json", "n_samples": 400, "lengths": "short"},
    "alpaca2k_like": {"file": "alpaca2k_like.json", "n_samples": 2000, "lengths": "alpaca2k"},
}
"""Short samples for fast CI steps; Alpaca2k-like lengths where padding and truncation should match the real set."""


def ci_paths() -> dict[str, Path]:
    """Read at call time, so ``LAB_CHECKPOINTS``/``LAB_DATA`` apply."""
    ck = checkpoints_dir() / CI_ORG
    paths = {"tokenizer": ck / "tokenizer"}
    paths.update({name: ck / name for name in CI_MODELS})
    paths.update({key: data_dir() / "ci" / spec["file"] for key, spec in CI_DATASETS.items()})
    return paths


def prepare_ci(*, force: bool = False, progress: Callable[[str], None] = print) -> dict[str, Path]:
    """Each asset is checked against its recorded spec first, so a second call only reads a few small files."""
    t0 = time.perf_counter()
    paths = ci_paths()
    built = 0

    def step(key: str, is_built: Callable[[], bool], build: Callable[[], object]) -> None:
        nonlocal built
        if not force and is_built():
            progress(f"{key}: already built at {paths[key]}")
            return
        t = time.perf_counter()
        progress(f"{key}: building at {paths[key]} ...")
        build()
        built += 1
        progress(f"{key}: built in {time.perf_counter() - t:.1f} s")

    tok = paths["tokenizer"]
    step("tokenizer", lambda: tokenizer_is_built(tok), lambda: train_tokenizer(tok, force=force))
    for name in CI_MODELS:
        dest = paths[name]
        step(
            name,
            lambda dest=dest, name=name: checkpoint_is_built(dest, name, tokenizer_dir=tok),
            lambda dest=dest, name=name: build_checkpoint(name, dest, tokenizer_dir=tok, force=force),
        )
    for key, spec in CI_DATASETS.items():
        kw = {"n_samples": spec["n_samples"], "lengths": spec["lengths"], "tokenizer_dir": tok}
        step(
            key,
            lambda key=key, kw=kw: alpaca_is_built(paths[key], **kw),
            lambda key=key, kw=kw: make_alpaca_json(paths[key], force=force, **kw),
        )
    dt = time.perf_counter() - t0
    if built:
        progress(f"ci assets ready ({built} built) in {dt:.1f} s")
    else:
        progress(f"ci assets: all already built ({dt:.2f} s)")
    return paths
