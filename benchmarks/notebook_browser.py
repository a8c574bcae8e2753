"""The student's path in a real browser: JupyterLab from scripts/start-notebooks.sh, driven in Debian's chromium.

Why: the what-if explorer of notebook 04 had never been seen working. The shipped screenshots
were of saved notebooks opened without a kernel, so 04's widgets showed as their text form
(``interactive(children=(Dropdown(...``) and the kernel as "Connecting". Here a live kernel runs each notebook
the way a student does it, through JupyterLab's own menus, and the page is read back:

  04  Run > Run All Cells; every code cell gets its execution number; the explorer's controls are drawn as
      widgets (no ``interactive(children=`` text anywhere); Run answers; the micro batch is changed in its box,
      Run pressed again, and the answer's text changes (and its figure is redrawn).
  03  Run > Run All Cells; every code cell numbered; its figures are <img> elements of the outputs, loaded.
  01  the cells down to the first experiment's run cell (``baseline``): Run All Above Selected Cell, then Run
      Selected Cell; its progress bar (tqdm's widget) is seen while the cell runs, and the run's table after.

Screenshots of 04 and 03 (and of 01's run cell) are taken with the live kernel. The notebooks in notebooks/ are
opened as they are and never written: autosave is off for this JupyterLab, and every request that would write
under /api/contents (a save, a checkpoint) is refused by the browser before it leaves (counted and printed).

    python benchmarks/notebook_browser.py [--screenshots DIR]    (docs/screenshots: the shipped ones)

Needs: the .venv with the [notebooks] extra and playwright (the [dev] extra), and a chromium
(``apt-get install -y chromium``; $LAB_CHROMIUM names another). Playwright's own browser download is not used.
Runs on the ci profile unless LAB_PROFILE says otherwise; a private results folder and run lock are made unless
LAB_RESULTS / LAB_RUN_LOCK are set. Prints one line per check; exits 1 at the first failed one. JupyterLab (its
process group, its kernels) and chromium are always stopped, and any process of theirs still alive is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START = REPO / "scripts" / "start-notebooks.sh"
NOTEBOOKS = REPO / "notebooks"

# This machine is slow and shared: generous limits, every one a wait on the page, never a sleep.
SERVER_START_S = 300
PAGE_S = 180  # a page element to appear, a kernel to start
RUN_ALL_S = {"04_what_if": 900, "03_compare": 1500, "01_single_gpu": 1500}
ANSWER_S = 300  # one explorer answer (seconds on an idle machine)
VIEWPORT = {"width": 1400, "height": 1600}
MAX_SHOT_HEIGHT = 16000

# The cell of 01 that runs its first experiment, and the explorer's cell of 04 (found by their source).
RUN_CELL_01 = "records = step.run()"
EXPLORER_CELL_04 = "what_if.widgets("
WIDGET_TEXT_FORM = "interactive(children="

# JupyterLab's settings for this server only: no news popup, every cell in the page (windowing off, so a
# selector finds a cell that is off screen), and no autosave (notebooks/ is never written).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


class CheckFailed(Exception):
    """One check did not hold: the message says what the page showed instead."""


def shown(path: Path) -> str:
    """A path as the reader of the output knows it: inside the repository, relative to it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def say(line: str) -> None:
    print(line, flush=True)


def check(ok: bool, what: str, otherwise: str = "") -> None:
    if not ok:
        raise CheckFailed(f"{what}: {otherwise}" if otherwise else what)
    say(f"ok    {what}")


