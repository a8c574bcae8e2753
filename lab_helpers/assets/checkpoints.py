"""Random-weight litgpt checkpoints, built with no hub: tiny ``ci`` models, and real architectures for dry runs.
Time and memory do not depend on the weights' values (the loss does). The ``RANDOM_WEIGHTS`` marker is written last
and the folder renamed into place only when complete, so the marker also means "built".
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lab_helpers.config.paths import checkpoints_dir

from ._atomic import atomic_dir, build_lock, read_json, sha256_json, write_json
from .tokenizer import (
    DEFAULT_VOCAB_SIZE,
    copy_tokenizer_files,
    tokenizer_identity,
    tokenizer_size,
    train_tokenizer,
    write_tokenizer_files,
)

if TYPE_CHECKING:
    import litgpt

MARKER = "RANDOM_WEIGHTS"
CKPT_FORMAT = "lab-random-checkpoint-v2"  # v2: large tensors are filled in chunks, each with its own seed

FILL_CHUNK_ELEMENTS = 1 << 22

CI_ORG = "lab-ci"

CI_BASE_CONFIG = "tiny-llama-1.1b"
"""RMSNorm, SwiGLU, full rotary, grouped-query attention, no biases: the ci models at the sizes below."""

CI_MODELS: dict[str, dict[str, Any]] = {
    # name: overrides on top of CI_BASE_CONFIG (vocab 4096, block_size 512 for all). Parameters:
    # 469,584 / 1,956,224 / 6,450,432 / 14,505,600. Grouped-query attention as in TinyLlama; the head sizes
    # (12, 32, 32, 48) are small but even, as rotary embeddings need. The largest takes ~0.6 s for a full
    # fine-tuning micro-batch of 8x128 tokens with AdamW in fp32 on 2 CPU cores (litgpt finetune_full).
    "ci-llama-xs": {"n_layer": 3, "n_head": 4, "n_query_groups": 2, "n_embd": 48, "intermediate_size": 128},
    "ci-llama-s": {"n_layer": 5, "n_head": 4, "n_query_groups": 2, "n_embd": 128, "intermediate_size": 344},
    "ci-llama-m": {"n_layer": 6, "n_head": 8, "n_query_groups": 4, "n_embd": 256, "intermediate_size": 688},
    "ci-llama-l": {"n_layer": 7, "n_head": 8, "n_query_groups": 4, "n_embd": 384, "intermediate_size": 1024},
}
_CI_COMMON = {"block_size": 512, "vocab_size": DEFAULT_VOCAB_SIZE, "padding_multiple": 64}

CI_MODEL_FOR: dict[str, str] = {"1b": "ci-llama-xs", "3b": "ci-llama-s", "7b": "ci-llama-m", "13b": "ci-llama-l"}
"""Which ci model stands in for which real size (1.1B TinyLlama, OpenLLaMA 3B / 7B / 13B)."""

REAL_CONFIG_FOR: dict[str, str] = {
    "1b": "tiny-llama-1.1b",
    "3b": "open_llama_3b",
    "7b": "open_llama_7b",
    "13b": "open_llama_13b",
}


def ci_config(name: str) -> litgpt.Config:
    from litgpt import Config

    if name not in CI_MODELS:
        raise KeyError(f"{name!r} is not a ci model; choose from {sorted(CI_MODELS)}")
    base = dataclasses.asdict(Config.from_name(CI_BASE_CONFIG))
    base.update(_CI_COMMON, **CI_MODELS[name])
    # derived in __post_init__ from the new sizes
    base.update(name=name, hf_config={"org": CI_ORG, "name": name}, head_size=None, padded_vocab_size=None)
    return Config(**base)


def resolve_config(config: litgpt.Config | str) -> litgpt.Config:
    if not isinstance(config, str):
        return config
    if config in CI_MODELS:
        return ci_config(config)
    from litgpt import Config

    return Config.from_name(config)


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "32": "float32", "16": "float16"}
    value = getattr(torch, aliases.get(str(dtype), str(dtype)).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {dtype!r}")
    return value


def _tensor_seed(seed: int, key: str) -> int:
    """A seed per tensor, so each tensor's values depend only on (seed, name) and not on build order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _init_tensor(module: torch.nn.Module, attr: str, shape: torch.Size, dtype: torch.dtype, seed: int, key: str):
    """Materialise one tensor as litgpt's own initialisation would: N(0, 0.02) weights, zero biases, unit norms."""
    t = torch.empty(shape, dtype=dtype)
    cls = type(module).__name__.lower()
    if attr == "bias" or attr.endswith("_bias"):
        return t.zero_()
    if "norm" in cls and attr == "weight":
        return t.fill_(1.0)
    if not t.is_floating_point():
        return t.zero_()
    return _fill_normal(t, seed, key)


