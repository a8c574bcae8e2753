"""One pinned set of versions everywhere, inside what litgpt supports.

- pyproject's extras that litgpt also names (bitsandbytes, datasets) stay inside litgpt's own ranges, read from
  the installed litgpt's metadata, so a litgpt upgrade that narrows them fails here (``bitsandbytes>=0.45``
  resolved to 0.50.x, which litgpt 0.5.13 excludes).
- the Docker image installs scripts/constraints.txt's torch, from the index of a CUDA build that torch version
  ships, on a base image of the same CUDA, and installs the lab under the same constraints (it used to get
  torch 2.11 from the cu128 index while CI used 2.13).
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "provisioning" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]

# The CUDA builds each torch release ships (PyTorch's RELEASE.md, "Release Compatibility Matrix": 2.13 has
# stable CUDA 12.6 and 13.0 and experimental 13.2; cu128 stopped at 2.11). A torch bump must add its row.
TORCH_CUDA_BUILDS = {"2.13": ("12.6", "13.0", "13.2")}


def pins() -> dict[str, str]:
    found = {}
    for line in (REPO / "scripts" / "constraints.txt").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            req = Requirement(text)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt pins exact versions: {text}"
            found[canonicalize_name(req.name)] = spec.version
    return found


def litgpt_extra_ranges() -> dict[str, SpecifierSet]:
    """litgpt's ``extra`` requirements on Linux, by package name (from the installed litgpt's METADATA)."""
    env = {"sys_platform": "linux", "extra": "extra"}
    ranges = {}
    for text in requires("litgpt") or []:
        req = Requirement(text)
        if req.marker is not None and "extra" in str(req.marker) and req.marker.evaluate(env):
            ranges[canonicalize_name(req.name)] = req.specifier
    return ranges


def bounds(spec: SpecifierSet) -> tuple[Version | None, Version | None]:
    """(lowest allowed lower bound, highest upper bound) of a range of >=, > , <, <= specifiers."""
    lower = [Version(s.version) for s in spec if s.operator in (">=", ">")]
    upper = [Version(s.version) for s in spec if s.operator in ("<", "<=")]
    return (max(lower) if lower else None, min(upper) if upper else None)


def test_litgpt_version_is_the_pinned_one() -> None:
    assert version("litgpt") == pins()["litgpt"], "the venv's litgpt is not scripts/constraints.txt's"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_our_extras_stay_inside_litgpts_ranges(extra: str) -> None:
    theirs = litgpt_extra_ranges()
    assert {"bitsandbytes", "datasets"} <= set(theirs), theirs  # the metadata we read is what we think it is
    for text in EXTRAS[extra]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name not in theirs:
            continue
        our_low, our_high = bounds(req.specifier)
        their_low, their_high = bounds(theirs[name])
        if their_low is not None:
            assert our_low is not None and our_low >= their_low, f"[{extra}] {req}: litgpt needs {theirs[name]}"
        if their_high is not None:
            assert our_high is not None and our_high <= their_high, f"[{extra}] {req}: litgpt needs {theirs[name]}"
        if name in pins():
            assert theirs[name].contains(pins()[name]), f"constraints.txt {name}=={pins()[name]} vs {theirs[name]}"
            assert req.specifier.contains(pins()[name]), f"constraints.txt {name}=={pins()[name]} vs {req}"


def test_gpu_extra_is_data_multi_and_qlora() -> None:
    """The wheelhouse installs [data,multi] without bitsandbytes and [gpu] with it: the same requirements."""
    from lab_helpers.assets.wheel_plan import extra_requirements

    assert EXTRAS["gpu"] == ["lab_helpers[data,multi,qlora]"]
    assert sorted(extra_requirements(PYPROJECT, "gpu")) == sorted(EXTRAS["data"] + EXTRAS["multi"] + EXTRAS["qlora"])


def test_each_requirement_is_pinned_in_one_extra() -> None:
    """An extra that needs another's packages names that extra (``lab_helpers[multi]``) instead of repeating it."""
    seen: dict[str, str] = {}
    for extra, texts in EXTRAS.items():
        for text in texts:
            name = canonicalize_name(Requirement(text).name)
            if name == canonicalize_name(PYPROJECT["project"]["name"]):
                continue
            assert name not in seen, f"{name} is in both [{seen[name]}] and [{extra}]: name the extra instead"
            seen[name] = extra


