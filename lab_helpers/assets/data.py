"""Generated Alpaca-style data sets, so runs need no data hub and have controlled token lengths.

Time and memory of a fine-tuning step depend on how many tokens the samples have (and how they pad), not on
what they say. So the generated set copies the *length distribution* of the real one and fills it with
English-ish words from :mod:`lab_helpers.assets._text`.

Assumption about litgpt's ``Alpaca2k`` (mhenrichsen/alpaca_2k_test, counted with the Llama tokenizer, over
instruction + input + output, without the prompt template): most samples have 50-400 tokens, the mean is
about 200, the distribution is right-skewed with a long tail, and the longest samples exceed 512 tokens, so
``max_seq_length 512`` truncates a few. We model the total as log-normal (median 170, sigma 0.55, clipped to
24-1024; mean ~198, ~92% within 50-400), and guarantee that a set of 50 or more samples has at least one
sample over 600 tokens. About 40% of Alpaca samples have a non-empty input; so do ours.

Token counts are targeted in words at 1.35 tokens a word, which is what the lab's own tokenizer (and,
for English, the Llama tokenizer) gives on this text; the tests check the result with the tokenizer.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Literal

from . import _text
from ._atomic import read_json, write_bytes_atomic, write_json

Lengths = Literal["alpaca2k", "short"]

DATA_RECIPE = "lab-alpaca-v1"
TOKENS_PER_WORD = 1.35

ALPACA2K_MEDIAN_TOKENS = 170
ALPACA2K_SIGMA = 0.55
ALPACA2K_CLIP = (24, 1024)
ALPACA2K_TAIL_TOKENS = 600
"""A set of at least ``_TAIL_MIN_SAMPLES`` samples has one sample at least this long (beyond max_seq_length 512)."""
_TAIL_MIN_SAMPLES = 50

SHORT_RANGE = (20, 100)
"""Total tokens of a "short" sample (instruction + input + output), for fast CI runs."""

P_INPUT = 0.4


def _spec_path(path: Path) -> Path:
    return path.with_name(path.name + ".spec")


def _spec(n_samples: int, lengths: str, seed: int) -> dict:
    return {
        "recipe": DATA_RECIPE,
        "text": _text.TEXT_RECIPE,
        "n_samples": n_samples,
        "lengths": lengths,
        "seed": seed,
    }


def _words_for(tokens: float) -> int:
    return max(1, round(tokens / TOKENS_PER_WORD))


def _total_tokens(rng: random.Random, lengths: str) -> int:
    if lengths == "alpaca2k":
        t = rng.lognormvariate(math.log(ALPACA2K_MEDIAN_TOKENS), ALPACA2K_SIGMA)
        return int(min(max(t, ALPACA2K_CLIP[0]), ALPACA2K_CLIP[1]))
    lo, hi = SHORT_RANGE
    # a margin inside the range, since the word-to-token conversion is approximate
    return rng.randint(lo + 6, hi - 16)


def _sample(rng: random.Random, total: int, lengths: str) -> dict[str, str]:
    """One record whose three fields add up to about ``total`` tokens."""
    if lengths == "alpaca2k":
        instr = min(max(6, int(rng.lognormvariate(math.log(16), 0.45))), max(6, total // 3))
    else:
        instr = rng.randint(5, max(5, min(15, total // 3)))
    left = total - instr
    inp = 0
    if rng.random() < P_INPUT and left > 16:
        inp = int(left * rng.uniform(0.1, 0.4))
    out = max(4, left - inp)
    return {
        "instruction": _text.instruction(rng, _words_for(instr)),
        "input": _text.paragraph(rng, _words_for(inp)) if inp else "",
        "output": _text.paragraph(rng, _words_for(out)),
    }


def generate_alpaca(n_samples: int, *, lengths: Lengths, seed: int = 0) -> list[dict[str, str]]:
    """The records :func:`make_alpaca_json` writes, in memory (deterministic for a seed)."""
    if lengths not in ("alpaca2k", "short"):
        raise ValueError(f"lengths must be 'alpaca2k' or 'short', got {lengths!r}")
    if n_samples < 1:
        raise ValueError("n_samples must be at least 1")
    rng = random.Random(f"{DATA_RECIPE}:{lengths}:{seed}")
    totals = [_total_tokens(rng, lengths) for _ in range(n_samples)]
    if lengths == "alpaca2k" and n_samples >= _TAIL_MIN_SAMPLES and max(totals) < ALPACA2K_TAIL_TOKENS:
        i = totals.index(max(totals))
        totals[i] = ALPACA2K_TAIL_TOKENS + rng.randint(0, 200)
    return [_sample(rng, t, lengths) for t in totals]


def alpaca_is_built(path: Path, *, n_samples: int, lengths: Lengths, seed: int = 0) -> bool:
    spec = read_json(_spec_path(Path(path)))
    if not isinstance(spec, dict) or not Path(path).is_file():
        return False
    size = spec.pop("size", None)
    return spec == _spec(n_samples, lengths, seed) and size == Path(path).stat().st_size


def make_alpaca_json(path: Path, *, n_samples: int, lengths: Lengths, seed: int = 0, force: bool = False) -> Path:
    """Write (once) a JSON list of ``{"instruction", "input", "output"}`` records for litgpt's ``JSON`` data module.

    ``lengths="alpaca2k"`` copies the token-length distribution of litgpt's Alpaca2k (see the module
    docstring for the assumption), for measurements whose padding and truncation should match the real set;
    ``"short"`` keeps each sample at 20-100 tokens so CI steps are fast. Deterministic for a seed. A sidecar
    ``<name>.spec`` records what was generated: same spec and intact file, nothing is done unless ``force``.
    The file is written to a temporary name and renamed, so a reader never sees half a file.
    """
    path = Path(path)
    if not force and alpaca_is_built(path, n_samples=n_samples, lengths=lengths, seed=seed):
        return path
    records = generate_alpaca(n_samples, lengths=lengths, seed=seed)
    data = (json.dumps(records, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    _spec_path(path).unlink(missing_ok=True)  # the data and its spec must never disagree
    write_bytes_atomic(path, data)
    write_json(_spec_path(path), {**_spec(n_samples, lengths, seed), "size": len(data)})
    return path
