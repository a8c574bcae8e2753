"""Offline assets: a locally trained tokenizer, random-weight litgpt checkpoints and generated data.

Why: the ``ci`` profile (and an instructor's dry run on a node without hub access) must run with no model
or data hub. Time and memory of fine-tuning depend on shapes and token counts, not on the weights' values
or the text's meaning, so random weights and generated text measure them faithfully (never the loss).

Everything is deterministic, cached against a recorded spec (a second call is a no-op) and written
atomically (built under a temporary name, then renamed), so an interrupted build never looks complete.

- :func:`prepare_ci` builds all ``ci`` assets (tokenizer, four ``ci-llama-*`` checkpoints, two data sets).
- :func:`build_checkpoint` writes one random-weight checkpoint of any litgpt config.
- :func:`prepare_random_weights` writes real architectures where ``litgpt download`` would put them.
- :func:`train_tokenizer`, :func:`make_alpaca_json` build the pieces on their own.

The names below are imported on first use (PEP 562, as ``planner``'s are): the checkpoints need torch (seconds to
import), and ``python -m lab_helpers`` imports ``assets.wheelhouse`` for every command, ``results`` included.
"""

from __future__ import annotations

from lab_helpers.config.lazy_exports import attach

# public name -> the submodule that defines it
_EXPORTS = {
    "CI_BASE_CONFIG": "checkpoints",
    "CI_MODEL_FOR": "checkpoints",
    "CI_MODELS": "checkpoints",
    "CI_ORG": "checkpoints",
    "MARKER": "checkpoints",
    "REAL_CONFIG_FOR": "checkpoints",
    "build_checkpoint": "checkpoints",
    "checkpoint_is_built": "checkpoints",
    "ci_config": "checkpoints",
    "download_path": "checkpoints",
    "is_random_checkpoint": "checkpoints",
    "prepare_random_weights": "checkpoints",
    "random_state_dict": "checkpoints",
    "resolve_config": "checkpoints",
    "CI_DATASETS": "ci",
    "ci_paths": "ci",
    "prepare_ci": "ci",
    "alpaca_is_built": "data",
    "generate_alpaca": "data",
    "make_alpaca_json": "data",
    "DEFAULT_VOCAB_SIZE": "tokenizer",
    "tokenizer_is_built": "tokenizer",
    "train_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = attach(__name__, {name: f".{module}" for name, module in _EXPORTS.items()})