def find_chromium() -> str | None:
    """$LAB_CHROMIUM, else Debian's chromium on PATH."""
    named = os.environ.get("LAB_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why this cannot run here (None: it can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]': the [dev] extra pins it)"
    if find_chromium() is None:
        return "no chromium (apt-get install -y chromium, or LAB_CHROMIUM=/path/to/chromium)"
    if not (REPO / ".venv" / "bin" / "jupyter-lab").exists() and not os.environ.get("LAB_VENV"):
        return "the .venv has no JupyterLab (the [notebooks] extra)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def code_cells(notebook: str) -> list[str]:
    """The sources of a notebook's code cells, in order (as saved in notebooks/)."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def cell_index(notebook: str, starts: str) -> int:
    """The index among all cells (code and markdown: the page's order) of the first code cell starting so."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "".join(cell["source"]).lstrip().startswith(starts):
            return i
    raise CheckFailed(f"{notebook} has no code cell starting with {starts!r}")


# ------------------------------------------------------------------------------------------------ the server


class Lab:
    """scripts/start-notebooks.sh in its own process group, as a student starts it (token file, port, log)."""

    def __init__(self, scratch: Path, env: dict[str, str]) -> None:
        self.scratch = scratch
        self.port = free_port()
        self.token_file = scratch / "token"
        settings = scratch / "settings"
        for name, values in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(values))
        self.env = {
            **env,
            "LAB_NOTEBOOK_PORT": str(self.port),
            "LAB_TOKEN_FILE": str(self.token_file),
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(scratch / "workspaces"),
            "JUPYTER_RUNTIME_DIR": str(scratch / "runtime"),
        }
        self.env.pop("JUPYTER_TOKEN", None)
        self.out = scratch / "start-notebooks.out"
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> str:
        with open(self.out, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", str(START), "--ssh-host", "localhost"],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stopped as a whole, whatever happens here
            )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace")
            if match := re.search(r"(http://127\.0\.0\.1:\d+)/lab/tree/notebooks\?token=(\w+)", text):
                token = self.token_file.read_text().strip()
                check(match.group(2) == token, "start-notebooks.sh printed the URL with the token of its token file")
                self.url = match.group(1)
                self.token = token
                self.printed = match.group(0)  # what a student opens: the file browser at notebooks/
                return self.url
            if self.process.poll() is not None:
                raise CheckFailed(
                    f"start-notebooks.sh ended (exit {self.process.returncode}) before it printed a URL:\n{text}"
                )
            time.sleep(0.5)  # polling a file the script writes: nothing to wait on in a page yet
        raise CheckFailed(f"start-notebooks.sh printed no URL within {SERVER_START_S}s")

    def stop(self) -> list[str]:
        """Ctrl-C's path (the script's trap ends JupyterLab, which shuts its kernels down), then the group and
        every process it had, by id, killed if alive. Returns what had to be killed."""
        import psutil

        if self.process is None:
            return []
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group: the script and JupyterLab
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=30)
        return reap(family)  # a kernel, or a child of one, that outlived the server


def reap(family: list) -> list[str]:
    """Wait a little for these processes (psutil.Process, listed while they ran) to end; kill, by id, any
    still alive. Returns what had to be killed."""
    import psutil

    _, alive = psutil.wait_procs(family, timeout=30)
    killed = []
    for proc in alive:
        try:
            killed.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=30)
    return killed


# ------------------------------------------------------------------------------------------------ the page

ACTIVE = ".jp-NotebookPanel:not(.lm-mod-hidden)"

PROMPTS_JS = f"""() => [...document.querySelectorAll('{ACTIVE} .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.innerText.replace(/\u00a0/g, ' ').trim())"""

KERNEL_JS = f"""() => {{
    const el = document.querySelector('{ACTIVE} .jp-Notebook-ExecutionIndicator');
    return el ? el.dataset.status : null;
}}"""


def kernel_state(page, lab: Lab, path: str) -> str | None:
    """The execution state of the kernel of ``path``'s session, as the server tells it (None: no session yet)."""
    response = page.request.get(f"{lab.url}/api/sessions?token={lab.token}")
    if not response.ok:
        return None
    for session in response.json():
        if session.get("path") == path and session.get("kernel"):
            return session["kernel"].get("execution_state")
    return None