def _fill_normal(t: torch.Tensor, seed: int, key: str) -> torch.Tensor:
    """In chunks on all cores: ``normal_`` with a generator runs on one, and building the 1.1B and 7B checkpoints
    took 316 s on the H100 machine. Seeded chunks keep the values a function of (seed, name), whatever the threads."""
    chunks = t.view(-1).split(FILL_CHUNK_ELEMENTS)

    def fill(index: int) -> None:
        name = key if index == 0 else f"{key}#{index}"
        chunks[index].normal_(0.0, 0.02, generator=torch.Generator().manual_seed(_tensor_seed(seed, name)))

    if len(chunks) == 1:
        fill(0)
    else:
        with ThreadPoolExecutor(max_workers=min(len(chunks), os.cpu_count() or 1)) as pool:
            list(pool.map(fill, range(len(chunks))))
    return t


def random_state_dict(config: litgpt.Config, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """Built on the meta device and filled tensor by tensor, so a 13B model in bf16 needs ~26 GB, not twice that."""
    from litgpt import GPT

    with torch.device("meta"):
        model = GPT(config)
    made: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for key, meta in model.state_dict(keep_vars=True).items():
        if id(meta) not in made:
            module_name, _, attr = key.rpartition(".")
            module = model.get_submodule(module_name)
            made[id(meta)] = _init_tensor(module, attr, meta.shape, dtype, seed, key)
        state[key] = made[id(meta)]
    return state


def _spec(config: litgpt.Config | str, *, dtype: torch.dtype, seed: int, tokenizer_dir: Path | None) -> dict[str, Any]:
    """What a cache check compares. Cheap for names: no litgpt import, which takes seconds."""
    tok = tokenizer_identity(tokenizer_dir)
    spec: dict[str, Any] = {"format": CKPT_FORMAT, "dtype": str(dtype).removeprefix("torch."), "seed": seed}
    spec["tokenizer"] = tok
    if isinstance(config, str):
        # a name means the same config for a given litgpt version (and, for ci models, our overrides)
        spec["request"] = {
            "name": config,
            "litgpt": importlib.metadata.version("litgpt"),
            "ci": {**_CI_COMMON, **CI_MODELS[config], "base": CI_BASE_CONFIG} if config in CI_MODELS else None,
        }
    else:
        spec["config"] = dataclasses.asdict(config)
    return spec


def _spec_keys(spec: dict[str, Any]) -> dict[str, str]:
    keys = {"common": sha256_json({k: spec[k] for k in ("format", "dtype", "seed", "tokenizer")})}
    if "request" in spec:
        keys["request"] = sha256_json(spec["request"])
    if "config" in spec:
        keys["config"] = sha256_json(spec["config"])
    return keys


def checkpoint_is_built(
    dest: Path,
    config: litgpt.Config | str,
    *,
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
) -> bool:
    dest = Path(dest)
    marker = read_json(dest / MARKER)
    if not isinstance(marker, dict) or not isinstance(marker.get("spec_keys"), dict):
        return False
    want = _spec_keys(_spec(config, dtype=_dtype(dtype), seed=seed, tokenizer_dir=tokenizer_dir))
    have = marker["spec_keys"]
    if have.get("common") != want["common"]:
        return False
    if not any(k in want and have.get(k) == want[k] for k in ("request", "config")):
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or "lit_model.pth" not in files:
        return False
    for name, size in files.items():
        p = dest / name
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True


def _check_replaceable(dest: Path, force: bool) -> None:
    """Refuse to overwrite a folder that is not one of ours (e.g. a real downloaded checkpoint)."""
    if force or not dest.exists():
        return
    if not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not a folder")
    if (dest / MARKER).is_file() or not any(dest.iterdir()):
        return
    raise FileExistsError(
        f"{dest} exists, is not empty and has no {MARKER} marker: it may hold real weights. "
        "Remove it, choose another folder, or pass force=True to replace it."
    )


def build_checkpoint(
    config: litgpt.Config | str,
    dest: Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """A folder already holding this exact spec is left alone (the check reads only small files), so a second call
    is cheap; a non-empty ``dest`` without the marker (real weights, perhaps) is replaced only with ``force``."""
    dest = Path(dest)
    dtype = _dtype(dtype)
    if not force and checkpoint_is_built(dest, config, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir):
        return dest
    with build_lock(dest):
        # another process may have built it while we waited for the lock
        if not force and checkpoint_is_built(dest, config, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir):
            return dest
        _check_replaceable(dest, force)
        _build_checkpoint(config, dest, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir)
    return dest


def _build_checkpoint(
    config: litgpt.Config | str, dest: Path, *, dtype: torch.dtype, seed: int, tokenizer_dir: Path | None
) -> None:
    from litgpt.utils import save_config

    cfg = resolve_config(config)
    spec = _spec(config, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir)
    keys = _spec_keys(spec)
    keys["config"] = sha256_json(dataclasses.asdict(cfg))  # a Config equal to the named one matches too
    with atomic_dir(dest) as tmp:
        if tokenizer_dir is None:
            write_tokenizer_files(tmp)
        else:
            copy_tokenizer_files(tokenizer_dir, tmp)
        n_tokens = tokenizer_size(tmp)
        if n_tokens > cfg.vocab_size:
            raise ValueError(f"the tokenizer has {n_tokens} ids but {cfg.name} only {cfg.vocab_size} embeddings")
        save_config(cfg, tmp)
        state = random_state_dict(cfg, dtype=dtype, seed=seed)
        n_params = sum(t.numel() for t in {id(t): t for t in state.values()}.values())
        torch.save(state, tmp / "lit_model.pth")
        del state
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        write_json(
            tmp / MARKER,
            {
                "random_weights": True,
                "config": cfg.name,
                "seed": seed,
                "dtype": spec["dtype"],
                "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "n_params": n_params,
                "hf_config": cfg.hf_config,
                "litgpt_version": importlib.metadata.version("litgpt"),
                "torch_version": torch.__version__,
                "tokenizer": spec["tokenizer"],
                "files": files,
                "spec_keys": keys,
                "note": "Random weights (N(0, 0.02)), built offline by lab_helpers.assets: valid for time and "
                "memory measurements, never for loss or quality.",
            },
            atomic=False,
        )


def is_random_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    marker = read_json(Path(checkpoint_dir) / MARKER)
    return marker if isinstance(marker, dict) else None


def download_path(config_name: str, root: Path | None = None) -> Path:
    """Where ``litgpt download <org>/<name>`` puts this config's checkpoint."""
    root = checkpoints_dir() if root is None else Path(root)
    if config_name in CI_MODELS:
        return root / CI_ORG / config_name
    hf = resolve_config(config_name).hf_config
    return root / hf["org"] / hf["name"]


def prepare_random_weights(
    config_names: list[str],
    *,
    root: Path | None = None,
    dtype: torch.dtype | str = torch.bfloat16,
    seed: int = 0,
    tokenizer_dir: Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
) -> dict[str, Path]:
    """For an instructor's dry run without hub access: the recipes find the checkpoints where ``litgpt download``
    puts them and run unchanged. The lab's tokenizer (ids < 4096) is valid for a 32000 vocabulary."""
    root = checkpoints_dir() if root is None else Path(root)
    if tokenizer_dir is None:
        tokenizer_dir = train_tokenizer(root / CI_ORG / "tokenizer")
    out: dict[str, Path] = {}
    for name in config_names:
        dest = download_path(name, root)
        if not force and checkpoint_is_built(dest, name, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir):
            progress(f"{name}: already built at {dest}")
        else:
            progress(f"{name}: building random weights ({_dtype(dtype)}) at {dest} ...")
            build_checkpoint(name, dest, dtype=dtype, seed=seed, tokenizer_dir=tokenizer_dir, force=force)
        out[name] = dest
    return out
