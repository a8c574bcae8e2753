"""``python -m lab_helpers wheelhouse``: every wheel the lab needs on an offline GPU node, collected elsewhere.

Why: many university and HPC GPU nodes have a CUDA torch but no internet. ``pip install`` there fails on the
first missing package, and installing torch again is neither possible nor wanted (it is several GB and the
node's own build matches its driver). So, on a machine with PyPI access, this collects for the node's Python
and manylinux x86_64 the lab's whole dependency closure *except torch and its CUDA libraries*, then
``scripts/setup-env.sh`` installs it there with ``--no-index --find-links DIR`` into a venv that sees the
node's torch (``LAB_WHEELHOUSE=DIR bash scripts/run-lab.sh``).

How, in three pip steps whose command lines are built by the pure functions below (unit-tested offline):
1. DeepSpeed is an sdist; ``DS_BUILD_OPS=0 pip wheel --no-deps`` turns it into a pure ``py3-none-any`` wheel
   (about 2 MB; its ops are JIT-built on the node, as the lab does everywhere).
2. ``pip install --dry-run --report`` resolves the lab's requirements for the target Python and platform
   from metadata alone. torch is stood in for by a metadata-only placeholder wheel of the node's version
   (never saved to the wheelhouse): the real one would drag in its CUDA wheels, and the node has it already.
   litgpt's caps (``huggingface_hub<1.4``, ``jsonargparse[signatures]<=4.41``, ``psutil==7.2.2`` in 0.5.13)
   come with litgpt's own metadata; after resolving they are read back from it and checked, never typed here.
3. ``pip download --no-deps`` fetches exactly the resolved set, which the node installs as it is
   (``pip install --no-index --no-deps``: no resolving there, so the node's torch and its CUDA wheels are
   never re-checked or touched).

bitsandbytes (about 58 MiB) is only collected with ``--with qlora``; ``--cuda 13.0`` keeps only the library that
the node's torch loads (3.5 MiB). ``--node-has FILE`` (the node's
``pip list --format=freeze``, or one name per line) leaves out what the node already has, so that a wheelhouse
for a well-stocked image is a few MiB instead of ~140: kept are the packages whose listed version differs from
the resolution, and every package litgpt caps or pins (a name without a version could break the cap). The wheelhouse also holds
``lab-extras.txt`` (the pip extras it serves) and ``manifest.json`` (target, wheels, litgpt's caps).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from lab_helpers.config.experiments import LabConfigError
from lab_helpers.config.paths import write_lab_file

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
CONSTRAINTS = REPO / "scripts" / "constraints.txt"
OPTIONAL_GROUPS = ("qlora", "notebooks")  # what only --with adds (bitsandbytes alone is ~58 MiB)
GROUP_EXTRAS = {"qlora": "qlora", "notebooks": "execute"}
"""The pyproject extra each ``--with`` group collects: ``notebooks`` is headless execution (nbclient, nbformat,
ipykernel), what a GPU node needs to run the notebooks, not JupyterLab."""
GPU_GROUPS = ("qlora",)  # the optional groups that are part of the gpu extra
LEFT_OUT = {"notebooks": ("debugpy",)}
"""Packages a group's resolution holds that the node does without: ipykernel imports its debugger only if present."""
NODE_PROVIDES = "torch"  # what the node already has, with its CUDA wheels
DEFAULT_GLIBC = "2.28"  # torch's own wheels need manylinux_2_28, so every node that runs torch has at least it
EXTRAS_FILE = "lab-extras.txt"
MANIFEST_FILE = "manifest.json"
PLACEHOLDER_LOCAL = "node"  # torch==X+node: the placeholder's version, so only it can satisfy the pin
IMPORTED_WHEN_PRESENT = ("transformers",)
"""Node packages that the lab's stack imports whenever they are installed (torchmetrics and DeepSpeed import
transformers), so they must agree with litgpt's caps: transformers 5.17 needs huggingface_hub>=1.5 and fails at
``import lightning`` beside litgpt's huggingface_hub<1.4. A node that has one gets a compatible version carried."""


