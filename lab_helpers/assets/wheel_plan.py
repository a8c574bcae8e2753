"""What a wheelhouse holds, decided by pure functions that ``wheelhouse`` runs pip with, so all of it is tested offline.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from lab_helpers.config.experiments import LabConfigError
from lab_helpers.config.paths import read_lab_file

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
CONSTRAINTS = REPO / "scripts" / "constraints.txt"
OPTIONAL_GROUPS = ("qlora", "notebooks")  # what only --with adds (bitsandbytes alone is ~58 MiB)
GROUP_EXTRAS = {"qlora": "qlora", "notebooks": "execute"}
"""``notebooks`` is headless execution (nbclient, ipykernel), what a GPU node needs, not JupyterLab."""
GPU_GROUPS = ("qlora",)  # the optional groups that are part of the gpu extra
NODE_PROVIDES = "torch"  # what the node already has, with its CUDA wheels
DEFAULT_GLIBC = "2.28"  # torch's own wheels need manylinux_2_28, so every node that runs torch has at least it
PLACEHOLDER_LOCAL = "node"  # torch==X+node: the placeholder's version, so only it can satisfy the pin
IMPORTED_WHEN_PRESENT = ("transformers",)
"""Imported by the lab's stack whenever installed, so they must agree with litgpt's caps: transformers 5.17 needs
huggingface_hub>=1.5 and fails at ``import lightning`` beside litgpt's huggingface_hub<1.4."""


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
        args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for tag in self.platform_tags():
            args += ["--platform", tag]
        return args

    def marker_environment(self) -> dict[str, str]:
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
    """This package's own extras named in it (``lab_helpers[data]``) expanded, as pip resolves them."""
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
    """``gpu`` when every optional group is collected, else the extras it is made of less those left out."""
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
    """The build backend too: offline, an editable install's build isolation takes it from the wheelhouse."""
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
    dropped = {canonicalize_name(name) for name in drop}
    pins = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text and canonicalize_name(Requirement(text).name) not in dropped:
            pins.append(text)
    return pins


def pinned_version(constraints: Sequence[str], name: str) -> str:
    for text in constraints:
        req = Requirement(text)
        specs = list(req.specifier)
        if canonicalize_name(req.name) == canonicalize_name(name) and len(specs) == 1 and specs[0].operator == "==":
            return specs[0].version
    raise WheelhouseError(f"scripts/constraints.txt pins no {name}==VERSION; the wheelhouse builds that version")


# ------------------------------------------------------------------------------------------- pip commands


def deepspeed_wheel_command(version: str, dest: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """No ops compiled: a pure py3-none-any wheel whose ops are JIT-built on the node."""
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
    """From metadata alone (``--dry-run``); ``--target`` keeps this interpreter's own packages out of the answer."""
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
    resolved = []
    for item in report.get("install", []):
        meta = item["metadata"]
        if canonicalize_name(meta["name"]) == NODE_PROVIDES:
            continue
        resolved.append(Resolved(meta["name"], meta["version"], tuple(meta.get("requires_dist") or ())))
    return sorted(resolved, key=lambda r: canonicalize_name(r.name))


def caps_of(requires: Iterable[str], target: Target) -> list[Requirement]:
    """What a node's newer preinstalled packages can violate."""
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
    """Stands for the node's own torch while resolving, so pip neither needs nor fetches torch's CUDA wheels."""
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


NODE_LIST_MAX_BYTES = 4 * 2**20  # `pip list --format=freeze` of a well-stocked image (~1,000 packages) is ~30 kB


def read_node_packages(path: Path) -> dict[str, str | None]:
    try:  # the lab's rule for a file it reads: /dev/zero filled 24 GB, a FIFO hung
        text = read_lab_file(path, max_bytes=NODE_LIST_MAX_BYTES).decode("utf-8-sig")  # a byte-order mark is no name
    except OSError as err:
        raise WheelhouseError(f"--node-has {path}: cannot read it ({err.strerror})") from err
    except UnicodeDecodeError as err:
        reason = f"not UTF-8 text ({err.reason}); write it on the node with pip list --format=freeze > FILE"
        raise WheelhouseError(f"--node-has {path}: {reason}") from err
    have: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.split(" @ ", 1)[0].partition("==")  # `name @ file:///...`: a local build
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise WheelhouseError(f"--node-has {path}:{number}: {raw.strip()!r} is no package name or name==version")
        have[canonicalize_name(name.strip())] = version.strip() or None
    if not have:  # a failed `pip list > FILE` leaves it empty, which read as "has nothing" carried every wheel
        raise WheelhouseError(f"--node-has {path} lists no package; give the node's pip list --format=freeze")
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
    """A node's package in another version stays in use when every requirement on it accepts that version and it
    needs nothing itself (its own requirements are unknown here): the GPU image's numpy 2.5.2 serves where the
    resolution picked 2.4.6, 16 MiB not carried."""
    capped = {canonicalize_name(c.name) for c in caps}
    accepted = _specifiers_by_name(resolved, requirements, target) if target is not None else None
    keep = []
    for item in resolved:
        name = canonicalize_name(item.name)
        if name not in node_has or name in capped or not _is_version(node_has[name]):
            keep.append(item)  # a node version pip cannot compare (a distribution's 1.1build1): carried
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


def _is_version(text: str | None) -> bool:
    try:
        return text is None or bool(Version(text))
    except InvalidVersion:
        return False


def _specifiers_by_name(
    resolved: Sequence[Resolved], requirements: Sequence[str], target: Target
) -> defaultdict[str, list]:
    """A requirement under an extra counts only where an applying one asks for that extra, as pip resolved it."""
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
    env = {**target.marker_environment(), "extra": ""}
    return [req for req in map(Requirement, requires) if req.marker is None or req.marker.evaluate(env)]


def node_imported_requirements(node_has: dict[str, str | None] | None) -> list[str]:
    """Unpinned: resolved with the lab's so that they agree."""
    return [name for name in IMPORTED_WHEN_PRESENT if node_has and canonicalize_name(name) in node_has]