def wait_for_kernel(page, lab: Lab, path: str) -> str | None:
    """Wait until the server runs an idle kernel for ``path``. On a slow machine JupyterLab may open the notebook
    before it has the kernel list and ask "Select Kernel" with the notebook's own kernel preselected: answered
    with Select, as a student would (returns the dialog's title then)."""
    asked = None
    dialog = page.locator(".jp-Dialog")
    deadline = time.monotonic() + PAGE_S
    while time.monotonic() < deadline:
        if dialog.count() and asked is None:
            asked = dialog.locator(".jp-Dialog-header").inner_text().strip()
            if asked != "Select Kernel":
                raise CheckFailed(f"{path}: JupyterLab asked {asked!r}: {dialog.inner_text()[:300]}")
            dialog.locator("button.jp-mod-accept").click()
            dialog.wait_for(state="detached")
        if kernel_state(page, lab, path) == "idle" and not dialog.count():
            page.wait_for_function(f"() => ({KERNEL_JS})() === 'idle'")
            return asked
        page.wait_for_timeout(1000)  # the server's answer changes without any sign in the page to wait on
    raise CheckFailed(f"{path}: no idle kernel within {PAGE_S} s (state {kernel_state(page, lab, path)})")


@contextmanager
def notebook_page(browser, lab: Lab, notebook: str, refused: list[str], shots: Path) -> Iterator:
    """A page of its own (its own workspace) with ``notebook`` open and its kernel idle."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(PAGE_S * 1000)

    def guard(route) -> None:  # the browser never writes notebooks/, nor a checkpoint beside it
        request = route.request
        where = request.url.split("?")[0].split("/api/contents/", 1)[-1]
        if request.method == "GET" and where.endswith("/checkpoints"):
            route.fulfill(status=200, content_type="application/json", body="[]")  # listing one makes the folder
        elif request.method != "GET":  # a save (PUT), a rename (PATCH), a delete, a new checkpoint or file (POST)
            refused.append(f"{request.method} {where}")
            route.fulfill(status=403, content_type="application/json", body='{"message": "read-only (browser check)"}')
        else:
            route.continue_()

    context.route(re.compile(r".*/api/contents/.*"), guard)
    page = context.new_page()
    try:
        started = time.monotonic()
        page.goto(f"{lab.printed}&reset")  # the printed URL; reset: no layout restored from the page before
        name = page.locator(".jp-DirListing-itemText").get_by_text(f"{notebook}.ipynb", exact=True)
        name.dblclick()  # the student's double-click in the file browser
        page.wait_for_selector(f"{ACTIVE} .jp-Cell")
        check(
            page.locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel", has_text=f"{notebook}.ipynb").count()
            >= 1,
            f"{notebook}: opened by a double-click in the file browser of the printed URL",
        )
        asked = wait_for_kernel(page, lab, f"notebooks/{notebook}.ipynb")
        check(
            page.locator(f"{ACTIVE} .jp-Cell").count() > 0,
            f"{notebook}: its kernel started and idle ({time.monotonic() - started:.0f} s after the page opened)"
            + (f"; JupyterLab asked {asked!r} first, answered with its preselected kernel" if asked else ""),
        )
        yield page
    except Exception:
        with suppress(Exception):  # what the page showed when a check failed, for the reader of the failure
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / f"failed-{notebook}.png"))
            say(f"      the page at the failure: {shots / f'failed-{notebook}.png'}")
        raise
    finally:
        context.close()  # no beforeunload: the unsaved outputs are simply dropped


def menu(page, top: str, item: str) -> None:
    """A click on JupyterLab's menu bar, then on one of its items (what a student does)."""
    page.click(f".lm-MenuBar-itemLabel:text-is('{top}')")
    page.click(f".lm-Menu .lm-Menu-itemLabel:text-is('{item}')")


