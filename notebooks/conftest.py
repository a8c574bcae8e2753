"""Every nbval execution of a notebook also checks what a student sees: each cell that draws shows an image.

``--nbval-lax`` compares no outputs, so a notebook whose charts came out as ``<Figure size 800x240>`` text passed
CI. After each cell runs, its outputs (kept by nbval as ``item.test_outputs``) go through
tests/notebook_images.py's check, and a drawing cell without an ``image/png`` output fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from notebook_images import missing_image  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    cell = getattr(item, "cell", None)
    outputs = getattr(item, "test_outputs", None)
    if cell is not None and outputs is not None and cell.get("cell_type") == "code":
        problem = missing_image(cell.source, outputs)
        if problem:
            pytest.fail(f"{item.name}: {problem}", pytrace=False)
    return result