def dockerfile_args() -> dict[str, str]:
    args = {}
    for match in re.finditer(r"^ARG (\w+)=(.+)$", DOCKERFILE.read_text(), re.M):
        args[match.group(1)] = match.group(2).strip().strip('"')
    return args


def dockerfile_runs() -> list[str]:
    """Each RUN instruction as one line (continuations joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [line[4:] for line in text.splitlines() if line.startswith("RUN ")]


def cuda_of_image(image: str) -> str:
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-[\w.-]+", image)
    assert match, f"not an nvidia/cuda image tag: {image}"
    return f"{match.group(1)}.{match.group(2)}"


def test_docker_torch_is_the_pinned_torch() -> None:
    assert dockerfile_args()["TORCH_SPEC"] == f"torch=={pins()['torch']}"


def test_docker_base_cuda_matches_the_torch_index_and_a_build_torch_ships() -> None:
    args = dockerfile_args()
    cuda = cuda_of_image(args["CUDA_IMAGE"])
    assert args["TORCH_INDEX_URL"].rstrip("/").endswith("/cu" + cuda.replace(".", "")), (args, cuda)
    torch_minor = ".".join(pins()["torch"].split(".")[:2])
    assert torch_minor in TORCH_CUDA_BUILDS, f"add torch {torch_minor}'s CUDA builds to TORCH_CUDA_BUILDS"
    assert cuda in TORCH_CUDA_BUILDS[torch_minor], f"torch {torch_minor} ships no CUDA {cuda} build"


def test_the_gpu_check_image_has_the_lab_images_cuda() -> None:
    """provision-node.sh's GPU check should prove the driver can run the lab image's CUDA, no newer one."""
    text = (REPO / "provisioning" / "provision-node.sh").read_text()
    (check,) = re.findall(r"^CHECK_IMAGE=(\S+)$", text, re.M)
    assert cuda_of_image(check) == cuda_of_image(dockerfile_args()["CUDA_IMAGE"])


def test_docker_installs_jupyter_through_the_notebooks_extra() -> None:
    """One list of what opening the notebooks needs: the image installs the [notebooks] extra that run-lab.sh
    installs outside Docker, and names none of its packages again (a second list would drift from the first)."""
    lab_installs = [run for run in dockerfile_runs() if "pip install" in run and '".[' in run]
    extras = {e for run in lab_installs for e in re.findall(r'"\.\[([\w,]+)\]"', run)[0].split(",")}
    assert "notebooks" in extras, lab_installs
    notebook_packages = {canonicalize_name(Requirement(r).name) for r in EXTRAS["notebooks"]} | {"ipywidgets"}
    named = {canonicalize_name(Requirement(word).name) for run in lab_installs for word in shlex.split(run)
             if re.match(r"^[A-Za-z][\w.-]*[<>=!~]", word)}  # fmt: skip
    assert not named & notebook_packages, named & notebook_packages
    assert "ipywidgets" in " ".join(PYPROJECT["project"]["dependencies"])  # the progress bar: a core dependency


def test_docker_installs_the_lab_under_the_constraints() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^COPY scripts/constraints\.txt \S+$", text, re.M)
    ignore = (REPO / "provisioning" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!scripts/constraints.txt" in ignore, "the build context must carry the constraints file"
    lab_installs = [run for run in dockerfile_runs() if "pip install" in run and '".[' in run]
    assert lab_installs, "no RUN installs the lab"
    for run in lab_installs:
        words = shlex.split(run)
        assert "-c" in words and words[words.index("-c") + 1].endswith("scripts/constraints.txt"), run
