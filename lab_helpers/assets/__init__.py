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
"""

from .checkpoints import (
    CI_BASE_CONFIG,
    CI_MODEL_FOR,
    CI_MODELS,
    CI_ORG,
    MARKER,
    REAL_CONFIG_FOR,
    build_checkpoint,
    checkpoint_is_built,
    ci_config,
    download_path,
    is_random_checkpoint,
    prepare_random_weights,
    random_state_dict,
    resolve_config,
)
from .ci import CI_DATASETS, ci_paths, prepare_ci
from .data import alpaca_is_built, generate_alpaca, make_alpaca_json
from .tokenizer import DEFAULT_VOCAB_SIZE, tokenizer_is_built, train_tokenizer

__all__ = [
    "CI_BASE_CONFIG",
    "CI_DATASETS",
    "CI_MODELS",
    "CI_MODEL_FOR",
    "CI_ORG",
    "DEFAULT_VOCAB_SIZE",
    "MARKER",
    "REAL_CONFIG_FOR",
    "alpaca_is_built",
    "build_checkpoint",
    "checkpoint_is_built",
    "ci_config",
    "ci_paths",
    "download_path",
    "generate_alpaca",
    "is_random_checkpoint",
    "make_alpaca_json",
    "prepare_ci",
    "prepare_random_weights",
    "random_state_dict",
    "resolve_config",
    "tokenizer_is_built",
    "train_tokenizer",
]
