"""Keep tokens out of everything the lab stores: logs, records, resolved recipes.

A Hugging Face token sits in the environment of a student's node (litgpt download needs it for gated
models) and litgpt prints its arguments, ``access_token`` included. Anything written to disk goes through
``redact`` first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY", re.IGNORECASE)
_SECRET_SHAPES = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")  # Hugging Face tokens, wherever they appear
_SECRET_KEYS = {"access_token", "token", "hf_token", "api_key", "password"}
MASK = "***"
_MIN_SECRET_LEN = 6  # shorter values ("1", "true") would mask innocent text


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)  # longest first, so a secret containing another is masked whole


def redact(text: str, secrets: list[str] | None = None) -> str:
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, MASK)
    return _SECRET_SHAPES.sub(MASK, text)


def redact_mapping(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of a nested structure with secret-named keys masked and secret values removed from strings."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, Mapping):
        return {
            k: (MASK if str(k).lower() in _SECRET_KEYS and v else redact_mapping(v, secrets)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_mapping(v, secrets) for v in value]
    if isinstance(value, str):
        return redact(value, secrets)
    return value
