"""Shared fixtures: the ci profile's offline assets (built once, cached) and a private results folder per test."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# One training run at a time per node (lab_helpers.launch.run_lock): each pytest-xdist worker, and the notebook
# kernels it starts, is a node of its own, so that the two workers' runs do not refuse each other. A test of the
# lock sets its own file.
RUN_LOCK = Path(tempfile.gettempdir()) / f"lab_helpers-runs-test-{os.getpid()}.lock"
os.environ["LAB_RUN_LOCK"] = str(RUN_LOCK)


def pytest_sessionfinish(session, exitstatus) -> None:
    RUN_LOCK.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def ci_assets() -> dict[str, Path]:
    """Random-weight tiny llamas, tokenizer and data under the lab's own folders (idempotent, seconds)."""
    from lab_helpers.assets import prepare_ci

    return prepare_ci(progress=lambda *_: None)


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test records into its own results folder (the env var reaches child processes too)."""
    folder = tmp_path / "results"
    monkeypatch.setenv("LAB_RESULTS", str(folder))
    monkeypatch.delenv("LAB_PROFILE", raising=False)
    return folder


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lab_helpers", *args]


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` for a launched CLI: a shell's background job (``cmd &``, nohup) starts with SIGINT ignored,
    and a child inherits that; a test of Ctrl-C gives the launcher the default handler a terminal would."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
