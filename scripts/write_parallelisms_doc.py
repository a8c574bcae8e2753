"""Write docs/parallelisms.md's table from the lab's arithmetic (``lab_helpers.planning.parallelisms``).

    python scripts/write_parallelisms_doc.py [--check]

Why: the page's figures (the 7B's model states per GPU under each parallelism) are computed, never typed; this
rewrites the block between the page's markers with ``parallelisms.doc_block()``. ``--check`` only says whether the
page is current (exit 1 if not); tests/test_parallelisms.py checks the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "parallelisms.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is current")
    args = parser.parse_args(argv)
    from lab_helpers.planning.parallelisms import with_doc_block

    text = PAGE.read_text(encoding="utf-8")
    current = with_doc_block(text)
    if args.check:
        print(f"{PAGE.relative_to(ROOT)}: {'current' if current == text else 'out of date: run this script'}")
        return 0 if current == text else 1
    PAGE.write_text(current, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
