"""A BPE tokenizer trained locally, so the ``ci`` profile needs no hub. Byte-level (as GPT-2 and Llama 3), so every
string encodes without unknown tokens and decoding one token at a time keeps its spaces; special tokens take ids
0, 1, 2 as in Llama's, and 4096 entries leave every id valid for the real architectures (32000).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import random
import shutil
from pathlib import Path

from . import _text
from ._atomic import atomic_dir, build_lock, read_json, sha256_file, write_json

DEFAULT_VOCAB_SIZE = 4096
"""Small enough not to dwarf the tiny ``ci`` models, big enough that common words are one token."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

INFO_FILE = "lab_tokenizer.json"

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
_CORPUS_SEED = 1234
_CORPUS_LINES = 12_000

# litgpt's Alpaca prompt, so the template's words are single tokens as they are with a real tokenizer.
_ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{}\n\n### Input:\n{}\n\n"
    "### Response:\n",
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{}\n\n### Response:\n",
)


def tokenizer_recipe(vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """Everything that determines the tokenizer's bytes, the ``tokenizers`` version included: caches compare it."""
    version = importlib.metadata.version("tokenizers")
    return (
        f"lab-bpe-bytelevel-v1/{_text.TEXT_RECIPE}/vocab{vocab_size}/corpus{_CORPUS_SEED}x{_CORPUS_LINES}"
        f"/tokenizers-{version}"
    )


def tokenizer_is_built(dest: Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> bool:
    dest = Path(dest)
    info = read_json(dest / INFO_FILE)
    if not isinstance(info, dict) or info.get("recipe") != tokenizer_recipe(vocab_size):
        return False
    if not all((dest / name).is_file() for name in TOKENIZER_FILES):
        return False
    return info.get("sha256") == {name: sha256_file(dest / name) for name in TOKENIZER_FILES}  # intact


def train_in_memory(vocab_size: int = DEFAULT_VOCAB_SIZE):
    """About a second, deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 512:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE (256 bytes + merges)")
    rng = random.Random(_CORPUS_SEED)
    lines = _text.corpus(rng, _CORPUS_LINES)
    for template in _ALPACA_TEMPLATE:
        lines.extend([template.format(_text.instruction(rng, 8), _text.sentence(rng, 8))] * 50)

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    actual = tok.get_vocab_size(with_added_tokens=True)
    if actual != vocab_size:
        raise RuntimeError(f"trained {actual} tokens, wanted {vocab_size}: the corpus is too small for that vocab")
    return tok


def tokenizer_identity(src: Path | None) -> dict[str, str]:
    """The recipe for the lab's own (from a folder whose files match their hashes too), else its files' sha256."""
    if src is None:
        return {"recipe": tokenizer_recipe(DEFAULT_VOCAB_SIZE)}
    src = Path(src)
    fingerprint = tokenizer_fingerprint(src)
    info = read_json(src / INFO_FILE)
    if isinstance(info, dict) and info.get("recipe") and info.get("sha256") == fingerprint:
        return {"recipe": info["recipe"]}
    return {"sha256": fingerprint.get("tokenizer.json") or fingerprint.get("tokenizer.model", "")}


def write_tokenizer_files(dest: Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> dict:
    """Not atomic: the callers are."""
    dest = Path(dest)
    tok = train_in_memory(vocab_size)
    ids = {t: tok.token_to_id(t) for t in (UNK, BOS, EOS)}
    assert ids == {UNK: 0, BOS: 1, EOS: 2}, ids
    tok.save(str(dest / "tokenizer.json"), pretty=False)

    write_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": BOS,
            "eos_token": EOS,
            "unk_token": UNK,
            "model_max_length": 2048,
            "clean_up_tokenization_spaces": False,
        },
        atomic=False,
    )
    write_json(
        dest / "generation_config.json",
        {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": None},
        atomic=False,
    )
    info = {
        "recipe": tokenizer_recipe(vocab_size),
        "vocab_size": vocab_size,
        "bos_id": ids[BOS],
        "eos_id": ids[EOS],
        "sha256": {name: sha256_file(dest / name) for name in TOKENIZER_FILES},
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "note": "Trained by lab_helpers.assets on generated English-ish text; not a real model's tokenizer.",
    }
    write_json(dest / INFO_FILE, info, atomic=False)
    return info


def train_tokenizer(dest: Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE, force: bool = False) -> Path:
    """The training text comes from fixed seeds, so the files are the same on every machine and compare by hash."""
    dest = Path(dest)
    if not force and tokenizer_is_built(dest, vocab_size=vocab_size):
        return dest
    with build_lock(dest):
        if force or not tokenizer_is_built(dest, vocab_size=vocab_size):
            with atomic_dir(dest) as tmp:
                write_tokenizer_files(tmp, vocab_size=vocab_size)
    return dest


def copy_tokenizer_files(src: Path, dest: Path) -> None:
    src, dest = Path(src), Path(dest)
    if not (src / "tokenizer.json").is_file() and not (src / "tokenizer.model").is_file():
        raise FileNotFoundError(f"{src} has neither tokenizer.json nor tokenizer.model")
    for name in (*TOKENIZER_FILES, "tokenizer.model", "special_tokens_map.json", INFO_FILE):
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)


def tokenizer_fingerprint(src: Path) -> dict[str, str]:
    """sha256 of each tokenizer file in ``src``: a checkpoint built from ``src`` is current if these match."""
    src = Path(src)
    return {
        name: sha256_file(src / name)
        for name in (*TOKENIZER_FILES, "tokenizer.model", "special_tokens_map.json")
        if (src / name).is_file()
    }


def tokenizer_size(src: Path) -> int:
    """Number of ids the tokenizer in ``src`` can produce (a model's vocabulary must be at least this)."""
    src = Path(src)
    if (src / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    from sentencepiece import SentencePieceProcessor

    return SentencePieceProcessor(model_file=str(src / "tokenizer.model")).vocab_size()
