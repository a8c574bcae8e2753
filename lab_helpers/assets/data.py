"""Generated Alpaca-style data: time and memory depend on the samples' token lengths, not on what they say. Assumed
of litgpt's Alpaca2k (Llama tokenizer, instruction + input + output): most samples 50-400 tokens, mean ~200, a long
tail past 512, ~40% with an input; modelled as log-normal (median 170, sigma 0.55, clipped to 24-1024). Each field
is cut back at a word boundary to its exact token budget in the tokenizer the runs will use.
"""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path
from typing import Literal

from . import _text
from ._atomic import build_lock, read_json, write_bytes_atomic, write_json
from .tokenizer import tokenizer_identity

Lengths = Literal["alpaca2k", "short"]

DATA_RECIPE = "lab-alpaca-v2"

ALPACA2K_MEDIAN_TOKENS = 170
ALPACA2K_SIGMA = 0.55
ALPACA2K_CLIP = (24, 1024)
ALPACA2K_TAIL_TOKENS = 600
"""A set of at least ``_TAIL_MIN_SAMPLES`` samples has one sample at least this long (beyond max_seq_length 512)."""
_TAIL_MIN_SAMPLES = 50

SHORT_RANGE = (20, 100)

P_INPUT = 0.4


def _spec_path(path: Path) -> Path:
    return path.with_name(path.name + ".spec")


def _spec(n_samples: int, lengths: str, seed: int, tokenizer_dir: Path | None) -> dict:
    return {
        "recipe": DATA_RECIPE,
        "text": _text.TEXT_RECIPE,
        "n_samples": n_samples,
        "lengths": lengths,
        "seed": seed,
        "tokenizer": tokenizer_identity(tokenizer_dir),
    }


_FIT_MARGIN_WORDS = 3


def _load_counter(tokenizer_dir: Path | None):
    if tokenizer_dir is None:
        return _default_counter()
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: lengths are counted with a tokenizers (tokenizer.json) tokenizer")
    return Tokenizer.from_file(str(path))


@functools.cache
def _default_counter():
    from .tokenizer import train_in_memory

    return train_in_memory()


def _cut(text: str, offsets: list[tuple[int, int]], budget: int) -> str:
    """``text`` cut after its first ``budget - 1`` tokens, at a word boundary, closed with a full stop."""
    keep = max(1, budget - 1)  # room for the closing full stop
    cut = offsets[keep - 1][1]
    if cut < len(text) and text[cut].isalnum() and text[cut - 1].isalnum():
        cut = max(0, text.rfind(" ", 0, cut))  # don't split a word
    head = text[:cut].rstrip(" ,;:\n")
    if not head:
        return text.split()[0]
    return head if head[-1] in ".?!" else head + "."


def _fit_all(counter, fields: list[tuple[str, int]]) -> list[str]:
    """Batch-encoded: this is the slow part."""
    encs = counter.encode_batch([text for text, _ in fields], add_special_tokens=False)
    out = [
        text if len(enc.ids) <= budget else _cut(text, enc.offsets, budget)
        for (text, budget), enc in zip(fields, encs, strict=True)
    ]
    # byte-level BPE never merges across words, so a cut at a word boundary keeps the count; check anyway
    checks = counter.encode_batch(out, add_special_tokens=False)
    for i, enc in enumerate(checks):
        while len(enc.ids) > max(1, fields[i][1]) and " " in out[i]:
            out[i] = out[i].rsplit(" ", 1)[0].rstrip(" ,;:\n") + "."
            enc = counter.encode(out[i], add_special_tokens=False)
    return out


def _total_tokens(rng: random.Random, lengths: str) -> int:
    if lengths == "alpaca2k":
        t = rng.lognormvariate(math.log(ALPACA2K_MEDIAN_TOKENS), ALPACA2K_SIGMA)
        return int(min(max(t, ALPACA2K_CLIP[0]), ALPACA2K_CLIP[1]))
    return rng.randint(SHORT_RANGE[0] + 6, SHORT_RANGE[1])  # cuts at word boundaries lose a token or three


def _raw_sample(rng: random.Random, total: int, lengths: str) -> list[tuple[str, int]]:
    """Instruction, input and output as ``(over-generated text, token budget)``; budgets add up to ``total``."""
    if lengths == "alpaca2k":
        instr = min(max(6, int(rng.lognormvariate(math.log(16), 0.45))), max(6, total // 3))
    else:
        instr = rng.randint(5, max(5, min(15, total // 3)))
    left = total - instr
    inp = 0
    if rng.random() < P_INPUT and left > 16:
        inp = int(left * rng.uniform(0.1, 0.4))
    out = max(4, left - inp)
    # over-generate (every word is at least one token), to be cut back to the budget
    return [
        (_text.instruction(rng, instr + _FIT_MARGIN_WORDS), instr),
        (_text.paragraph(rng, inp + _FIT_MARGIN_WORDS) if inp else "", inp),
        (_text.paragraph(rng, out + _FIT_MARGIN_WORDS), out),
    ]


def generate_alpaca(
    n_samples: int, *, lengths: Lengths, seed: int = 0, tokenizer_dir: Path | None = None
) -> list[dict[str, str]]:
    if lengths not in ("alpaca2k", "short"):
        raise ValueError(f"lengths must be 'alpaca2k' or 'short', got {lengths!r}")
    if n_samples < 1:
        raise ValueError("n_samples must be at least 1")
    counter = _load_counter(tokenizer_dir)
    rng = random.Random(f"{DATA_RECIPE}:{lengths}:{seed}")
    totals = [_total_tokens(rng, lengths) for _ in range(n_samples)]
    if lengths == "alpaca2k" and n_samples >= _TAIL_MIN_SAMPLES and max(totals) < ALPACA2K_TAIL_TOKENS:
        i = totals.index(max(totals))
        totals[i] = ALPACA2K_TAIL_TOKENS + rng.randint(0, 200)
    fields = [field for t in totals for field in _raw_sample(rng, t, lengths)]
    texts = _fit_all(counter, fields)
    keys = ("instruction", "input", "output")
    return [dict(zip(keys, texts[i : i + 3], strict=True)) for i in range(0, len(texts), 3)]


def alpaca_is_built(
    path: Path, *, n_samples: int, lengths: Lengths, seed: int = 0, tokenizer_dir: Path | None = None
) -> bool:
    spec = read_json(_spec_path(Path(path)))
    if not isinstance(spec, dict) or not Path(path).is_file():
        return False
    size = spec.pop("size", None)
    return spec == _spec(n_samples, lengths, seed, tokenizer_dir) and size == Path(path).stat().st_size


def make_alpaca_json(
    path: Path,
    *,
    n_samples: int,
    lengths: Lengths,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """For litgpt's ``JSON`` data module; ``"short"`` samples keep CI steps fast. A ``<name>.spec`` sidecar records
    what was made, so an intact file of the same spec is not made again."""
    path = Path(path)
    kw = {"n_samples": n_samples, "lengths": lengths, "seed": seed, "tokenizer_dir": tokenizer_dir}
    if not force and alpaca_is_built(path, **kw):
        return path
    with build_lock(path):
        if not force and alpaca_is_built(path, **kw):
            return path  # built by another process while we waited
        records = generate_alpaca(n_samples, lengths=lengths, seed=seed, tokenizer_dir=tokenizer_dir)
        data = (json.dumps(records, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
        _spec_path(path).unlink(missing_ok=True)  # the data and its spec must never disagree
        write_bytes_atomic(path, data)
        write_json(_spec_path(path), {**_spec(n_samples, lengths, seed, tokenizer_dir), "size": len(data)})
    return path