class WheelhouseError(LabConfigError):
    """A wheelhouse cannot be built; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class Target:
    """The node the wheels are for: CPython ``python`` ("3.12") on manylinux x86_64 with glibc >= ``glibc``."""

    python: str
    glibc: str = DEFAULT_GLIBC
    arch: str = "x86_64"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise WheelhouseError(f"--python {self.python!r}: give the node's Python as MAJOR.MINOR, e.g. 3.12")
        if Version(self.python) < Version("3.11"):
            raise WheelhouseError(f"--python {self.python}: the lab needs Python >= 3.11")
        if not re.fullmatch(r"2\.\d{1,2}", self.glibc) or int(self.glibc.split(".")[1]) < 17:
            raise WheelhouseError(f"--glibc {self.glibc!r}: give the node's glibc as 2.N with N >= 17 (ldd --version)")

    def platform_tags(self) -> list[str]:
        """Every manylinux tag a node with this glibc accepts, newest first (pip matches each tag exactly)."""
        minor = int(self.glibc.split(".")[1])
        tags = [f"manylinux_2_{n}_{self.arch}" for n in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}  # PEP 599/571/513 aliases
        return tags + [f"{name}_{self.arch}" for n, name in legacy.items() if n <= minor]

    def pip_args(self) -> list[str]:
        """pip's options that select wheels for this target instead of for the interpreter running pip."""
        args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for tag in self.platform_tags():
            args += ["--platform", tag]
        return args

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values of the node, to evaluate requirements such as ``...; sys_platform == "linux"``."""
        env = dict(default_environment())
        env.update(
            python_version=self.python,
            python_full_version=f"{self.python}.0",
            sys_platform="linux",
            platform_system="Linux",
            platform_machine=self.arch,
            os_name="posix",
            implementation_name="cpython",
            platform_python_implementation="CPython",
        )
        return env


# ----------------------------------------------------------------------------------------- what to collect


def read_pyproject(path: Path = PYPROJECT) -> dict:
    return tomllib.loads(path.read_text())


def extra_requirements(pyproject: dict, extra: str) -> list[str]:
    """The requirements of one extra, with the extras it names of this package itself (``lab_helpers[data]``:
    each pin lives in one extra) replaced by their own requirements, as pip resolves them."""
    project = pyproject["project"]
    own = canonicalize_name(project["name"])
    found: list[str] = []
    for text in project["optional-dependencies"][extra]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) != own:
            found.append(text)
            continue
        for inner in sorted(requirement.extras):
            found += [r for r in extra_requirements(pyproject, inner) if r not in found]
    return found


def lab_extras(pyproject: dict, *, with_groups: Iterable[str] = ()) -> list[str]:
    """The pip extras a node installs from the wheelhouse: ``gpu`` when every optional group is collected,
    else the extras ``gpu`` is made of less the optional groups left out (``data,multi`` without qlora)."""
    optional = pyproject["project"]["optional-dependencies"]
    chosen = set(with_groups)
    unknown = chosen - set(OPTIONAL_GROUPS)
    if unknown:
        raise WheelhouseError(f"--with {','.join(sorted(unknown))}: choose from {', '.join(OPTIONAL_GROUPS)}")
    added = sorted(GROUP_EXTRAS[group] for group in chosen - set(GPU_GROUPS))
    if set(GPU_GROUPS) <= chosen:
        return ["gpu", *added]
    expanded = {extra: extra_requirements(pyproject, extra) for extra in optional}
    gpu = {_name(r) for r in expanded["gpu"]}
    parts = [
        extra
        for extra, reqs in expanded.items()
        if extra not in ("gpu", *GPU_GROUPS) and reqs and {_name(r) for r in reqs} <= gpu
    ]
    left_out = {_name(r) for group in set(GPU_GROUPS) - chosen for r in expanded[GROUP_EXTRAS[group]]}
    covered = {_name(r) for extra in parts for r in expanded[extra]} | left_out
    if covered != gpu:
        raise WheelhouseError(f"pyproject: the gpu extra's {sorted(gpu - covered)} are in no smaller extra")
    return sorted([*parts, *added])


def lab_requirements(pyproject: dict, extras: Sequence[str]) -> list[str]:
    """What the node needs: the core dependencies, those of ``extras``, and the build backend that an
    editable install of the checkout runs (offline, pip's build isolation takes it from the wheelhouse too)."""
    project = pyproject["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += extra_requirements(pyproject, extra)
    requirements += pyproject["build-system"]["requires"]
    unique: dict[str, str] = {}
    for text in requirements:
        unique.setdefault(str(Requirement(text)), text)
    return list(unique)


def read_constraints(path: Path = CONSTRAINTS, *, drop: Iterable[str] = (NODE_PROVIDES,)) -> list[str]:
    """The repository's pins, one ``name==version`` a line, less those of ``drop`` (the node's own torch)."""
    dropped = {canonicalize_name(name) for name in drop}
    pins = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text and canonicalize_name(Requirement(text).name) not in dropped:
            pins.append(text)
    return pins


def pinned_version(constraints: Sequence[str], name: str) -> str:
    """The ``==`` version that the constraints give ``name``; a clear error when there is none."""
    for text in constraints:
        req = Requirement(text)
        specs = list(req.specifier)
        if canonicalize_name(req.name) == canonicalize_name(name) and len(specs) == 1 and specs[0].operator == "==":
            return specs[0].version
    raise WheelhouseError(f"scripts/constraints.txt pins no {name}==VERSION; the wheelhouse builds that version")


# ------------------------------------------------------------------------------------------- pip commands


def deepspeed_wheel_command(version: str, dest: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """``pip wheel`` of DeepSpeed's sdist with no ops compiled: a pure py3-none-any wheel, JIT-built ops on the node.
    Returns the command and the environment overrides."""
    command = [python, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off", "-w", str(dest)]
    return command + [f"deepspeed=={version}"], {"DS_BUILD_OPS": "0"}


def resolve_command(
    target: Target,
    requirements_file: Path,
    constraints_file: Path,
    find_links: Sequence[Path],
    report: Path,
    scratch: Path,
    python: str = sys.executable,
) -> list[str]:
    """Resolve for the node from metadata alone (``--dry-run``), with local wheels (DeepSpeed's, torch's
    placeholder) beside the index. ``--target`` keeps this interpreter's own packages out of the answer."""
    command = [
        python,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--progress-bar",
        "off",
        *target.pip_args(),
    ]
    for folder in find_links:
        command += ["--find-links", str(folder)]
    return command + [
        "--target",
        str(scratch),
        "--report",
        str(report),
        "-c",
        str(constraints_file),
        "-r",
        str(requirements_file),
    ]


def download_command(
    target: Target, pins: Sequence[str], dest: Path, find_links: Sequence[Path], python: str = sys.executable
) -> list[str]:
    """Fetch exactly the resolved pins, nothing more (``--no-deps``), for the node's Python and platform."""
    command = [python, "-m", "pip", "download", "--no-deps", "--progress-bar", "off", *target.pip_args()]
    for folder in find_links:
        command += ["--find-links", str(folder)]
    return command + ["-d", str(dest), *pins]


# ------------------------------------------------------------------------------ the resolution and its caps


@dataclass(frozen=True)
class Resolved:
    name: str
    version: str
    requires: tuple[str, ...]


def parse_report(report: dict) -> list[Resolved]:
    """pip's installation report (``--report``), less the node's own torch placeholder."""
    resolved = []
    for item in report.get("install", []):
        meta = item["metadata"]
        if canonicalize_name(meta["name"]) == NODE_PROVIDES:
            continue
        resolved.append(Resolved(meta["name"], meta["version"], tuple(meta.get("requires_dist") or ())))
    return sorted(resolved, key=lambda r: canonicalize_name(r.name))


def caps_of(requires: Iterable[str], target: Target) -> list[Requirement]:
    """The run-time requirements of one package's metadata that cap or pin a version (``<``, ``<=``, ``==``,
    ``~=``) on this target: what a node's newer preinstalled packages can violate."""
    env = {**target.marker_environment(), "extra": ""}
    caps = []
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if any(spec.operator in ("<", "<=", "==", "~=", "===") for spec in req.specifier):
            caps.append(req)
    return caps


def check_caps(resolved: Sequence[Resolved], owner: str, target: Target) -> list[Requirement]:
    """Every cap of ``owner`` (litgpt) is met by the resolved set, its extras' packages included.
    Returns the caps (for the progress line and the manifest); raises naming the first one broken."""
    by_name = {canonicalize_name(r.name): r for r in resolved}
    if canonicalize_name(owner) not in by_name:
        raise WheelhouseError(f"the resolution holds no {owner}; is it still a dependency in pyproject.toml?")
    caps = caps_of(by_name[canonicalize_name(owner)].requires, target)
    for req in caps:
        got = by_name.get(canonicalize_name(req.name))
        if got is None:
            raise WheelhouseError(f"{owner} needs {req} but the resolution has no {req.name}")
        if not req.specifier.contains(got.version, prereleases=True):
            raise WheelhouseError(f"{owner} needs {req} but the resolution picked {got.name} {got.version}")
    return caps


def placeholder_wheel(folder: Path, version: str) -> Path:
    """A metadata-only wheel ``torch-<version>+node`` that stands for the node's installed torch while resolving,
    so that pip neither needs nor fetches torch's CUDA wheels. It is never downloaded into the wheelhouse."""
    name = "torch"
    full = f"{version}+{PLACEHOLDER_LOCAL}"
    info = f"{name}-{full}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {full}\n"
        "Summary: placeholder for the node's own torch (lab_helpers wheelhouse; never installed)\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: lab_helpers.assets.wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{full}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


# -------------------------------------------------------------------------------------------- the builder


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


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


def read_node_packages(path: Path) -> dict[str, str | None]:
    """What the node has: ``pip list --format=freeze`` lines (``name==version``) or bare names, ``#`` comments.
    Returns {canonical name: version or None}."""
    try:
        text = path.read_text()
    except OSError as err:
        raise WheelhouseError(f"--node-has {path}: cannot read it ({err.strerror})") from err
    have: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.split(" @ ", 1)[0].partition("==")  # `name @ file:///...`: a local build
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise WheelhouseError(f"--node-has {path}:{number}: {raw.strip()!r} is no package name or name==version")
        have[canonicalize_name(name.strip())] = version.strip() or None
    return have


def left_to_collect(
    resolved: Sequence[Resolved],
    node_has: dict[str, str | None],
    caps: Sequence[Requirement],
    *,
    target: Target | None = None,
    requirements: Sequence[str] = (),
    reasons: dict[str, str] | None = None,
) -> list[Resolved]:
    """The resolution less what the node already has in the resolved version (or, unversioned, any version that
    nothing caps): a node's own package stays in use, a differing or capped one is carried.

    Given the ``target``, a node's package in another version stays in use too when every requirement on it (the
    lab's ``requirements`` and each resolved package's metadata, every extra counted) accepts that version, as
    pip would, if the package needs nothing itself (its own requirements in the node's version are unknown here):
    the GPU image's numpy 2.5.2 serves where the resolution picked 2.4.6 (16 MiB not carried). Each
    package carried for a requirement the node's version breaks gets that requirement in ``reasons``."""
    capped = {canonicalize_name(c.name) for c in caps}
    accepted = _specifiers_by_name(resolved, requirements, target) if target is not None else None
    keep = []
    for item in resolved:
        name = canonicalize_name(item.name)
        if name not in node_has or name in capped:
            keep.append(item)
        elif node_has[name] is not None and Version(node_has[name]) != Version(item.version):
            broken = None if accepted is None else next(
                (f"{owner}: {name}{spec}" for owner, spec in accepted[name]
                 if not spec.contains(node_has[name], prereleases=True)), None)  # fmt: skip
            # the node's other version brings its own requirements, which only its metadata (not at hand) knows:
            # so only a package with none in the resolved version (numpy, sentencepiece) is left to the node
            leaf = not requirements_on_target(item.requires, target) if target is not None else False
            if accepted is None or broken is not None or not leaf or name in IMPORTED_WHEN_PRESENT:
                keep.append(item)
                if reasons is not None and broken is not None:
                    reasons[name] = f"the node's {node_has[name]} breaks {broken}"
    return keep


def _specifiers_by_name(
    resolved: Sequence[Resolved], requirements: Sequence[str], target: Target
) -> defaultdict[str, list]:
    """Every (owner, version specifier) on each package from the lab's requirements and the resolved packages'
    metadata that applies on this target: a requirement under an extra counts only where some applying
    requirement asks for that extra (``jsonargparse[signatures]``), as pip resolved it."""
    env = target.marker_environment()
    requires = {canonicalize_name(item.name): (item.name, item.requires) for item in resolved}
    extras: defaultdict[str, set[str]] = defaultdict(set)  # the extras asked for, per package
    while True:
        found: defaultdict[str, list] = defaultdict(list)
        texts = [("the lab", "", t) for t in requirements]
        texts += [(owner, key, t) for key, (owner, reqs) in requires.items() for t in reqs]
        for owner, key, text in texts:
            req = Requirement(text)
            active = {""} | (extras[key] if key else set())
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in active):
                continue
            found[canonicalize_name(req.name)].append((owner, req.specifier, frozenset(req.extras)))
        asked = {name: set().union(*(x for _, _, x in specs)) for name, specs in found.items()}
        if all(asked[name] <= extras[name] for name in asked):
            return defaultdict(list, {name: [(o, spec) for o, spec, _ in specs] for name, specs in found.items()})
        for name, wanted in asked.items():
            extras[name] |= wanted


def requirements_on_target(requires: Iterable[str], target: Target) -> list[Requirement]:
    """The run-time requirements of one package's metadata that apply on this target, extras left out."""
    env = {**target.marker_environment(), "extra": ""}
    return [req for req in map(Requirement, requires) if req.marker is None or req.marker.evaluate(env)]


def node_imported_requirements(node_has: dict[str, str | None] | None) -> list[str]:
    """The IMPORTED_WHEN_PRESENT packages the node has, unpinned: resolved with the lab's so that they agree."""
    return [name for name in IMPORTED_WHEN_PRESENT if node_has and canonicalize_name(name) in node_has]


def bitsandbytes_library(cuda: str) -> str:
    """The file name of bitsandbytes' library for the CUDA ``cuda`` ("13.0"); a one-line error for anything else."""
    if not re.fullmatch(r"\d{2}\.\d", cuda):
        raise WheelhouseError(f"--cuda {cuda!r}: give the node's torch CUDA as MAJOR.MINOR, e.g. 13.0")
    return f"libbitsandbytes_cuda{cuda.replace('.', '')}.so"


def trim_bitsandbytes(wheel: Path, cuda: str) -> tuple[int, int]:
    """Rewrite a bitsandbytes wheel in place with only the CUDA ``cuda`` ("13.0") library and the CPU one.

    Why: the wheel holds one library per CUDA release and ROCm (about 58 MiB); bitsandbytes loads only the one of
    the node's torch (``torch.version.cuda``), 3.5 MiB for CUDA 13.0, so a trimmed wheel fits beside the rest of
    a wheelhouse on a size-limited transfer. RECORD is rewritten to match. Returns (bytes before, bytes after).
    """
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
    if cuda is not None:
        bitsandbytes_library(cuda)  # checked before anything is downloaded
    pyproject = read_pyproject()
    extras = lab_extras(pyproject, with_groups=with_groups)
    requirements = lab_requirements(pyproject, extras) + node_imported_requirements(node_has)
    all_pins = read_constraints(drop=())
    constraints = read_constraints()
    node_torch = torch_version or pinned_version(all_pins, NODE_PROVIDES)
    deepspeed = pinned_version(constraints, "deepspeed")
    for text in requirements:  # checked here: pip would first download the real torch (~500 MB) to say so
        req = Requirement(text)
        if canonicalize_name(req.name) == NODE_PROVIDES and not req.specifier.contains(node_torch, prereleases=True):
            raise WheelhouseError(f"--torch {node_torch}: the lab needs {req}; upgrade the node's torch")
    dest.mkdir(parents=True, exist_ok=True)
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
