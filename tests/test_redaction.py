"""The secrets by shape: one redaction (``lab_helpers/config/secrets.py``) for records, logs, CSVs, exports, printed
commands and the GPU scripts; what is shown is masked, never what is used.

Every token here is fake, built from a pattern at import (never a real one), in the shapes real tokens have.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import textwrap
import urllib.parse

import pytest
from conftest import REPO, cli

from lab_helpers.config.secrets import (
    MASK,
    LineRedactor,
    for_terminal,
    looks_secret,
    redact,
    redact_mapping,
    secret_values,
)

FAKE_GHP = "ghp_" + "FakeGitHubToken0123456789abcdefABCDEF"[:36]  # GitHub's classic shape: ghp_ + 36
FAKE_HF = "hf_" + "FakeHuggingFaceTok0123456789abcdefgh"[:34]  # Hugging Face's: hf_ + 34
FAKE_PASSWORD = "p@ss w0rd/fake!"  # URL-encoding changes it
SHAPES = {
    "github fine-grained": "github_pat_" + "11FAKE0000" + "x" * 72,
    "openai": "sk-proj-" + "fake0123456789abcdefFAKE",
    "aws key id": "AKIA" + "FAKE0123456789AB",
    "slack": "xoxb-" + "1234-5678-fakefake",
}
ENV = {"GITHUB_PAT": FAKE_GHP, "MY_SERVICE_PASSWORD": FAKE_PASSWORD, "PATH": "/usr/bin:/bin"}


def _forms(value: str) -> list[str]:
    """A secret as it may be written: whole, URL-encoded, base64, and each half of it."""
    half = len(value) // 2
    return [
        value,
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value),
        base64.b64encode(value.encode()).decode(),
        value[:half],
        value[half:],
    ]


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "GITHUB_PAT", "AWS_SECRET_ACCESS_KEY", "api-key", "clientSecret", "DB_PASSWORD", "X_AUTH"]
)
def test_a_secret_looking_name_is_one(name):
    assert looks_secret(name)


@pytest.mark.parametrize(
    "name", ["PATH", "PYTHONPATH", "max_tokens", "tokenizer_dir", "HF_TOKEN_PATH", "SSH_AUTH_SOCK", "AUTHOR", "PWD"]
)
def test_a_name_that_merely_contains_a_word_is_not(name):
    assert not looks_secret(name)


@pytest.mark.parametrize(
    "text",
    [
        f"HTTP 401 for {FAKE_GHP} (from GITHUB_PAT)",
        f"GET https://api.example.com/?token={urllib.parse.quote(FAKE_PASSWORD, safe='')}",
        f"password={urllib.parse.quote_plus(FAKE_PASSWORD)}",
        "Authorization: Basic " + base64.b64encode(f"user:{FAKE_GHP}".encode()).decode(),
        "curl -H 'Authorization: Bearer " + base64.b64encode(FAKE_GHP.encode()).decode() + "'",
        f"remote https://student:{FAKE_PASSWORD.replace(' ', '').replace('/', '')}@git.example.com/lab.git",
        f"wrapped at 20 columns: {FAKE_GHP[:17]}\n{FAKE_GHP[17:]} and on",
        f"split by a secret's own line: {FAKE_PASSWORD[:7]}\n{FAKE_PASSWORD[7:]}",
        "litgpt args: {'access_token': 'notAShapeButASecret42', 'precision': 'bf16-true'}",
        "--set access_token=notAShapeButASecret42",
        *(f"{kind}: {token} here" for kind, token in SHAPES.items()),
        f"hf: {FAKE_HF}",
    ],
)
def test_every_form_of_a_secret_is_masked(text):
    secrets = secret_values(ENV)
    shown = redact(text, secrets)
    assert MASK in shown
    leaked = [
        form
        for value in (FAKE_GHP, FAKE_PASSWORD, FAKE_HF, "notAShapeButASecret42", *SHAPES.values())
        for form in _forms(value)
        if len(form) >= 8 and form in shown
    ]
    assert not leaked, shown


def test_what_is_not_a_secret_is_left_as_it_is():
    secrets = secret_values(ENV)
    for text in (
        "iter 12 step 3: loss 2.3456, iter time: 123.45 ms, tokens 512, max_tokens=100",
        "lora_key: true, pad_token_id: 0, tokenizer_dir: checkpoints/x, PATH=/usr/bin:/bin",
        "task-abcdefghijklmnopqrstuvwxyz1234 and a line\nNext line",
        "Basic arithmetic of the step",
    ):
        assert redact(text, secrets) == text
    assert redact_mapping({"lora_key": True, "train": {"max_tokens": 100}}, secrets) == {
        "lora_key": True,
        "train": {"max_tokens": 100},
    }


def test_a_stream_masks_a_token_split_over_two_lines():
    redactor = LineRedactor(ENV)
    lines = [redactor(line) for line in ["token: " + FAKE_GHP[:10], FAKE_GHP[10:] + " ok", "next line"]]
    assert lines == [f"token: {MASK}", f"{MASK} ok", "next line"]


def test_a_terminal_is_shown_escape_sequences_not_given_them():
    assert for_terminal("out_dir=\x1b[31mred\x07\r", []) == "out_dir=\\x1b[31mred\\x07\\r"


# ------------------------------------------------------------------------------------------- on the real CLI


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli(*args), env={**os.environ, "LAB_PROFILE": "ci", **env}, capture_output=True, text=True, timeout=300
    )


def test_an_error_quoting_a_token_or_an_escape_sequence_is_masked_and_escaped(tmp_path):
    recipe = str(REPO / "configs" / "ci" / "ci-llama-xs" / "full.yaml")
    out = _cli("plan", recipe, "--device", "cpu", "--set", f"train.epochs={FAKE_GHP}", LAB_RESULTS=str(tmp_path))
    assert out.returncode == 2 and out.stderr.startswith("error: train.epochs: expected"), out.stderr
    assert FAKE_GHP not in out.stderr and FAKE_GHP[:12] not in out.stderr and MASK in out.stderr
    out = _cli("plan", recipe, "--device", "cpu", "--set", "out_dir=\x1b]0;owned\x07\x1b[2J", LAB_RESULTS=str(tmp_path))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr and "\\x1b" in out.stderr


def test_sample_lengths_says_what_is_wrong_without_quoting_the_file(tmp_path):
    recipe = str(REPO / "configs" / "ci" / "ci-llama-xs" / "full.yaml")
    token_file = tmp_path / "token"
    token_file.write_text(FAKE_HF + "\n")
    out = _cli("plan", recipe, "--device", "cpu", "--time", "--sample-lengths", str(token_file))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "--sample-lengths" in out.stderr and "not a whole number" in out.stderr
    assert FAKE_HF not in out.stderr and FAKE_HF[:8] not in out.stderr


def test_show_commands_masks_what_records_mask(monkeypatch, capsys):
    from lab_helpers.present.commands import show_commands

    monkeypatch.setenv("GITHUB_PAT", FAKE_GHP)
    show_commands("grad-accum", profile="ci", overrides={"access_token": "notAShapeButASecret42", "out_dir": FAKE_GHP})
    printed = capsys.readouterr().out
    assert "--access_token '***'" in printed and "notAShapeButASecret42" not in printed and FAKE_GHP not in printed


# ------------------------------------------------------------------------ a ci run: record, log, CSVs, export

# The training process (only it has LAB_REPORT_DIR) prints the token in every form at start, trains, then fails
# at exit quoting it: what a library's 401 does. Its data lives in a folder named like a token, which must work.
PRINTS_AND_QUOTES_THE_TOKEN = """
import os
if os.environ.get("LAB_REPORT_DIR"):
    import atexit, base64, sys, urllib.parse
    tok, pw = os.environ["GITHUB_PAT"], os.environ["MY_SERVICE_PASSWORD"]
    print("token", tok, "url", urllib.parse.quote(pw, safe=""), flush=True)
    print("Authorization: Basic " + base64.b64encode(("user:" + tok).encode()).decode(), flush=True)
    print("wrapped " + tok[:15] + "\\n" + tok[15:], flush=True)

    def fail():
        print(f"RuntimeError: 401 Unauthorized for token {tok} (password {pw})", file=sys.stderr, flush=True)
        os._exit(3)

    atexit.register(fail)
