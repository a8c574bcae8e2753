"""Offline assets (a trained tokenizer, random-weight checkpoints, generated data), so the ``ci`` profile and a dry
run need no hub: time and memory depend on shapes and token counts, not on weights or meaning. Deterministic, cached
against a recorded spec and written atomically. Exports load on first use: the checkpoints import torch.
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
