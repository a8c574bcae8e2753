"""Execute one notebook headless, as a student runs it top to bottom, and write the executed copy.

    python scripts/execute_notebook.py notebooks/01_single_gpu.ipynb OUT/01_single_gpu.ipynb

Why: scripts/gpu-chunk.sh's `notebooks` chunk ships what a GPU node printed and drew, so that a student without
a GPU can open exactly that. nbclient (what nbval and `jupyter nbconvert --execute` use) runs the cells in one
kernel; the copy is written whatever happens: a failing cell (its traceback is in the copy, and one line here),
or a signal (SIGTERM: the chunk's deadline or the device's limit; SIGINT, SIGHUP): the cell in flight is
interrupted as a student's "interrupt kernel" does (a lab run in it ends and is recorded `interrupted`), no
further cell starts, and the copy holds the cells run so far. A kernel that does not stop within
_KERNEL_GRACE_S of the signal is shut down. Written beside the target, then renamed, so a kill never leaves half
a file. Exit status: 0 every cell ran, 1 a cell failed, 130 interrupted, 2 bad input.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # each ends the execution, the copy written
_KERNEL_GRACE_S = 20.0
"""Seconds from a signal to shutting the kernel down: its cell's interrupt ends a lab run in ~10 s (the runner's
LAB_TERMINATE_GRACE_S, then the record); the chunk's `timeout -k 30` kills this process 30 s after the signal."""


class Ended(Exception):  # noqa: N818 -- what happened, not an error
    """A signal ended the execution: no further cell starts."""


def _raise_ended(signum: int, frame: object) -> None:  # noqa: ARG001 -- a signal handler's signature
    raise Ended(signal.Signals(signum).name)


def _client_class():  # nbclient is imported inside main: bad input is refused without it
    from nbclient import NotebookClient
    from nbclient.util import ensure_async

    class Client(NotebookClient):
        """nbclient's client, its signal handling replaced: nbclient's own shuts the kernel down at once (the cell
        in flight gets no interrupt, a lab run in it no record) and then fails with a traceback."""

        ended_by: str | None = None
        _stopping: asyncio.Task | None = None

        @asynccontextmanager
        async def async_setup_kernel(self, **kwargs):
            async with super().async_setup_kernel(**kwargs):
                loop = asyncio.get_running_loop()
                for signum in _SIGNALS:
                    loop.add_signal_handler(signum, self._on_signal, signum)
                try:
                    yield
                finally:
                    for signum in _SIGNALS:
                        loop.remove_signal_handler(signum)
                    for signum in _SIGNALS:  # until the copy is written (main ends; a second signal cuts nothing)
                        signal.signal(signum, signal.SIG_IGN)
                    if self._stopping is not None:
                        self._stopping.cancel()

        async def async_execute_cell(self, *args, **kwargs):
            if self.ended_by is not None:  # a cell allowed to fail (raises-exception) was the one interrupted
                raise Ended(self.ended_by)
            return await super().async_execute_cell(*args, **kwargs)

        def _on_signal(self, signum: int) -> None:
            if self.ended_by is None:  # a repeat (the chunk's group and its timeout both send SIGTERM) changes nothing
                self.ended_by = signal.Signals(signum).name
                self._stopping = asyncio.ensure_future(self._stop())

        async def _stop(self) -> None:
            if self.km is None:
                return
            await ensure_async(self.km.interrupt_kernel())
            await asyncio.sleep(_KERNEL_GRACE_S)
            if self.km is not None:  # the cell did not end: nbclient then finds the kernel dead
                await ensure_async(self.km.shutdown_kernel(now=True))

    return Client


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].endswith(".ipynb"):
        print("usage: python scripts/execute_notebook.py NOTEBOOK.ipynb EXECUTED_COPY.ipynb", file=sys.stderr)
        return 2
    for signum in _SIGNALS:  # before the kernel runs (and after): nbclient's window has the client's own
        signal.signal(signum, _raise_ended)
    import nbformat
    from nbclient.exceptions import CellExecutionError

    source, dest = Path(argv[0]), Path(argv[1])
    try:
        notebook = nbformat.read(source, as_version=4)
    except (OSError, ValueError) as exc:
        print(f"execute_notebook: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    kernel = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    client = _client_class()(notebook, timeout=None, kernel_name=kernel,
                             resources={"metadata": {"path": str(source.parent.resolve())}})  # fmt: skip
    code, started = 0, time.monotonic()
    try:
        client.execute()
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 -- after a signal, whatever nbclient raised
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        ended_by = client.ended_by or (str(exc) if isinstance(exc, Ended) else None)
        if ended_by is None and getattr(client, "_async_cleanup_kernel_future", None) is not None:
            ended_by = "a signal"  # one that came while the kernel started: nbclient's own handler shut it down
        if ended_by is not None or isinstance(exc, KeyboardInterrupt):
            code = 130
            print(f"execute_notebook: {source.name}: interrupted{f' by {ended_by}' if ended_by else ''}; "
                  "the cells run so far are kept", file=sys.stderr)  # fmt: skip
        elif isinstance(exc, CellExecutionError):
            code = 1
            lines = [line for line in str(exc).splitlines() if line.strip()]
            print(f"execute_notebook: {source.name}: a cell failed: {lines[-1] if lines else exc!r}", file=sys.stderr)
        else:  # the kernel died (out of memory?): said in one line, the copy still written
            code = 1
            print(f"execute_notebook: {source.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        ran = sum(1 for c in notebook.cells if c.cell_type == "code" and c.get("execution_count"))
        total = sum(1 for c in notebook.cells if c.cell_type == "code")
        partial = dest.with_name(f".{dest.name}.part")
        nbformat.write(notebook, partial)
        os.replace(partial, dest)
        print(f"execute_notebook: {source.name}: {ran} of {total} code cells ran in {time.monotonic() - started:.0f} s; "
              f"executed copy {dest}")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