"""
TOKEN_LIKE_DATA = "hf_abcdefghijklmnopqrstdata2024"  # a folder that merely looks like a token: it must still work


@pytest.mark.slow  # one ci training run (~20 s on 2 cores), then results, compare and export-reference
def test_a_token_quoted_by_a_run_reaches_no_record_log_csv_or_export(ci_assets, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(PRINTS_AND_QUOTES_THE_TOKEN))
    data = tmp_path / TOKEN_LIKE_DATA
    shutil.copytree(REPO / "data" / "ci", data / "ci")
    home = tmp_path / "home"
    home.mkdir()
    (home / "configs").symlink_to(REPO / "configs")
    results = tmp_path / "results"
    env = {
        **ENV,
        "PATH": os.environ["PATH"],
        "LAB_DATA": str(data),
        "LAB_RESULTS": str(results),
        "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    run = _cli("run", "grad-accum", "--set", "train.max_steps=2", "--set", f"access_token={FAKE_HF}", "--quiet", **env)
    [record] = [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines()]
    assert record["status"] == "error" and "401 Unauthorized" in (record["reason"] or "") + (record["error"] or "")
    assert record["iterations"] > 0 and record["tokens"] > 0  # it trained on the token-like folder's data
    assert record["overrides"]["access_token"] == MASK
    csv = _cli("results", "--format", "csv", **env).stdout
    compared = _cli("compare", "--out", str(tmp_path / "figures"), **env)
    exported = _cli("export-reference", "--profile", "ci", **{**env, "LAB_HOME": str(home)})
    assert exported.returncode == 0, exported.stderr
    texts = {
        "the run's output": run.stdout + run.stderr,
        "results --format csv": csv,
        "compare's output": compared.stdout + compared.stderr,
        **{str(p.relative_to(tmp_path)): p.read_text(errors="replace") for p in results.rglob("*") if p.is_file()},
        **{str(p.relative_to(tmp_path)): p.read_text() for p in (tmp_path / "figures").rglob("*.csv")},
        **{str(p.relative_to(tmp_path)): p.read_text() for p in (home / "reference_results").glob("*.jsonl")},
    }
    assert any(name.endswith("comparison.csv") for name in texts) and any("reference_results" in n for n in texts)
    log = texts[f"results/runs/{record['run_id']}/output.log"]
    assert "token ***" in log and "Authorization: Basic ***" in log and "401 Unauthorized" in log
    for name, text in texts.items():
        for value in (FAKE_GHP, FAKE_PASSWORD, FAKE_HF):
            leaked = [form for form in _forms(value) if len(form) >= 8 and form in text]
            assert not leaked, (name, leaked)


@pytest.mark.parametrize(
    "text",
    [
        "--reference ../../etc/passwd: no such reference in /lab/reference_results",
        "file /etc/passwd: not found",
        "cannot open ~/.config/api_key: permission denied",
        "no file data/secrets/token: run prepare",
    ],
)
def test_a_path_that_ends_in_a_secrets_name_is_no_key(text):
    """``answers --reference ../../etc/passwd`` printed "passwd: *** such reference": the word after a path whose
    last part is named like a secret was taken for its value. A path is not a key; the message stays whole."""
    assert redact(text, ()) == text


def test_a_secrets_name_as_a_key_still_masks_its_value():
    for text in ("passwd: hunter22", "password=hunter22", "db passwd: hunter22", "x.access_token: abc123def"):
        assert redact(text, ()).endswith(MASK), text


def test_answers_names_the_reference_it_did_not_find_unmasked(capsys):
    from lab_helpers.cli import main

    assert main(["answers", "--reference", "../../etc/passwd"]) == 2
    err = capsys.readouterr().err
    assert "../../etc/passwd: no such reference" in err and MASK not in err, err
