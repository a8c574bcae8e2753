"""``python -m lab_helpers wheelhouse``: every wheel the lab needs on an offline GPU node, collected elsewhere.

Many GPU nodes have a CUDA torch but no internet, and installing torch again is neither possible nor wanted (the
node's build matches its driver). So this collects the lab's dependency closure *except torch*, for the node's Python
and platform, in three pip steps: DeepSpeed's sdist built into a pure wheel; a ``--dry-run --report`` resolution
against a metadata-only torch placeholder (the real one would drag in its CUDA wheels), with litgpt's caps read back
from its metadata and checked; and ``pip download --no-deps`` of exactly that set, which the node installs with
``--no-index --no-deps``, never touching its torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lab_helpers.assets.wheel_plan import (
    DEFAULT_GLIBC,
    NODE_PROVIDES,
    OPTIONAL_GROUPS,
    PLACEHOLDER_LOCAL,
    Target,
    WheelhouseError,
    check_caps,
    deepspeed_wheel_command,
    download_command,
    lab_extras,
    lab_requirements,
    left_to_collect,
    node_imported_requirements,
    parse_report,
    pinned_version,
    placeholder_wheel,
    read_constraints,
    read_node_packages,
    read_pyproject,
    resolve_command,
)
from lab_helpers.config.paths import describe_os_error, lab_folder, write_lab_file

LEFT_OUT = {"notebooks": ("debugpy",)}
"""Packages a group's resolution holds that the node does without: ipykernel imports its debugger only if present."""
EXTRAS_FILE = "lab-extras.txt"
MANIFEST_FILE = "manifest.json"


def _run(
    command: Sequence[str],
    what: str,
    *,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Run pip, passing selected lines to ``on_line``; on failure raise one line: what failed and pip's reason."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})},
    )
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        tail = [*tail[-40:], line]
        if on_line is not None:
            on_line(line)
    if process.wait() != 0:
        raise WheelhouseError(f"{what} failed: {pip_error(tail)}")


def pip_error(lines: Sequence[str]) -> str:
    """pip's reason in one line: its first ERROR line, with the conflict's causes when it lists them."""
    errors = [t.removeprefix("ERROR: ").strip() for t in lines if t.startswith("ERROR:")]
    errors = [e for e in errors if not e.startswith("ResolutionImpossible")] or errors
    reason = errors[0] if errors else next((t.strip() for t in reversed(lines) if t.strip()), "no output")
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = []
        for line in lines[start:]:
            if not line.startswith("    "):
                break
            causes.append(line.strip())
        reason += " (" + "; ".join(causes) + ")"
    return reason


BITSANDBYTES_CUDA = ("0.49.2", ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0"))
"""The CUDA releases whose library the pinned bitsandbytes' manylinux x86_64 wheel holds (read from that wheel):
another ``--cuda`` was refused only after 39 s and 200 MB of downloads."""


def bitsandbytes_library(cuda: str) -> str:
    if not re.fullmatch(r"\d{2}\.\d", cuda):
        raise WheelhouseError(f"--cuda {cuda!r}: give the node's torch CUDA as MAJOR.MINOR, e.g. 13.0")
    return f"libbitsandbytes_cuda{cuda.replace('.', '')}.so"


def trim_bitsandbytes(wheel: Path, cuda: str) -> tuple[int, int]:
    """The wheel holds a library per CUDA release (about 58 MiB), but bitsandbytes loads only torch's (3.5 MiB for
    CUDA 13.0): trimmed, it fits a size-limited transfer."""
    keep = {bitsandbytes_library(cuda), "libbitsandbytes_cpu.so"}
    with zipfile.ZipFile(wheel) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    libraries = {Path(info.filename).name for info, _ in entries if _is_bitsandbytes_library(info.filename)}
    if not keep <= libraries:
        raise WheelhouseError(
            f"{wheel.name} has no {sorted(keep - libraries)[0]}: no bitsandbytes build for CUDA {cuda}"
        )
    kept = [
        (info, data)
        for info, data in entries
        if not _is_bitsandbytes_library(info.filename) or Path(info.filename).name in keep
    ]
    names = {info.filename for info, _ in kept}
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in kept:
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in data.decode().splitlines() if line.split(",", 1)[0] in names]
                data = ("\n".join(lines) + "\n").encode()
            archive.writestr(info, data)
    tmp.replace(wheel)
    return before, wheel.stat().st_size


def _is_bitsandbytes_library(filename: str) -> bool:
    return Path(filename).name.startswith("libbitsandbytes_")


