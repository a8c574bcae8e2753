"""Offline assets: tokenizer, random-weight checkpoints, generated data, prepare_ci.

Real code throughout (no mocks): the ci assets are built once per module into a temporary folder (a few
seconds on 2 cores), and one real ``litgpt finetune_full`` run checks that litgpt accepts them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lab_helpers.assets import (
    CI_MODEL_FOR,
    CI_MODELS,
    DEFAULT_VOCAB_SIZE,
    MARKER,
    build_checkpoint,
    checkpoint_is_built,
    ci_config,
    download_path,
    generate_alpaca,
    is_random_checkpoint,
    make_alpaca_json,
    prepare_ci,
    prepare_random_weights,
    train_tokenizer,
)
from lab_helpers.assets._atomic import temp_siblings

SIZES = ["ci-llama-xs", "ci-llama-s", "ci-llama-m", "ci-llama-l"]


@pytest.fixture(scope="module")
def ci(tmp_path_factory):
    """prepare_ci into a temporary LAB_CHECKPOINTS / LAB_DATA, kept for the whole module."""
    root = tmp_path_factory.mktemp("lab")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_CHECKPOINTS", str(root / "checkpoints"))
        mp.setenv("LAB_DATA", str(root / "data"))
        messages: list[str] = []
        paths = prepare_ci(progress=messages.append)
        yield {"paths": paths, "messages": messages, "root": root}


def _hf_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def _token_lengths(tok, records: list[dict]) -> list[int]:
    texts = [r[k] for r in records for k in ("instruction", "input", "output")]
    counts = [len(e.ids) for e in tok.encode_batch(texts)]
    return [sum(counts[i : i + 3]) for i in range(0, len(counts), 3)]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- layout -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_prepare_ci_layout(ci):
    paths, root = ci["paths"], ci["root"]
    assert set(paths) == {"tokenizer", *CI_MODELS, "alpaca_short", "alpaca2k_like"}
    for name in CI_MODELS:
        assert paths[name] == root / "checkpoints" / "lab-ci" / name
    assert paths["alpaca_short"] == root / "data" / "ci" / "alpaca_short.json"
    assert paths["alpaca2k_like"] == root / "data" / "ci" / "alpaca2k_like.json"
    assert set(CI_MODEL_FOR.values()) == set(CI_MODELS)
    # LAB.md: "bigger model" still means bigger on ci: the stand-ins grow with the model they stand in for
    sizes = [(paths[CI_MODEL_FOR[key]] / "lit_model.pth").stat().st_size for key in ("1b", "3b", "7b", "13b")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert not any("already built" in m for m in ci["messages"])


# --- tokenizer ------------------------------------------------------------------------------------------


def test_tokenizer_loads_in_litgpt_and_round_trips(ci):
    from litgpt import Tokenizer

    for where in (ci["paths"]["tokenizer"], ci["paths"]["ci-llama-xs"]):
        tok = Tokenizer(where)
        assert tok.backend == "huggingface"
        assert tok.vocab_size == DEFAULT_VOCAB_SIZE
        assert (tok.bos_id, tok.eos_id) == (1, 2)
        assert tok.use_bos
        text = "Write a short poem about the brexgraishly river.\n\n### Response:\n1. It flows, quietly; 42%!"
        ids = tok.encode(text, eos=True)
        assert ids[0].item() == tok.bos_id and ids[-1].item() == tok.eos_id
        assert 0 <= int(ids.min()) and int(ids.max()) < DEFAULT_VOCAB_SIZE < 32000  # valid for the real archs too
        assert tok.decode(ids[1:-1]) == text
        # one token at a time keeps its leading space (byte-level BPE needs no Llama decoding fix)
        assert tok.decode(tok.encode(" the", bos=False)) == " the"
        assert len(tok.encode("the market", bos=False)) == 2  # common words are single tokens


@pytest.mark.slow
def test_tokenizer_is_deterministic(ci, tmp_path):
    again = train_tokenizer(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (ci["paths"]["tokenizer"] / name).read_bytes()
    mtime = (again / "tokenizer.json").stat().st_mtime_ns
    assert train_tokenizer(tmp_path / "tok") == again
    assert (again / "tokenizer.json").stat().st_mtime_ns == mtime  # cached


# --- checkpoints ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ci_checkpoints_load_into_gpt_and_grow(ci):
    from litgpt import GPT, Config

    counts = []
    for name in SIZES:
        d = ci["paths"][name]
        config = Config.from_file(d / "model_config.yaml")
        assert dataclasses.asdict(config) == dataclasses.asdict(ci_config(name))
        # written by litgpt's save_config: yaml.dump of the dataclass
        assert (d / "model_config.yaml").read_text() == yaml.dump(dataclasses.asdict(config))
        assert config.block_size == 512
        assert config.vocab_size == DEFAULT_VOCAB_SIZE and config.padded_vocab_size % 64 == 0
        assert (config.norm_class_name, config.mlp_class_name, config.rotary_percentage) == ("RMSNorm", "LLaMAMLP", 1)
        model = GPT(config)
        state = torch.load(d / "lit_model.pth", weights_only=True)
        assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in model.state_dict().items()}
        model.load_state_dict(state, strict=True)
        assert all(v.dtype == torch.float32 for v in state.values())
        n = sum(p.numel() for p in model.parameters())
        counts.append(n)
        marker = is_random_checkpoint(d)
        assert marker["random_weights"] is True and marker["config"] == name and marker["n_params"] == n
        assert marker["seed"] == 0 and marker["dtype"] == "float32" and marker["created"]
        with torch.no_grad():
            logits = model(torch.randint(0, DEFAULT_VOCAB_SIZE, (1, 16)))
        assert logits.shape == (1, 16, config.padded_vocab_size) and torch.isfinite(logits).all()
    assert counts == sorted(set(counts)), counts  # strictly increasing
    lo_hi = [(0.3e6, 0.8e6), (1.4e6, 3e6), (4e6, 9e6), (10e6, 20e6)]
    assert all(lo <= n <= hi for n, (lo, hi) in zip(counts, lo_hi, strict=True)), counts


def test_checkpoint_weights_are_deterministic_per_seed(ci, tmp_path):
    tok = ci["paths"]["tokenizer"]
    a = build_checkpoint("ci-llama-xs", tmp_path / "a", tokenizer_dir=tok)
    b = build_checkpoint("ci-llama-xs", tmp_path / "b", tokenizer_dir=tok, seed=1)
    ref = torch.load(ci["paths"]["ci-llama-xs"] / "lit_model.pth", weights_only=True)
    sa = torch.load(a / "lit_model.pth", weights_only=True)
    sb = torch.load(b / "lit_model.pth", weights_only=True)
    assert all(torch.equal(ref[k], sa[k]) for k in ref)
    assert not torch.equal(ref["lm_head.weight"], sb["lm_head.weight"])
    assert checkpoint_is_built(a, "ci-llama-xs", tokenizer_dir=tok)
    assert not checkpoint_is_built(a, "ci-llama-xs", tokenizer_dir=tok, seed=1)
    assert not checkpoint_is_built(a, "ci-llama-s", tokenizer_dir=tok)
    assert checkpoint_is_built(a, ci_config("ci-llama-xs"), tokenizer_dir=tok)  # a Config equal to the name's


@pytest.mark.slow
def test_real_architecture_by_name_at_download_path(ci, tmp_path):
    """Any litgpt config name, written where `litgpt download` would put it, in bf16."""
    from litgpt import GPT, Config

    assert (
        download_path("tiny-llama-1.1b", tmp_path) == tmp_path / "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"
    )
    assert download_path("open_llama_3b", tmp_path) == tmp_path / "openlm-research/open_llama_3b"
    assert download_path("open_llama_7b", tmp_path) == tmp_path / "openlm-research/open_llama_7b"
    assert download_path("open_llama_13b", tmp_path) == tmp_path / "openlm-research/open_llama_13b"

    # pythia-14m: a real litgpt config that is small enough to build in a test (GPT-NeoX, LayerNorm, biases)
    messages: list[str] = []
    out = prepare_random_weights(
        ["pythia-14m"], root=tmp_path, tokenizer_dir=ci["paths"]["tokenizer"], progress=messages.append
    )
    d = out["pythia-14m"]
    assert d == tmp_path / "EleutherAI" / "pythia-14m"
    state = torch.load(d / "lit_model.pth", weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    model = GPT(Config.from_file(d / "model_config.yaml"))
    model.load_state_dict(state, strict=True)
    assert torch.all(state["transformer.h.0.norm_1.weight"] == 1) and torch.all(
        state["transformer.h.0.norm_1.bias"] == 0
    )
    marker = json.loads((d / MARKER).read_text())
    assert marker["dtype"] == "bfloat16" and marker["config"] == "pythia-14m"
    prepare_random_weights(
        ["pythia-14m"], root=tmp_path, tokenizer_dir=ci["paths"]["tokenizer"], progress=messages.append
    )
    assert "already built" in messages[-1]


def test_refuses_to_replace_a_checkpoint_that_is_not_ours(ci, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "lit_model.pth").write_bytes(b"pretend these are real weights")
    with pytest.raises(FileExistsError, match=MARKER):
        build_checkpoint("ci-llama-xs", real, tokenizer_dir=ci["paths"]["tokenizer"])
    assert (real / "lit_model.pth").read_bytes() == b"pretend these are real weights"
    build_checkpoint("ci-llama-xs", real, tokenizer_dir=ci["paths"]["tokenizer"], force=True)
    assert checkpoint_is_built(real, "ci-llama-xs", tokenizer_dir=ci["paths"]["tokenizer"])


# --- a real litgpt fine-tuning run -------------------------------------------------------------------------


def _litgpt_command() -> list[str]:
    if importlib.util.find_spec("litgpt.__main__") is not None:
        return [sys.executable, "-m", "litgpt"]
    return [str(Path(sys.executable).parent / "litgpt")]


@pytest.mark.slow
def test_litgpt_finetune_full_runs_on_ci_checkpoint(ci, tmp_path):
    out = tmp_path / "out"
    cmd = [
        *_litgpt_command(),
        "finetune_full",
        str(ci["paths"]["ci-llama-xs"]),  # checkpoint_dir is positional in litgpt 0.5
        "--precision", "32-true",
        "--data", "JSON",
        "--data.json_path", str(ci["paths"]["alpaca_short"]),
        "--data.val_split_fraction", "0.1",
        "--data.num_workers", "0",
        "--train.max_steps", "2",
        "--train.micro_batch_size", "2",
        "--train.global_batch_size", "2",
        "--train.max_seq_length", "128",
        "--eval.interval", "1000",
        "--eval.final_validation", "false",
        "--eval.initial_validation", "false",
        "--logger_name", "csv",
        "--out_dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = list(out.glob("logs/csv/version_*/metrics.csv"))
    assert len(metrics) == 1 and "loss" in metrics[0].read_text().splitlines()[0]
    assert (out / "final" / "lit_model.pth").is_file()


# --- data -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_data_sets_are_valid_and_have_the_stated_lengths(ci):
    tok = _hf_tokenizer(ci["paths"]["tokenizer"])
    short = json.loads(ci["paths"]["alpaca_short"].read_text())
    like = json.loads(ci["paths"]["alpaca2k_like"].read_text())
    assert (len(short), len(like)) == (400, 2000)
    for records in (short, like):
        assert all(isinstance(r, dict) and set(r) == {"instruction", "input", "output"} for r in records)
        assert all(isinstance(v, str) for r in records for v in r.values())
        assert all(r["instruction"] and r["output"] for r in records)
        assert 0.3 < sum(bool(r["input"]) for r in records) / len(records) < 0.5  # Alpaca: ~40% have an input

    lengths = _token_lengths(tok, short)
    assert min(lengths) >= 20 and max(lengths) <= 100, (min(lengths), max(lengths))

    lengths = _token_lengths(tok, like)
    assert 170 <= statistics.mean(lengths) <= 230
    assert sum(50 <= n <= 400 for n in lengths) / len(lengths) >= 0.85
    assert max(lengths) > 512 and sum(n > 512 for n in lengths) >= 10  # a long tail past max_seq_length
    assert min(lengths) >= 15


@pytest.mark.slow
def test_lengths_hold_for_other_seeds_and_tokenizers(ci):
    tok_dir = ci["paths"]["tokenizer"]
    tok = _hf_tokenizer(tok_dir)
    lengths = _token_lengths(tok, generate_alpaca(300, lengths="short", seed=7, tokenizer_dir=tok_dir))
    assert min(lengths) >= 15 and max(lengths) <= 100  # the upper bound is exact: fields are cut to budget
    assert sum(20 <= n <= 100 for n in lengths) / len(lengths) >= 0.97
    small = _token_lengths(tok, generate_alpaca(50, lengths="alpaca2k", seed=3, tokenizer_dir=tok_dir))
    assert max(small) > 512  # even a small alpaca2k-like set reaches past 512 tokens
    # no tokenizer_dir: counted with the lab's tokenizer trained in memory, hence the same records
    assert generate_alpaca(20, lengths="short", seed=1) == generate_alpaca(
        20, lengths="short", seed=1, tokenizer_dir=tok_dir
    )


def test_data_is_deterministic_per_seed(ci, tmp_path):
    kw = {"n_samples": 60, "lengths": "alpaca2k", "tokenizer_dir": ci["paths"]["tokenizer"]}
    a = make_alpaca_json(tmp_path / "a.json", seed=5, **kw)
    b = make_alpaca_json(tmp_path / "b.json", seed=5, **kw)
    c = make_alpaca_json(tmp_path / "c.json", seed=6, **kw)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    with pytest.raises(ValueError):
        generate_alpaca(5, lengths="long", seed=1)  # type: ignore[arg-type]
    # cached: same spec is a no-op, a different spec rewrites
    mtime = a.stat().st_mtime_ns
    make_alpaca_json(a, seed=5, **kw)
    assert a.stat().st_mtime_ns == mtime
    make_alpaca_json(a, seed=5, **{**kw, "n_samples": 61})
    assert len(json.loads(a.read_text())) == 61


# --- idempotency and interrupted builds ----------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_second_prepare_is_a_noop(ci):
    root = ci["root"]
    before = _snapshot(root)
    messages: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_CHECKPOINTS", str(root / "checkpoints"))
        mp.setenv("LAB_DATA", str(root / "data"))
        paths = prepare_ci(progress=messages.append)
    assert paths == ci["paths"]
    assert _snapshot(root) == before  # same files, same mtimes: nothing was rebuilt (no timing: it flakes under load)
    for key in paths:
        assert any(m.startswith(f"{key}: already built") for m in messages), messages
    assert "already built" in messages[-1]


def test_interrupted_build_is_not_taken_as_complete(ci, tmp_path):
    tok = ci["paths"]["tokenizer"]
    dest = tmp_path / "lab-ci" / "ci-llama-xs"
    dest.parent.mkdir()
    # what a build killed half-way leaves: a hidden temporary sibling with some of the files
    host = socket.gethostname().replace("-", "_").replace(".", "_")
    partial = dest.parent / f".{dest.name}.partial-{host}-{_dead_pid()}-deadbeef"
    partial.mkdir()
    (partial / "model_config.yaml").write_text("n_layer: 3\n")
    (partial / "lit_model.pth").write_bytes(b"\0" * 100)
    assert not dest.exists()
    assert not checkpoint_is_built(dest, "ci-llama-xs", tokenizer_dir=tok)

    build_checkpoint("ci-llama-xs", dest, tokenizer_dir=tok)
    assert checkpoint_is_built(dest, "ci-llama-xs", tokenizer_dir=tok)
    assert temp_siblings(dest) == []  # the dead build's leftovers are cleaned up
    assert (dest / "lit_model.pth").read_bytes() == (ci["paths"]["ci-llama-xs"] / "lit_model.pth").read_bytes()

    # a damaged file (e.g. a truncated copy) is not complete either, and is rebuilt
    with open(dest / "lit_model.pth", "r+b") as fp:
        fp.truncate(1000)
    assert not checkpoint_is_built(dest, "ci-llama-xs", tokenizer_dir=tok)
    build_checkpoint("ci-llama-xs", dest, tokenizer_dir=tok)
    assert checkpoint_is_built(dest, "ci-llama-xs", tokenizer_dir=tok)

    # no marker, no checkpoint: the marker is written last, inside the temporary folder
    (dest / MARKER).unlink()
    assert not checkpoint_is_built(dest, "ci-llama-xs", tokenizer_dir=tok)


def test_a_downloaded_checkpoint_cut_off_in_its_conversion_is_fetched_again(ci, tmp_path):
    """prepare --profile gpu (download) skipped a model once its two files were there; litgpt writes
    model_config.yaml before it converts, so a conversion cut off (Ctrl-C, a full disk) left part of lit_model.pth
    skipped for good, and every run of that model then failed to load it. A real checkpoint, whole and cut."""
    from lab_helpers.assets.prepare import downloaded

    source = ci["paths"]["ci-llama-xs"]
    target = tmp_path / "openlm-research" / "open_llama_3b"
    target.mkdir(parents=True)
    whole = (source / "lit_model.pth").read_bytes()
    (target / "lit_model.pth").write_bytes(whole)
    assert not downloaded(target)  # no model_config.yaml yet: litgpt writes it first
    (target / "model_config.yaml").write_bytes((source / "model_config.yaml").read_bytes())
    assert downloaded(target)
    (target / "lit_model.pth").write_bytes(whole[: len(whole) // 2])
    assert not downloaded(target)


@pytest.mark.slow
def test_prepare_ci_rebuilds_only_what_is_missing(ci, tmp_path, monkeypatch):
    import shutil

    # a copy of the finished assets (hard links: nothing here is modified in place, files are replaced)
    for part in ("checkpoints", "data"):
        no_locks = shutil.ignore_patterns(".*.lock")
        shutil.copytree(ci["root"] / part, tmp_path / part, copy_function=os.link, ignore=no_locks)
    monkeypatch.setenv("LAB_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("LAB_DATA", str(tmp_path / "data"))
    data = tmp_path / "data" / "ci"
    # an interrupted data write: the data set and its spec are gone, a temporary sibling is left
    (data / "alpaca_short.json").unlink()
    (data / "alpaca_short.json.spec").unlink()
    host = socket.gethostname().replace("-", "_").replace(".", "_")
    (data / f".alpaca_short.json.partial-{host}-{_dead_pid()}-0").write_text("[{")
    # an interrupted checkpoint rebuild: the folder is gone, a half-built temporary sibling is left
    ck = tmp_path / "checkpoints" / "lab-ci"
    partial = ck / f".ci-llama-m.partial-x-{_dead_pid()}-0"
    shutil.move(ck / "ci-llama-m", partial)
    (partial / MARKER).unlink()
    messages: list[str] = []
    prepare_ci(progress=messages.append)
    built = [m.split(":")[0] for m in messages if m.endswith("...")]
    assert built == ["ci-llama-m", "alpaca_short"], messages
    assert (data / "alpaca_short.json").read_bytes() == ci["paths"]["alpaca_short"].read_bytes()
    assert temp_siblings(data / "alpaca_short.json") == []  # this host's dead leftovers are cleaned up
    assert checkpoint_is_built(ck / "ci-llama-m", "ci-llama-m", tokenizer_dir=ck / "tokenizer")


def test_concurrent_builds_of_the_same_checkpoint(ci, tmp_path):
    """Two builders at once (threads here; processes take the same file lock): one builds, both succeed."""
    from concurrent.futures import ThreadPoolExecutor

    tok = ci["paths"]["tokenizer"]
    dest = tmp_path / "ci-llama-s"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: build_checkpoint("ci-llama-s", dest, tokenizer_dir=tok), range(2)))
    assert results == [dest, dest]
    assert checkpoint_is_built(dest, "ci-llama-s", tokenizer_dir=tok)
    assert temp_siblings(dest) == []
    ref = torch.load(ci["paths"]["ci-llama-s"] / "lit_model.pth", weights_only=True)
    state = torch.load(dest / "lit_model.pth", weights_only=True)
    assert all(torch.equal(ref[k], state[k]) for k in ref)


def test_large_tensors_fill_in_seeded_chunks_on_every_core(monkeypatch):
    """Random weights of the real 7B/13B sizes are filled chunk by chunk on all cores (one core took minutes on the
    GPU device); the values depend on (seed, name) only, not on the number of threads, and no chunk repeats."""
    from lab_helpers.assets import checkpoints

    n = 3 * checkpoints.FILL_CHUNK_ELEMENTS + 5
    threaded = checkpoints._fill_normal(torch.empty(n, dtype=torch.bfloat16), 0, "w")
    monkeypatch.setattr(checkpoints.os, "cpu_count", lambda: 1)
    single = checkpoints._fill_normal(torch.empty(n, dtype=torch.bfloat16), 0, "w")
    assert torch.equal(threaded, single)
    chunks = threaded.split(checkpoints.FILL_CHUNK_ELEMENTS)
    assert not torch.equal(chunks[0], chunks[1])
    assert abs(threaded.float().std().item() - 0.02) < 1e-3 and abs(threaded.float().mean().item()) < 1e-4
    assert not torch.equal(threaded, checkpoints._fill_normal(torch.empty(n, dtype=torch.bfloat16), 1, "w"))
