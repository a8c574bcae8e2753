"""``scripts/gpu-measure.sh``, the one-command measurement of a GPU node (see its header), run here on the ci
profile with real training: it records, packs every record and log even when the deadline stops it, and refuses
bad input in one line before doing anything; every script under scripts/ is shellcheck-clean."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu-measure.sh"


def _measure(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "LAB_PYTHON": os.environ.get("LAB_PYTHON", "python"), "LAB_PROFILE": "ci",
                "LAB_RESULTS": str(tmp_path / "results"), **env}
    return subprocess.run(["bash", str(SCRIPT), "--pack", str(tmp_path / "pack"), *args], env=full_env,
                          capture_output=True, text=True, timeout=300)


def _packed(tmp_path: Path) -> dict[str, bytes]:
    [tarball] = (tmp_path / "pack").glob("gpu-results-*.tar.gz")
    with tarfile.open(tarball) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@pytest.mark.slow
def test_a_run_is_recorded_and_packed_with_the_log_and_the_doctors_report(ci_assets, tmp_path: Path) -> None:
    out = _measure(tmp_path, "--set", "seed=7", "small-batch")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    files = _packed(tmp_path)
    [record] = [json.loads(line) for line in files["runs.jsonl"].decode().splitlines()]
    assert record["experiment"] == "small-batch" and record["status"] == "ok" and record["mode"] == "quick"
    assert record["overrides"]["seed"] == 7 and record["config"]["seed"] == 7  # --set reached the run
    log = files["gpu-measure.log"].decode()
    assert "small-batch: ok" in log and "small-batch: exit 0" in log  # the CLI's own line, then the script's
    assert files["doctor.txt"]


@pytest.mark.slow
def test_the_deadline_starts_nothing_more_and_still_packs(tmp_path: Path) -> None:
    out = _measure(tmp_path, "--deadline-s", "1", "small-batch", "grad-accum", LAB_MIN_RUN_S="60")
    assert out.returncode == 1
    log = _packed(tmp_path)["gpu-measure.log"].decode()
    assert "not started (deadline): small-batch" in log and "not started (deadline): grad-accum" in log
    assert not (tmp_path / "results" / "runs.jsonl").exists()


@pytest.mark.parametrize(("args", "message"), [
    ((), "name at least one experiment"),
    (("--deadline-s", "soon", "small-batch"), "--deadline-s soon: give whole seconds"),
    (("--bogus", "small-batch"), "unknown option --bogus"),
    (("--set", "seed", "small-batch"), "--set seed: give KEY=VALUE"),
    (("--wheels", "/nonexistent", "small-batch"), "holds no wheels"),
    (("--simulate-world", "four", "fsdp"), "--simulate-world four: give a whole number"),
    (("small-batch", "--models"), "--models needs a value"),  # last: was bash's '$2: unbound variable', exit 1
    (("small-batch", "--deadline-s"), "--deadline-s needs a value"),
])
def test_bad_input_is_one_line_and_packs_nothing(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    out = _measure(tmp_path, *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "pack").exists()


@pytest.mark.slow
def test_every_script_of_scripts_is_shellcheck_clean() -> None:
    scripts = sorted(str(p) for p in (REPO / "scripts").glob("*.sh"))
    out = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.slow  # the doctor's report alone takes ~15 s on 2 shared cores
def test_a_secret_given_with_set_is_masked_in_the_log_and_the_pack(tmp_path: Path) -> None:
    """``--set access_token=...`` was logged verbatim and packed; every logged line now goes through the
    lab's redaction (lab_helpers/config/secrets.py). The token is fake; the experiment unknown, so nothing trains."""
    fake = "hf_" + "FakeHuggingFaceTok0123456789abcdefgh"
    out = _measure(tmp_path, "--set", f"access_token={fake}", "--set", "note=ghp_" + "Fake0123456789" * 3,
                   "no-such-experiment", GITHUB_PAT="ghp_" + "Fake0123456789" * 3)
    files = _packed(tmp_path)
    log = files["gpu-measure.log"].decode()
    assert "--set access_token=*** --set note=***" in log and "no-such-experiment: exit 2" in log
    for name, data in [*files.items(), ("stdout", out.stdout.encode()), ("stderr", out.stderr.encode())]:
        assert fake.encode() not in data and b"Fake0123456789" not in data, name