def build_wheelhouse(
    target: Target,
    dest: Path,
    *,
    with_groups: Iterable[str] = (),
    torch_version: str | None = None,
    node_has: dict[str, str | None] | None = None,
    cuda: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict:
    """Collect the wheels into ``dest`` and write its extras and manifest files; returns the manifest."""
    _dest_folder(dest, create=False)  # before anything is downloaded
    all_pins = read_constraints(drop=())
    if cuda is not None:  # checked before anything is downloaded
        bitsandbytes_library(cuda)
        bitsandbytes, shipped = pinned_version(all_pins, "bitsandbytes"), BITSANDBYTES_CUDA[1]
        if bitsandbytes == BITSANDBYTES_CUDA[0] and cuda not in shipped:
            raise WheelhouseError(f"--cuda {cuda}: bitsandbytes {bitsandbytes} has no library for it (it has CUDA "
                                  f"{', '.join(shipped)}); give the node's torch.version.cuda")  # fmt: skip
    pyproject = read_pyproject()
    extras = lab_extras(pyproject, with_groups=with_groups)
    requirements = lab_requirements(pyproject, extras) + node_imported_requirements(node_has)
    constraints = read_constraints()
    node_torch = torch_version or pinned_version(all_pins, NODE_PROVIDES)
    deepspeed = pinned_version(constraints, "deepspeed")
    for text in requirements:  # checked here: pip would first download the real torch (~500 MB) to say so
        req = Requirement(text)
        if canonicalize_name(req.name) == NODE_PROVIDES and not req.specifier.contains(node_torch, prereleases=True):
            raise WheelhouseError(f"--torch {node_torch}: the lab needs {req}; upgrade the node's torch")
    _dest_folder(dest, create=True)
    stale = [p.name for p in dest.glob("*.whl")]
    if stale:
        raise WheelhouseError(f"{dest} already holds {len(stale)} wheels; give an empty or new --dest")
    echo(
        f"wheelhouse: CPython {target.python}, manylinux (glibc >= {target.glibc}) {target.arch}, "
        f"extras [{','.join(extras)}], the node's own torch {node_torch} left out"
    )

    with tempfile.TemporaryDirectory(prefix="lab-wheelhouse-") as tmp:
        scratch = Path(tmp)
        local = scratch / "local"
        local.mkdir()
        echo(f"wheelhouse: building deepspeed {deepspeed} as a pure wheel (DS_BUILD_OPS=0)")
        command, env = deepspeed_wheel_command(deepspeed, local)
        _run(command, f"building deepspeed {deepspeed}", env=env)
        placeholder_wheel(local, node_torch)

        req_file = scratch / "requirements.txt"
        req_file.write_text("\n".join([*requirements, f"{NODE_PROVIDES}=={node_torch}+{PLACEHOLDER_LOCAL}"]) + "\n")
        con_file = scratch / "constraints.txt"
        con_file.write_text("\n".join(constraints) + "\n")
        report_path = scratch / "report.json"
        echo(f"wheelhouse: resolving {len(requirements)} requirements from metadata (pip --dry-run)")
        seen = 0

        def resolving(line: str) -> None:
            nonlocal seen
            if line.startswith("Collecting "):
                seen += 1
                echo(f"wheelhouse: resolving ({seen}) {line.removeprefix('Collecting ').split(' (')[0]}")

        _run(
            resolve_command(target, req_file, con_file, [local], report_path, scratch / "target"),
            f"resolving for Python {target.python}",
            on_line=resolving,
        )
        resolved = parse_report(json.loads(report_path.read_text()))
        caps = check_caps(resolved, "litgpt", target)
        echo(f"wheelhouse: {len(resolved)} packages; litgpt's caps met: {', '.join(map(str, caps))}")

        if node_has:
            reasons: dict[str, str] = {}
            carried = left_to_collect(
                resolved, node_has, caps, target=target, requirements=requirements, reasons=reasons
            )
            echo(
                f"wheelhouse: the node has {len(resolved) - len(carried)} of them; collecting the other {len(carried)}"
            )
            for name, why in sorted(reasons.items()):
                echo(f"wheelhouse: carrying {name}: {why}")
            resolved = carried
        dropped = {canonicalize_name(name) for group in with_groups for name in LEFT_OUT.get(group, ())}
        if dropped & {canonicalize_name(r.name) for r in resolved}:
            echo(f"wheelhouse: leaving out {', '.join(sorted(dropped))} (ipykernel runs without its debugger)")
            resolved = [r for r in resolved if canonicalize_name(r.name) not in dropped]
        pins = [f"{r.name}=={r.version}" for r in resolved]
        count = 0

        def progress(line: str) -> None:
            nonlocal count
            if line.startswith(("Saved ", "File was already downloaded ")):
                count += 1
                echo(f"wheelhouse: [{count}/{len(pins)}] {Path(line.split()[-1]).name}")

        _run(download_command(target, pins, dest, [local]), "downloading the wheels", on_line=progress)

    for wheel in dest.glob("bitsandbytes-*.whl") if cuda else ():
        before, after = trim_bitsandbytes(wheel, cuda)
        echo(
            f"wheelhouse: {wheel.name}: only the CUDA {cuda} and CPU libraries kept, "
            f"{before / 2**20:.0f} -> {after / 2**20:.1f} MiB"
        )
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    missing = [r.name for r in resolved if not any(_wheel_name(w) == canonicalize_name(r.name) for w in wheels)]
    if missing:
        raise WheelhouseError(f"pip saved no wheel for {', '.join(missing)} in {dest}")
    size_mib = sum((dest / w).stat().st_size for w in wheels) / 2**20
    write_lab_file(dest / EXTRAS_FILE, (",".join(extras) + "\n").encode())  # the lab's rule: never through a link
    manifest = {
        "python": target.python,
        "glibc": target.glibc,
        "arch": target.arch,
        "extras": extras,
        "node_torch": node_torch,
        "litgpt_caps": [str(c) for c in caps],
        "node_has": sorted(node_has) if node_has else None,  # None: a whole wheelhouse
        "bitsandbytes_cuda": cuda,  # None: every CUDA library bitsandbytes ships
        "wheels": wheels,
        "size_mib": round(size_mib, 1),
        "install": f"LAB_WHEELHOUSE={dest} bash scripts/run-lab.sh",
    }
    write_lab_file(dest / MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode())
    echo(f"wheelhouse: {len(wheels)} wheels, {size_mib:.0f} MiB in {dest}")
    echo(f"wheelhouse: on the node, in the checkout: LAB_WHEELHOUSE={dest} bash scripts/run-lab.sh")
    return manifest


def _dest_folder(dest: Path, *, create: bool) -> None:
    """The rule of every folder the lab writes (``paths.lab_folder``): /proc/x or a file there was a traceback."""
    try:
        lab_folder(dest, create=create)
    except OSError as exc:
        raise WheelhouseError(f"--dest {dest}: {describe_os_error(exc)}; give an empty or new folder") from None


def _wheel_name(filename: str) -> str:
    return canonicalize_name(filename.split("-", 1)[0])


# ------------------------------------------------------------------------------------------------- the CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", required=True, metavar="X.Y", help="the node's Python, e.g. 3.12")
    parser.add_argument("--dest", required=True, type=Path, metavar="DIR", help="an empty or new folder")
    parser.add_argument(
        "--with",
        dest="with_groups",
        action="append",
        default=[],
        choices=OPTIONAL_GROUPS,
        help="also collect an optional group: qlora = bitsandbytes (about 58 MiB; --cuda keeps 3.5), notebooks = "
        "what headless execution needs (nbclient, nbformat, ipykernel; no debugger)",
    )
    parser.add_argument(
        "--glibc",
        default=DEFAULT_GLIBC,
        metavar="2.N",
        help=f"the node's glibc (ldd --version); default {DEFAULT_GLIBC}, what torch needs",
    )
    parser.add_argument(
        "--torch",
        dest="torch_version",
        default=None,
        metavar="VERSION",
        help="the node's torch version (default: scripts/constraints.txt's pin)",
    )
    parser.add_argument(
        "--node-has",
        type=Path,
        default=None,
        metavar="FILE",
        help="the node's `pip list --format=freeze`: collect only what it lacks (or has in another "
        "version), install with pip install --no-index --no-deps",
    )
    parser.add_argument(
        "--cuda",
        default=None,
        metavar="X.Y",
        help="the CUDA of the node's torch (torch.version.cuda): with --with qlora, bitsandbytes keeps "
        "only that library (3.5 MiB for 13.0 instead of ~58 MiB)",
    )


def run(args: argparse.Namespace) -> int:
    target = Target(python=args.python, glibc=args.glibc)
    node_has = read_node_packages(args.node_has) if args.node_has else None
    build_wheelhouse(
        target,
        args.dest.resolve(),
        with_groups=args.with_groups,
        torch_version=args.torch_version,
        node_has=node_has,
        cuda=args.cuda,
        echo=lambda line: print(line, flush=True),
    )
    return 0
