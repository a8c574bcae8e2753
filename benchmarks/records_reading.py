"""How long `python -m lab_helpers results` takes over 5,000 and 20,000 records (issue 45: under 4 s of CPU for
5,000, and linear). CPU time of the child, not wall time, so a busy machine does not decide it; best of two.

    .venv/bin/python benchmarks/records_reading.py > benchmarks/records_reading.out.txt
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab_helpers.record.records import read_records  # noqa: E402


def cpu_seconds(env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "lab_helpers", "results"], stdout=subprocess.DEVNULL, check=True,
                   timeout=300, cwd=REPO, env=env)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    shipped = read_records(REPO / "reference_results" / "ci-cpu.jsonl")
    took = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (5000, 20000):
            folder = Path(tmp) / str(count)
            folder.mkdir()
            with open(folder / "runs.jsonl", "w") as fh:
                for i in range(count):
                    fh.write(json.dumps({**shipped[i % len(shipped)], "run_id": f"r{i}", "timeline_path": None}) + "\n")
            env = {**os.environ, "LAB_RESULTS": str(folder), "LAB_PROFILE": "ci"}
            took[count] = min(cpu_seconds(env) for _ in range(2))
            print(f"{count:>6} records: {took[count]:.2f} s of CPU (best of 2)")
    print(f"20,000 / 5,000: x{took[20000] / took[5000]:.2f} (linear: at most x5); 5,000 under 4 s: "
          f"{'yes' if took[5000] < 4 else 'NO'}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
