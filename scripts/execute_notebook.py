"""Execute one notebook headless, as a student runs it top to bottom, and write the executed copy.

    python scripts/execute_notebook.py notebooks/01_single_gpu.ipynb OUT/01_single_gpu.ipynb

Why: scripts/gpu-chunk.sh's `notebooks` chunk ships what a GPU node printed and drew, so that a student without
a GPU can open exactly that. nbclient (what nbval and `jupyter nbconvert --execute` use) runs the cells in one
kernel; the copy is written whatever happens: a failing cell (its traceback is in the copy, and one line here),
or the chunk's deadline (SIGINT: the cells run so far). Written beside the target, then renamed, so a kill never
leaves half a file. Exit status: 0 every cell ran, 1 a cell failed, 130 interrupted, 2 bad input.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].endswith(".ipynb"):
        print("usage: python scripts/execute_notebook.py NOTEBOOK.ipynb EXECUTED_COPY.ipynb", file=sys.stderr)
        return 2
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    source, dest = Path(argv[0]), Path(argv[1])
    try:
        notebook = nbformat.read(source, as_version=4)
    except (OSError, ValueError) as exc:
        print(f"execute_notebook: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    kernel = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    client = NotebookClient(notebook, timeout=None, kernel_name=kernel,
                            resources={"metadata": {"path": str(source.parent.resolve())}})  # fmt: skip
    code, started = 0, time.monotonic()
    try:
        client.execute()
    except CellExecutionError as exc:
        code = 1
        lines = [line for line in str(exc).splitlines() if line.strip()]
        print(f"execute_notebook: {source.name}: a cell failed: {lines[-1] if lines else exc!r}", file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
        print(f"execute_notebook: {source.name}: interrupted; the cells run so far are kept", file=sys.stderr)
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
