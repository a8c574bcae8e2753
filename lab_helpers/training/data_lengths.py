"""The training samples' lengths in tokens, for the time model (``plan --time``).

A step's time follows the *mean* padded length of its micro-batches, not the memory plan's worst case: Alpaca-style
samples are far shorter than 512 tokens, so time at 512 would be overstated several times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_helpers.planning.planner.errors import PlanError


def read_sample_lengths(path: str | Path) -> list[int]:
    file = Path(path)
    if not file.is_file():
        raise PlanError(f"--sample-lengths: no file {file}")
    text = file.read_text(errors="replace").strip()
    try:
        values = json.loads(text) if text.startswith("[") else text.split()
        lengths = [_whole_number(value) for value in values]
    except json.JSONDecodeError as err:  # says where (line, column), never what: the file may hold a token
        raise PlanError(
            f"--sample-lengths {file}: not a JSON list of integers ({err.msg} at line {err.lineno})"
        ) from None
    except (ValueError, TypeError) as err:
        raise PlanError(f"--sample-lengths {file}: expected a JSON list or one integer a line; {err}") from None
    if not lengths or min(lengths) < 1:
        raise PlanError(f"--sample-lengths {file}: expected token counts >= 1, got {len(lengths)} values")
    return lengths


def _whole_number(value: object) -> int:
    """The error never quotes the value: the file may be a token file."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    what = "text" if isinstance(value, str) else type(value).__name__
    raise ValueError(f"found {what} that is not a whole number of up to 18 digits")


def recipe_sample_lengths(recipe: Mapping[str, Any]) -> tuple[list[int] | None, str]:
    from lab_helpers.config.experiments import resolve_path, runnable_recipe

    try:
        ready = runnable_recipe(dict(recipe))
        data_config = ready.get("data") or {"class_path": "litgpt.data.Alpaca"}
        checkpoint = resolve_path(ready["checkpoint_dir"])
        max_seq_length = int((ready.get("train") or {}).get("max_seq_length") or 0) or None
        return _tokenized_lengths(data_config, checkpoint, max_seq_length), ""
    except Exception as err:  # noqa: BLE001 -- any reason the data cannot be read here means "use the worst case"
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        return None, (
            f"the recipe's data is not readable here ({reason}): time at the worst-case length; "
            "give --sample-lengths FILE for the mean padded length"
        )


_TOKENIZED: dict[str, list[int]] = {}  # a notebook cell asks for the same lengths for both runs it compares


def _tokenized_lengths(data_config: Mapping[str, Any], checkpoint: Path, max_seq_length: int | None) -> list[int]:
    json_path = (data_config.get("init_args") or {}).get("json_path")
    stat = Path(json_path).stat() if json_path and Path(json_path).is_file() else None
    key = json.dumps(
        [data_config, str(checkpoint), max_seq_length, stat and [stat.st_size, stat.st_mtime_ns]],
        sort_keys=True,
        default=str,
    )
    if key not in _TOKENIZED:
        _TOKENIZED[key] = _tokenize(data_config, checkpoint, max_seq_length)
    return list(_TOKENIZED[key])


def _tokenize(data_config: Mapping[str, Any], checkpoint: Path, max_seq_length: int | None) -> list[int]:
    import importlib

    from litgpt.tokenizer import Tokenizer

    module, _, name = str(data_config["class_path"]).rpartition(".")
    data_class = getattr(importlib.import_module(module), name)
    init_args = dict(data_config.get("init_args") or {})
    if "json_path" in init_args:
        init_args["json_path"] = Path(init_args["json_path"])
    if "download_dir" in init_args:
        init_args["download_dir"] = Path(init_args["download_dir"])
        if not init_args["download_dir"].exists():
            raise FileNotFoundError(f"{init_args['download_dir']} is not downloaded")
    data = data_class(**init_args)
    data.connect(Tokenizer(checkpoint), batch_size=1, max_seq_length=max_seq_length)
    data.setup()
    dataset = data.train_dataset
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


@dataclass(frozen=True)
class BatchPadding:
    batch_order: str
    micro_batch_size: int
    batch_tokens: tuple[int, ...]  # the samples' own tokens (prompt template included) per micro-batch
    batch_tokens_padded: tuple[int, ...]  # samples x the longest one's length, per micro-batch
    batch_lengths: tuple[int, ...] = ()  # the longest sample's length, per micro-batch: what the time model reads

    @property
    def micro_batches(self) -> int:
        return len(self.batch_tokens)

    @property
    def tokens(self) -> int:
        return sum(self.batch_tokens)

    @property
    def tokens_padded(self) -> int:
        return sum(self.batch_tokens_padded)

    @property
    def padding_pct(self) -> float:
        return 100 * (self.tokens_padded - self.tokens) / self.tokens_padded

    @property
    def mean_padded_length(self) -> int:
        return max(1, round(self.tokens_padded / (self.micro_batch_size * self.micro_batches)))

    def first(self, micro_batches: int) -> tuple[int, int]:
        return sum(self.batch_tokens[:micro_batches]), sum(self.batch_tokens_padded[:micro_batches])


def batch_padding(
    lengths: Sequence[int], *, micro_batch_size: int, batch_order: str = "shuffle", max_seq_length: int | None = None
) -> BatchPadding:
    """From quick mode's own sampler, never worked out a second way, so that the prediction and the run cannot order
    the samples differently."""
    from lab_helpers.training.quick_mode import batch_sampler

    cut = [min(int(n), max_seq_length) if max_seq_length else int(n) for n in lengths]
    if len(cut) < micro_batch_size:  # the sampler's ValueError was a traceback from `plan --time`
        raise PlanError(
            f"{len(cut)} sample length{'s' * (len(cut) != 1)} cannot fill one micro-batch of {micro_batch_size}: "
            f"give at least {micro_batch_size} (--sample-lengths) or a smaller train.micro_batch_size"
        )
    sampler = batch_sampler(cut, batch_order=batch_order, batch_size=micro_batch_size, accumulation=1)
    batches = sampler.timed_batches()
    return BatchPadding(
        batch_order=batch_order,
        micro_batch_size=micro_batch_size,
        batch_tokens=tuple(sum(cut[i] for i in batch) for batch in batches),
        batch_tokens_padded=tuple(len(batch) * max(cut[i] for i in batch) for batch in batches),
        batch_lengths=tuple(max(cut[i] for i in batch) for batch in batches),
    )


def recipe_batch_padding(recipe: Mapping[str, Any], batch_order: str) -> tuple[BatchPadding | None, str]:
    lengths, why = recipe_sample_lengths(recipe)
    if lengths is None:
        return None, why
    train = recipe.get("train") or {}
    max_seq_length = int(train.get("max_seq_length") or 0) or None
    return batch_padding(
        lengths, micro_batch_size=int(train["micro_batch_size"]), batch_order=batch_order, max_seq_length=max_seq_length
    ), ""
