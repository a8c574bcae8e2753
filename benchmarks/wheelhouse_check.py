"""End-to-end check of the offline-node route: build the wheelhouse here, install it with no network into a
fresh venv over an existing torch, and run one real experiment from that venv.

1. ``python -m lab_helpers wheelhouse --python X.Y`` (this machine, with PyPI) into WORK/wheels, with the base
   interpreter's torch version as the node's torch.
2. ``git clone`` of this repository's HEAD into WORK/lab (a fresh checkout, as on the node).
3. Inside a network namespace with no network at all (``unshare -n``; root) and with no pip configuration
   (this machine's own find-links and indexes must not help): ``scripts/setup-env.sh`` with
   ``LAB_WHEELHOUSE=WORK/wheels LAB_BASE_PYTHON=<torch python>``, i.e. ``pip install --no-index``.
4. Still offline, from that venv: ``prepare --profile ci`` and ``run small-batch --profile ci``.

The torch python stands for the node's preinstalled torch: an interpreter of the target Python version that
can import torch (on an offline GPU node, e.g. ``/opt/torch/.venv/bin/python3``). It downloads (step 1), so it
is not part of the test run; its output is committed as wheelhouse_check.out.txt.

Usage: python benchmarks/wheelhouse_check.py --python 3.12 --torch-python /path/to/python3.12-with-torch
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"^wheelhouse: (\[\d+/\d+\]|resolving \()")
PROBE = (
    "import json, sys, torch, importlib.metadata as m;"
    "hub = [d.version for d in m.distributions() if d.metadata['Name'].lower().replace('_', '-') == 'huggingface-hub'];"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'torch': torch.__version__, 'cuda': torch.version.cuda,"
    " 'huggingface_hub': (hub or [None])[0], 'packages': len(list(m.distributions()))}))"
)
NOT_IN_WHEELHOUSE = re.compile(r"^(torch|triton|nvidia_(?!ml_py)\w+|cuda_\w+)-")
VERSIONS = (
    "import json, sys, torch, litgpt, lightning, deepspeed, huggingface_hub, jsonargparse, importlib.metadata as m;"
    "names = ['litgpt', 'lightning', 'deepspeed', 'huggingface_hub', 'jsonargparse', 'datasets', 'psutil'];"
    "print(json.dumps({'python': sys.version.split()[0], 'prefix': sys.prefix, 'torch': torch.__version__,"
    " 'torch_from': torch.__file__, **{n: m.version(n) for n in names}}))"
)


def run(command: list[str], *, env: dict[str, str], cwd: Path, offline: bool, quiet_progress: bool = False,
        show: bool = True, label: str | None = None) -> str:
    """Run, echoing output (progress lines counted, not echoed); raise on failure. Offline: no network at all."""
    if offline:
        command = ["unshare", "-n", *command]
    print(f"$ {label or shlex.join(command)}", flush=True)
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines, hidden = [], 0
    for line in process.stdout:
        lines.append(line)
        if not show or (quiet_progress and PROGRESS.match(line)):
            hidden += 1
            continue
        print(f"  {line.rstrip()}", flush=True)
    if hidden:
        print(f"  ({hidden} lines not shown)")
    if process.wait() != 0:
        raise SystemExit(f"failed ({process.returncode}): {shlex.join(command)}")
    print(f"  [{time.monotonic() - start:.0f} s]", flush=True)
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="the node's Python, e.g. 3.12")
    parser.add_argument("--torch-python", required=True, help="an interpreter of that Python with torch")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    args = parser.parse_args()

    probe = subprocess.run([args.torch_python, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"{args.torch_python} cannot import torch: {probe.stderr.strip().splitlines()[-1:]}")
    base = json.loads(probe.stdout.strip().splitlines()[-1])
    base_python, base_torch = base["python"], base["torch"].split("+")[0]
    if base_python != args.python:
        raise SystemExit(f"--torch-python is Python {base_python}, not {args.python}")
    if shutil.which("unshare") is None:
        raise SystemExit("needs unshare (util-linux) to cut the network for the offline steps")

    work = args.work or Path(tempfile.mkdtemp(prefix="wheelhouse-check-"))
    work.mkdir(parents=True, exist_ok=True)
    wheels, lab, venv = work / "wheels", work / "lab", work / "venv"
    (work / "home").mkdir(exist_ok=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# wheelhouse check: build for CPython {args.python}, install offline over an existing torch, run "
          f"small-batch on the ci profile; lab at {head.strip()}")
    print(f"# the node's python: {args.torch_python}: torch {base['torch']} (CUDA {base['cuda']}), "
          f"huggingface_hub {base['huggingface_hub']}, {base['packages']} packages")

    print("\n## 1. build the wheelhouse (this machine, with PyPI)")
    run([sys.executable, "-m", "lab_helpers", "wheelhouse", "--python", args.python, "--dest", str(wheels),
         "--torch", base_torch], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, offline=False,
        quiet_progress=True)
    manifest = json.loads((wheels / "manifest.json").read_text())
    print(f"  wheels: {len(manifest['wheels'])}, {manifest['size_mib']} MiB; "
          f"torch, triton or CUDA wheels among them: {[w for w in manifest['wheels'] if NOT_IN_WHEELHOUSE.match(w)]}")

    print("\n## 2. a fresh checkout")
    run(["git", "clone", "--quiet", str(ROOT), str(lab)], env=dict(os.environ), cwd=work, offline=False)

    print("\n## 3. install offline (no network, no pip configuration)")
    offline_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "LAB_", "VIRTUAL_ENV"))}
    offline_env.update(PIP_CONFIG_FILE=os.devnull, HF_HUB_OFFLINE="1", PATH="/usr/bin:/bin", HOME=str(work / "home"),
                       LAB_RESULTS=str(work / "results"), LAB_PROFILE="ci")
    setup_env = {**offline_env, "LAB_WHEELHOUSE": str(wheels), "LAB_BASE_PYTHON": args.torch_python,
                 "LAB_VENV": str(venv)}
    run(["bash", "-c", "source scripts/setup-env.sh && python -m pip --version"], env=setup_env, cwd=lab,
        offline=True)
    versions = json.loads(run([str(venv / "bin" / "python"), "-c", VERSIONS], env=offline_env, cwd=lab,
                              offline=True, label="unshare -n venv/bin/python -c '<import them, print versions>'")
                          .strip().splitlines()[-1])
    print(f"  torch from outside the venv: {not versions['torch_from'].startswith(str(venv))}; huggingface_hub "
          f"{versions['huggingface_hub']} in the venv over the node's {base['huggingface_hub']}")

    print("\n## 4. prepare and run small-batch from the new venv (no network)")
    python = str(venv / "bin" / "python")
    run([python, "-m", "lab_helpers", "prepare", "--profile", "ci"], env=offline_env, cwd=lab, offline=True)
    run([python, "-m", "lab_helpers", "run", "small-batch", "--profile", "ci", "--quiet"], env=offline_env,
        cwd=lab, offline=True)
    records = json.loads(run([python, "-m", "lab_helpers", "results", "--format", "json"], env=offline_env,
                             cwd=lab, offline=True, show=False))
    record = [r for r in records if r.get("experiment") == "small-batch"][-1]
    print(f"\nresult: small-batch status={record['status']} train_s={record.get('train_s'):.2f} "
          f"tokens_per_s={record.get('tokens_per_s'):.0f} host_rss_peak_gib={record.get('host_rss_peak_gib'):.2f} "
          f"torch={versions['torch']} python={versions['python']}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
