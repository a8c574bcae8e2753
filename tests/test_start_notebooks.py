"""scripts/start-notebooks.sh: JupyterLab from the lab's .venv, without Docker, reachable with its token only.

The real script starts the real JupyterLab of the [notebooks] extra (what run-lab.sh installs) on a free port,
and the check is what a student's browser does: HTTP to 127.0.0.1 with the printed URL's token lists the five
notebooks, without the token it is refused, and the server listens on the loopback address only. Ctrl-C (SIGINT
to the script, as a terminal sends it) stops the server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import sigint_as_in_a_terminal

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "start-notebooks.sh"
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def _read_until(process: subprocess.Popen, pattern: str, timeout_s: float) -> tuple[re.Match | None, str]:
    """The script's stdout up to the first line matching ``pattern`` (or its end, or the time limit)."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen += line
        if match := re.search(pattern, line):
            return match, seen
    return None, seen


def test_start_notebooks_serves_the_five_notebooks_on_loopback_with_a_token(tmp_path: Path):
    assert len(NOTEBOOKS) == 5, NOTEBOOKS
    port = _free_port()
    env = {
        **os.environ,
        "LAB_NOTEBOOK_PORT": str(port),
        "LAB_TOKEN_FILE": str(tmp_path / "token"),
        "LAB_RESULTS": str(tmp_path / "results"),
        "HOME": str(tmp_path),  # Jupyter's own runtime and config files stay out of the real home
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    env.pop("JUPYTER_TOKEN", None)
    process = subprocess.Popen(
        ["bash", str(SCRIPT), "--ssh-host", "node.example"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        match, said = _read_until(process, rf"(http://127\.0\.0\.1:{port}/\S*\?token=(\w+))", timeout_s=180)
        assert match, said
        url, token = match.groups()
        assert f"ssh -N -L {port}:127.0.0.1:{port} " in said and "@node.example" in said, said
        assert token == (tmp_path / "token").read_text().strip()
        assert oct((tmp_path / "token").stat().st_mode & 0o777) == "0o600"

        status, body = _get(f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}")
        assert status == 200
        listed = sorted(item["name"] for item in json.loads(body)["content"] if item["type"] == "notebook")
        assert listed == NOTEBOOKS
        assert _get(url)[0] == 200  # the printed URL opens JupyterLab
        assert _get(f"http://127.0.0.1:{port}/api/contents/notebooks")[0] == 403  # no token, no notebooks

        server = [p for p in psutil.Process(process.pid).children(recursive=True) if "jupyter" in " ".join(p.cmdline())]
        assert server, "no JupyterLab process under the script"
        listening = {c.laddr.ip for c in server[0].net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}, listening

        process.send_signal(signal.SIGINT)  # Ctrl-C in the terminal that started it
        assert process.wait(timeout=60) == 130
        assert not server[0].is_running() or server[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if process.poll() is None:
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
            process.kill()
        process.stdout.close()


def test_a_taken_port_is_one_line_not_another_port(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            ["bash", str(SCRIPT), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "LAB_TOKEN_FILE": str(tmp_path / "token"), "LAB_RESULTS": str(tmp_path), "HOME": str(tmp_path)},
        )
    assert result.returncode == 1
    assert "start-notebooks.sh: JupyterLab stopped before it answered" in result.stderr, result.stderr


def test_bad_port_is_one_line():
    result = subprocess.run(["bash", str(SCRIPT), "--port", "http"], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.strip() == "start-notebooks.sh: --port needs a number, not: http"