def wait_for_runs(page, notebook: str, timeout_s: float, expect_numbered: int) -> list[str]:
    """Wait until the run the menu started has begun and ended: a prompt left ``[ ]`` then none ``[*]``, the
    kernel idle. Returns the prompts; a cell that raised is a failure with its error text."""
    started = time.monotonic()
    page.wait_for_function(
        f"() => ({PROMPTS_JS})().some(t => t !== '[ ]:' && t !== '')", timeout=PAGE_S * 1000
    )  # queued or run
    page.wait_for_function(
        f"() => !({PROMPTS_JS})().some(t => t.includes('*')) && ({KERNEL_JS})() === 'idle'",
        timeout=timeout_s * 1000,
        polling=500,
    )
    prompts = page.evaluate(PROMPTS_JS)
    numbered = [p for p in prompts if re.fullmatch(r"\[\d+\]:", p)]
    errors = page.locator(f"{ACTIVE} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    if len(numbered) < expect_numbered:
        raise CheckFailed(
            f"{notebook}: {len(numbered)} of {expect_numbered} code cells ran (prompts {prompts});"
            f" the error: {tracebacks[-1][-1500:] if tracebacks else '(none shown)'}"
        )
    say(f"      {notebook}: {len(numbered)} code cells ran in {time.monotonic() - started:.0f} s")
    return prompts


def compact(path: Path) -> None:
    """A page of text and plots in 256 colours: a third of the bytes, the same to the eye (docs/ ships them)."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    small.save(path, optimize=True)


def screenshot(page, path: Path) -> None:
    """The whole notebook: the window as tall as its content (capped), scrolled to the top."""
    height = page.evaluate(
        f"() => {{ const o = document.querySelector('{ACTIVE} .jp-WindowedPanel-outer');"
        f" return o ? o.scrollHeight : document.body.scrollHeight; }}"
    )
    chrome = page.evaluate(
        f"() => {{ const o = document.querySelector('{ACTIVE} .jp-WindowedPanel-outer');"
        f" return o ? window.innerHeight - o.clientHeight : 0; }}"
    )
    target = min(MAX_SHOT_HEIGHT, int(height + chrome + 20))
    page.set_viewport_size({"width": VIEWPORT["width"], "height": target})
    page.wait_for_function(
        f"(h) => {{ const o = document.querySelector('{ACTIVE} .jp-WindowedPanel-outer');"
        f" return !o || o.clientHeight >= Math.min(o.scrollHeight, h - 200); }}",
        arg=target,
    )
    page.evaluate(
        f"() => {{ const o = document.querySelector('{ACTIVE} .jp-WindowedPanel-outer'); if (o) o.scrollTop = 0; }}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
    compact(path)
    page.set_viewport_size(VIEWPORT)
    say(f"      screenshot {shown(path)} ({VIEWPORT['width']} x {target})")


# ------------------------------------------------------------------------------------------------ the checks


def check_04(page, shots: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    nb = "04_what_if"
    menu(page, "Run", "Run All Cells")
    wait_for_runs(page, nb, RUN_ALL_S[nb], expect_numbered=len(code_cells(nb)))
    explorer = page.locator(f"{ACTIVE} .jp-Cell").nth(cell_index(nb, EXPLORER_CELL_04))
    interact = explorer.locator(".widget-interact")
    interact.wait_for(state="visible")
    labels = [t.strip() for t in interact.locator("label.widget-label, .widget-checkbox label").all_inner_texts()]
    labels = [t for t in labels if t.strip("\u200b")]  # a checkbox's empty label beside its own description
    want = ["model", "method", "precision", "LoRA rank", "micro batch", "seq length", "GPUs", "strategy"]
    check(
        all(w in labels for w in want),
        f"04: the explorer's controls are drawn as widgets: {', '.join(labels)}",
        f"labels {labels}",
    )
    text_form = page.locator(f"{ACTIVE} .jp-OutputArea-output", has_text=WIDGET_TEXT_FORM).count()
    check(text_form == 0, "04: no output shows the widget's text form (interactive(children=...)", f"{text_form} do")

    run = interact.locator("button", has_text=re.compile(r"^\s*Run\s*$"))
    output = interact.locator(".widget-output")
    answer_js = "(el) => el.innerText.includes('predicted peak') ? el.innerText : ''"
    # the answer's text is drawn before its figure: wait for both (a check right after the text raced the <img>)
    answered = "(el) => el.innerText.includes('predicted peak') && el.querySelector('img') !== null"
    run.click()
    with suppress(PlaywrightTimeout):  # a missing figure is reported by the check below, not as a timeout
        page.wait_for_function(answered, arg=output.element_handle(), timeout=ANSWER_S * 1000)
    first = output.evaluate(answer_js)
    check(
        bool(first) and output.locator("img").count() >= 1,
        "04: Run answers with the defaults (text and figure):\n        "
        + "\n        ".join(first.strip().splitlines()[:2]),
    )

    box = (
        interact.locator(".widget-inline-hbox")
        .filter(has=page.locator("label.widget-label", has_text=re.compile(r"^\s*micro batch\s*$")))
        .locator("input")
    )
    before = int(box.input_value())
    after = before // 2 if before > 1 else 2
    box.fill(str(after))
    box.press("Tab")  # the value goes to the kernel on change (Enter or leaving the box), as a student's typing does
    run.click()
    with suppress(PlaywrightTimeout):
        page.wait_for_function(
            "([el, old]) => el.innerText.includes('predicted peak') && el.innerText !== old"
            " && el.querySelector('img') !== null",
            arg=[output.element_handle(), first],
            timeout=ANSWER_S * 1000,
        )
    second = output.evaluate(answer_js)
    check(
        second != first and output.locator("img").count() >= 1,
        f"04: micro batch {before} -> {after}, Run: the answer changed:\n        "
        + "\n        ".join(second.strip().splitlines()[:2]),
    )
    shot = shots / f"{nb}.png"
    explorer.scroll_into_view_if_needed()
    screenshot(page, shot)


def check_03(page, shots: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    nb = "03_compare"
    menu(page, "Run", "Run All Cells")
    wait_for_runs(page, nb, RUN_ALL_S[nb], expect_numbered=len(code_cells(nb)))
    images = page.locator(f"{ACTIVE} .jp-OutputArea-output img")
    with suppress(PlaywrightTimeout):  # an <img> decodes after its cell ends; one never loaded fails the check below
        page.wait_for_function(
            "(els) => els.length > 0 && els.every(e => e.complete && e.naturalWidth > 0)",
            arg=images.element_handles(),
            timeout=PAGE_S * 1000,
        )
    sizes = images.evaluate_all("els => els.map(e => [e.naturalWidth, e.naturalHeight])")
    loaded = [s for s in sizes if s[0] > 100 and s[1] > 100]
    check(
        len(loaded) >= 3 and len(loaded) == len(sizes),
        f"03: {len(loaded)} figures drawn as <img> in the outputs, each loaded ({', '.join(f'{w}x{h}' for w, h in loaded)})",
        f"sizes {sizes}",
    )
    done = page.locator(f"{ACTIVE} .jp-OutputArea-output", has_text="experiments compared").all_inner_texts()
    check(
        bool(done), f"03: its check cell printed: {done[0].strip() if done else ''}", "no 'experiments compared' line"
    )
    screenshot(page, shots / f"{nb}.png")


def check_01(page, shots: Path) -> None:
    nb = "01_single_gpu"
    index = cell_index(nb, RUN_CELL_01)
    cell = page.locator(f"{ACTIVE} .jp-Cell").nth(index)
    check(
        RUN_CELL_01 in cell.locator(".jp-InputArea-editor").inner_text(),
        f"01: cell {index} is the first experiment's run cell ({RUN_CELL_01})",
    )
    cell.locator(".jp-InputPrompt").click()
    menu(page, "Run", "Run All Above Selected Cell")
    cells = json.loads((NOTEBOOKS / f"{nb}.ipynb").read_text())["cells"]
    wait_for_runs(page, nb, RUN_ALL_S[nb], expect_numbered=sum(c["cell_type"] == "code" for c in cells[:index]))
    cell.locator(".jp-InputPrompt").click()
    started = time.monotonic()
    menu(page, "Run", "Run Selected Cell and Do not Advance")
    bar = cell.locator(".widget-hprogress")
    bar.wait_for(state="visible", timeout=RUN_ALL_S[nb] * 1000)
    running = cell.locator(".jp-InputPrompt").inner_text().strip()
    live = cell.locator(".jp-OutputArea-output .widget-hbox").first.inner_text().replace("\n", " ").strip()
    check(
        "*" in running,
        f"01: the run's progress bar is drawn while the cell runs ({running} {live})",
        f"the cell had already finished ({running}) when the bar appeared",
    )
    page.wait_for_function(
        "(el) => /\\[\\d+\\]:/.test(el.innerText)",
        arg=cell.locator(".jp-InputPrompt").element_handle(),
        timeout=RUN_ALL_S[nb] * 1000,
        polling=500,
    )
    final = cell.locator(".jp-OutputArea-output .widget-hbox").first.inner_text().replace("\n", " ").strip()
    table = cell.locator(".jp-OutputArea-output table")
    status = table.locator("td").all_inner_texts()[:12] if table.count() else []
    check(
        table.count() >= 1,
        f"01: the run ended in {time.monotonic() - started:.0f} s, bar at: {final}; its table row "
        f"starts: {' | '.join(s.strip() for s in status[:6])}",
        "no table after the run",
    )
    cell.scroll_into_view_if_needed()
    box = cell.bounding_box()
    path = shots / f"{nb}_run.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(path),
        clip={
            "x": 0,
            "y": max(0, box["y"] - 10),
            "width": VIEWPORT["width"],
            "height": min(box["height"] + 20, VIEWPORT["height"]),
        },
    )
    compact(path)
    say(f"      screenshot {shown(path)}")


def run_checks(shots: Path) -> None:
    import psutil
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    scratch = Path(tempfile.mkdtemp(prefix="notebook-browser-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.setdefault("LAB_PROFILE", "ci")
    env.setdefault("LAB_RESULTS", str(scratch / "results"))
    env.setdefault("LAB_RUN_LOCK", str(scratch / "run.lock"))
    say(f"# profile {env['LAB_PROFILE']}; results {env['LAB_RESULTS']}; chromium {chromium}")
    lab = Lab(scratch, env)
    refused: list[str] = []
    killed: list[str] = []
    browser_family: list = []
    try:
        lab.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-crash-reporter"],
            )
            try:
                server = psutil.Process(lab.process.pid)
                labs = {server.pid} | {proc.pid for proc in server.children(recursive=True)}
                browser_family = [  # Playwright's driver and chromium's processes: ours, not JupyterLab's
                    proc for proc in psutil.Process().children(recursive=True) if proc.pid not in labs
                ]
                say(f"# chromium {browser.version}, JupyterLab at {lab.url} (port {lab.port})")
                with notebook_page(browser, lab, "04_what_if", refused, shots) as page:
                    check_04(page, shots)
                with notebook_page(browser, lab, "03_compare", refused, shots) as page:
                    check_03(page, shots)
                with notebook_page(browser, lab, "01_single_gpu", refused, shots) as page:
                    check_01(page, shots)
            finally:
                browser.close()
        check(
            True,
            f"notebooks/ never written by the browser ({len(refused)} write requests refused: "
            f"{', '.join(sorted(set(refused))) or 'none'})",
        )
    finally:
        stray = reap(browser_family)
        killed = lab.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    check(not stray, f"chromium closed: none of its {len(browser_family)} processes left", f"killed: {stray}")
    check(not killed, "JupyterLab stopped with its kernels; no process of it left", f"killed: {killed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--screenshots", type=Path, default=None, help="where the screenshots go (default: a temporary folder, removed)"
    )
    args = parser.parse_args(argv)
    # SIGTERM (a test's time limit, a CI job cancelled) ends it through the finally blocks: chromium closed,
    # JupyterLab stopped with its kernels.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = missing()
    if why:
        print(f"notebook_browser: cannot run: {why}", file=sys.stderr)
        return 2
    keep = args.screenshots
    shots = keep.resolve() if keep else Path(tempfile.mkdtemp(prefix="notebook-shots-"))
    started = time.monotonic()
    from playwright.sync_api import Error as PlaywrightError

    failed = False
    try:
        run_checks(shots)
    except (CheckFailed, PlaywrightError) as err:
        failed = True
        print(f"FAIL  {err}", flush=True)
        if keep is None:
            print(f"      (the screenshots, the failed page's among them, kept in {shots})", flush=True)
        return 1
    finally:
        if keep is None and not failed:  # also when a signal ends it
            shutil.rmtree(shots, ignore_errors=True)
    say(f"# all checks held in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
