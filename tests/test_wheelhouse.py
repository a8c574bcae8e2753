"""The offline wheelhouse's pure parts: what it collects, litgpt's caps read from litgpt's own metadata, and the
pip command lines it builds. No network: building a real wheelhouse downloads ~140 MiB, so that is
benchmarks/wheelhouse_check.py, with its output committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lab_helpers.assets import wheel_plan
from lab_helpers.assets import wheelhouse as wh
from lab_helpers.cli import main

TARGET = wheel_plan.Target(python="3.12")


def test_target_platform_tags_cover_every_older_manylinux() -> None:
    tags = TARGET.platform_tags()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_29_x86_64" not in tags
    for tag in (
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
        "manylinux_2_5_x86_64",
    ):
        assert tag in tags
    assert wheel_plan.Target(python="3.12", glibc="2.35").platform_tags()[0] == "manylinux_2_35_x86_64"
    args = TARGET.pip_args()
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12"]
    assert args.count("--platform") == len(tags)


@pytest.mark.parametrize(
    ("python", "glibc", "message"),
    [("3", "2.28", "MAJOR.MINOR"), ("3.10", "2.28", ">= 3.11"), ("3.12", "2.5", "N >= 17"), ("3.12", "x", "2.N")],
)
def test_bad_targets_are_one_line_errors(python: str, glibc: str, message: str) -> None:
    with pytest.raises(wheel_plan.WheelhouseError, match=message):
        wheel_plan.Target(python=python, glibc=glibc)


def test_extras_leave_bitsandbytes_out_unless_asked() -> None:
    pyproject = wheel_plan.read_pyproject()
    assert wheel_plan.lab_extras(pyproject) == ["data", "multi"]
    assert wheel_plan.lab_extras(pyproject, with_groups=["qlora"]) == ["gpu"]
    assert wheel_plan.lab_extras(pyproject, with_groups=["notebooks"]) == ["data", "execute", "multi"]
    assert wheel_plan.lab_extras(pyproject, with_groups=["qlora", "notebooks"]) == ["gpu", "execute"]
    assert {wheel_plan._name(r) for r in wheel_plan.extra_requirements(pyproject, "execute")} == {"nbclient", "nbformat", "ipykernel"}
    with pytest.raises(wheel_plan.WheelhouseError, match="choose from qlora"):
        wheel_plan.lab_extras(pyproject, with_groups=["flash"])

    names = {Requirement(r).name for r in wheel_plan.lab_requirements(pyproject, ["data", "multi"])}
    assert {"litgpt", "lightning", "datasets", "deepspeed", "setuptools", "torch"} <= names
    assert "bitsandbytes" not in names and "pytest" not in names
    assert any(r.startswith("bitsandbytes") for r in wheel_plan.lab_requirements(pyproject, ["gpu"]))


def test_constraints_leave_the_nodes_torch_alone() -> None:
    pins = wheel_plan.read_constraints()
    assert not [p for p in pins if p.startswith("torch")]
    assert wheel_plan.pinned_version(pins, "deepspeed") and wheel_plan.pinned_version(pins, "litgpt") == "0.5.13"
    assert wheel_plan.pinned_version(wheel_plan.read_constraints(drop=()), "torch")
    with pytest.raises(wheel_plan.WheelhouseError, match="pins no flash-attn"):
        wheel_plan.pinned_version(pins, "flash-attn")


def test_pip_command_lines(tmp_path: Path) -> None:
    command, env = wheel_plan.deepspeed_wheel_command("0.19.8", tmp_path, python="py")
    assert env == {"DS_BUILD_OPS": "0"}
    assert command == [
        "py",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--progress-bar",
        "off",
        "-w",
        str(tmp_path),
        "deepspeed==0.19.8",
    ]

    resolve = wheel_plan.resolve_command(
        TARGET, Path("r.txt"), Path("c.txt"), [Path("local")], Path("rep.json"), Path("scratch"), python="py"
    )
    assert resolve[:5] == ["py", "-m", "pip", "install", "--dry-run"]
    assert "--ignore-installed" in resolve and "--python-version" in resolve
    tail = ["--find-links", "local", "--target", "scratch", "--report", "rep.json", "-c", "c.txt", "-r", "r.txt"]
    assert resolve[-len(tail) :] == tail

    download = wheel_plan.download_command(TARGET, ["a==1", "b==2"], Path("dest"), [Path("local")], python="py")
    assert download[:5] == ["py", "-m", "pip", "download", "--no-deps"]
    assert download[-5:] == ["local", "-d", "dest", "a==1", "b==2"]


def test_litgpts_caps_come_from_its_metadata() -> None:
    """The caps a node's newer packages can break (its huggingface_hub 1.33, say), read from litgpt's METADATA."""
    caps = {str(c.name).lower().replace("_", "-"): c for c in wheel_plan.caps_of(requires("litgpt"), TARGET)}
    assert set(caps) == {"huggingface-hub", "jsonargparse", "psutil"}  # litgpt 0.5.13; torch>=2.7 is no cap
    assert "signatures" in caps["jsonargparse"].extras
    assert not caps["huggingface-hub"].specifier.contains("1.33.0")


def resolved_set(hub_version: str) -> list[wheel_plan.Resolved]:
    return [
        wheel_plan.Resolved("litgpt", "0.5.13", tuple(requires("litgpt"))),
        wheel_plan.Resolved("huggingface_hub", hub_version, ()),
        wheel_plan.Resolved("jsonargparse", "4.41.0", ()),
        wheel_plan.Resolved("psutil", "7.2.2", ()),
    ]


def test_check_caps_names_the_broken_one() -> None:
    assert len(wheel_plan.check_caps(resolved_set("1.3.7"), "litgpt", TARGET)) == 3
    with pytest.raises(wheel_plan.WheelhouseError, match="huggingface-hub.*picked huggingface_hub 1.33.0"):
        wheel_plan.check_caps(resolved_set("1.33.0"), "litgpt", TARGET)
    with pytest.raises(wheel_plan.WheelhouseError, match="no psutil"):
        wheel_plan.check_caps(resolved_set("1.3.7")[:-1], "litgpt", TARGET)


def test_a_node_list_leaves_out_what_the_node_has_but_keeps_litgpts_capped_packages(tmp_path: Path) -> None:
    """A node's `pip list --format=freeze` (a GPU image with lightning, pandas and a huggingface_hub too new for
    litgpt): its own packages are not collected again, a differing version is, and so is everything litgpt caps,
    also when the list gives no version (psutil below)."""
    listing = tmp_path / "node.txt"
    listing.write_text(
        "# the node's image\nlightning==2.6.6\nPandas==2.3.1\nhuggingface-hub==1.33.0\npsutil\n"
        "hjson==3.0.0\nmy_tool @ file:///opt/build/my_tool-1.0-py3-none-any.whl\n"
    )
    have = wheel_plan.read_node_packages(listing)
    assert have == {
        "lightning": "2.6.6",
        "pandas": "2.3.1",
        "huggingface-hub": "1.33.0",
        "psutil": None,
        "hjson": "3.0.0",
        "my-tool": None,
    }
    resolved = [
        *resolved_set("1.3.7"),
        wheel_plan.Resolved("lightning", "2.6.6", ()),
        wheel_plan.Resolved("pandas", "2.3.1", ()),
        wheel_plan.Resolved("hjson", "3.1.0", ()),
        wheel_plan.Resolved("pydantic", "2.12.0", ()),
    ]
    caps = wheel_plan.check_caps(resolved, "litgpt", TARGET)
    kept = {r.name for r in wheel_plan.left_to_collect(resolved, have, caps)}
    assert kept == {"litgpt", "huggingface_hub", "jsonargparse", "psutil", "hjson", "pydantic"}


def test_a_bad_node_list_is_one_line(tmp_path: Path) -> None:
    listing = tmp_path / "node.txt"
    listing.write_text("torch==2.11.0\nthis is not a name\n")
    with pytest.raises(wheel_plan.WheelhouseError, match=r"node.txt:2: 'this is not a name'"):
        wheel_plan.read_node_packages(listing)
    with pytest.raises(wheel_plan.WheelhouseError, match="cannot read it"):
        wheel_plan.read_node_packages(tmp_path / "missing.txt")


def test_a_node_list_in_another_encoding_or_empty_is_one_line(tmp_path: Path) -> None:
    """A byte-order mark (an editor's, PowerShell's) made the first name invalid; UTF-16 (PowerShell's `>`) was a
    UnicodeDecodeError traceback; an empty list (a failed `pip list > FILE`) read as a node with nothing, so every
    wheel was carried."""
    listing = tmp_path / "node.txt"
    listing.write_bytes("torch==2.11.0\r\nnumpy==2.5.2\r\n".encode("utf-8-sig"))
    assert wheel_plan.read_node_packages(listing) == {"torch": "2.11.0", "numpy": "2.5.2"}
    listing.write_bytes("torch==2.11.0\n".encode("utf-16"))
    with pytest.raises(wheel_plan.WheelhouseError, match=r"node.txt: not UTF-8 text .*pip list --format=freeze > FILE"):
        wheel_plan.read_node_packages(listing)
    listing.write_text("# the node's image\n\n")
    with pytest.raises(wheel_plan.WheelhouseError, match="node.txt lists no package"):
        wheel_plan.read_node_packages(listing)


def test_a_node_version_that_is_not_pep_440_is_carried() -> None:
    """A distribution's own version (Ubuntu's distro-info 1.1build1 in pip list) was an InvalidVersion traceback,
    after the minutes of building DeepSpeed and resolving; pip cannot compare it, so the package is carried."""
    resolved = [wheel_plan.Resolved("distro-info", "1.5", ()), wheel_plan.Resolved("numpy", "2.4.6", ())]
    have = {"distro-info": "1.1build1", "numpy": "2.4.6"}
    kept = wheel_plan.left_to_collect(resolved, have, [], target=TARGET)
    assert [r.name for r in kept] == ["distro-info"]


def test_report_drops_the_torch_placeholder() -> None:
    report = {
        "install": [
            {"metadata": {"name": "torch", "version": "2.13.0+node"}},
            {"metadata": {"name": "Hjson", "version": "3.1.0", "requires_dist": None}},
        ]
    }
    assert wheel_plan.parse_report(report) == [wheel_plan.Resolved("Hjson", "3.1.0", ())]


@pytest.mark.slow
def test_placeholder_torch_satisfies_pip_offline(tmp_path: Path) -> None:
    """pip itself (offline, --no-index) takes the placeholder for torch and wants nothing more: no CUDA wheels."""
    wheel = wheel_plan.placeholder_wheel(tmp_path, "2.11.0")
    with zipfile.ZipFile(wheel) as archive:
        assert "Version: 2.11.0+node" in archive.read("torch-2.11.0+node.dist-info/METADATA").decode()
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--find-links",
            str(tmp_path),
            "--target",
            str(tmp_path / "t"),
            "--report",
            str(report),
            "--quiet",
            "torch==2.11.0+node",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    installed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installed == ["torch"]


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wheelhouse", "--python", "3.10", "--dest", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "error: --python 3.10: the lab needs Python >= 3.11"
    (tmp_path / "old-1.0-py3-none-any.whl").write_bytes(b"")
    assert main(["wheelhouse", "--python", "3.12", "--dest", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "already holds 1 wheels" in err and "\n" not in err


def test_pip_errors_become_one_line() -> None:
    """pip's output (pip 26.3) for a requirement that conflicts with the torch placeholder, recorded here."""
    recorded = [
        "Collecting torch<2.14,>=2.11 (from -r /tmp/pe/r.txt (line 1))",
        "ERROR: Cannot install torch<2.14 and >=2.11 and torch==2.5.0+node because these package versions have "
        "conflicting dependencies.",
        "",
        "The conflict is caused by:",
        "    The user requested torch<2.14 and >=2.11",
        "    The user requested torch==2.5.0+node",
        "",
        "Additionally, some packages in these conflicts have no matching distributions available for your environment:",
        "    torch",
        "",
        "To fix this you could try to:",
        "1. loosen the range of package versions you've specified",
        "",
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/",
    ]
    message = wh.pip_error(recorded)
    assert "\n" not in message
    assert message.startswith("Cannot install torch<2.14 and >=2.11 and torch==2.5.0+node")
    assert message.endswith("(The user requested torch<2.14 and >=2.11; The user requested torch==2.5.0+node)")
    assert wh.pip_error(["Collecting x", "Killed"]) == "Killed"


def test_a_node_torch_older_than_the_lab_allows_stops_before_pip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wheelhouse", "--python", "3.12", "--dest", str(tmp_path / "w"), "--torch", "2.5.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --torch 2.5.0: the lab needs torch") and "\n" not in err


def test_a_node_package_that_the_stack_imports_is_resolved_with_litgpts_caps() -> None:
    """Seen on the device image (torch 2.11, transformers 5.17): torchmetrics imports transformers whenever it is
    installed, and transformers 5.17 refuses litgpt's huggingface_hub<1.4 at `import lightning`. So a node that has
    transformers gets it resolved (unpinned) with the lab's requirements; a node without it gets nothing extra."""
    from torchmetrics.utilities import imports

    assert imports._TRANSFORMERS_GREATER_EQUAL_4_4.requirement.startswith("transformers")  # still a soft import
    assert wheel_plan.node_imported_requirements({"transformers": "5.17.0", "jax": "0.8"}) == ["transformers"]
    assert wheel_plan.node_imported_requirements({"jax": "0.8"}) == []
    assert wheel_plan.node_imported_requirements(None) == []


def fake_bitsandbytes_wheel(folder: Path, libraries: list[str]) -> Path:
    """A wheel laid out as bitsandbytes 0.49.2's (one library per CUDA release), with small stand-in libraries."""
    wheel = folder / "bitsandbytes-0.49.2-py3-none-manylinux_2_24_x86_64.whl"
    files = {"bitsandbytes/__init__.py": b"__version__ = '0.49.2'\n"}
    files |= {f"bitsandbytes/{name}": name.encode() * 1000 for name in libraries}
    files["bitsandbytes-0.49.2.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.49.2\n"
    files["bitsandbytes-0.49.2.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-manylinux_2_24_x86_64\n"
    )
    record = [f"{path},sha256=x,{len(data)}" for path, data in files.items()]
    files["bitsandbytes-0.49.2.dist-info/RECORD"] = (
        "\n".join([*record, "bitsandbytes-0.49.2.dist-info/RECORD,,"]) + "\n"
    ).encode()
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def test_bitsandbytes_keeps_only_the_nodes_cuda_library(tmp_path: Path) -> None:
    """The device's transfer limit (64 MiB) cannot take the whole bitsandbytes wheel beside the rest; the node's
    torch loads one library. The trimmed wheel installs with pip and its RECORD lists exactly what it holds."""
    libraries = [
        "libbitsandbytes_cpu.so",
        "libbitsandbytes_cuda121.so",
        "libbitsandbytes_cuda130.so",
        "libbitsandbytes_rocm72.so",
    ]
    wheel = fake_bitsandbytes_wheel(tmp_path, libraries)
    before, after = wh.trim_bitsandbytes(wheel, "13.0")
    assert after < before
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = archive.read("bitsandbytes-0.49.2.dist-info/RECORD").decode()
    assert {Path(n).name for n in names if "libbitsandbytes" in n} == {
        "libbitsandbytes_cpu.so",
        "libbitsandbytes_cuda130.so",
    }
    assert {line.split(",")[0] for line in record.splitlines()} == names
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
    )
    assert sorted(p.name for p in (site / "bitsandbytes").glob("*.so")) == [
        "libbitsandbytes_cpu.so",
        "libbitsandbytes_cuda130.so",
    ]


def test_bitsandbytes_trim_errors_are_one_line(tmp_path: Path) -> None:
    wheel = fake_bitsandbytes_wheel(tmp_path, ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda121.so"])
    with pytest.raises(wheel_plan.WheelhouseError, match="no libbitsandbytes_cuda130.so: no bitsandbytes build for CUDA 13.0"):
        wh.trim_bitsandbytes(wheel, "13.0")
    with pytest.raises(wheel_plan.WheelhouseError, match="--cuda 'cu130': give the node's torch CUDA as MAJOR.MINOR"):
        wh.bitsandbytes_library("cu130")


def test_a_node_package_in_another_version_stays_when_every_requirement_accepts_it() -> None:
    """The GPU image has numpy 2.5.2 where the resolution picked 2.4.6 (datasets: numpy>=1.17): not carried (it
    was 16 MiB of a 48 MiB wheelhouse). tokenizers 0.23.2 breaks transformers' <=0.23.0: carried. An extra's
    requirement counts where the extra is asked for: pydantic 2.0 breaks jsonargparse[signatures]'s pydantic>=2.5
    (litgpt asks for it), while torchmetrics' numpy<2.4 under its "dev" extra (nobody asks) does not count."""
    have = {"numpy": "2.5.2", "tokenizers": "0.23.2", "pydantic": "2.0.0", "hjson": "3.0.0"}
    resolved = [
        wheel_plan.Resolved("litgpt", "0.5.13", ("jsonargparse[signatures]<=4.41",)),
        wheel_plan.Resolved("torchmetrics", "1.9.0", ('numpy<2.4.0; extra == "dev"', "numpy>1.20.0")),
        wheel_plan.Resolved("datasets", "3.6.0", ("numpy>=1.17",)),
        wheel_plan.Resolved("transformers", "5.3.0", ("tokenizers<=0.23.0,>=0.22.0", "numpy>=1.17")),
        wheel_plan.Resolved("jsonargparse", "4.41.0", ('pydantic>=2.5; extra == "signatures"',)),
        wheel_plan.Resolved("deepspeed", "0.19.8", ("hjson",)),
        wheel_plan.Resolved("numpy", "2.4.6", ()),
        wheel_plan.Resolved("tokenizers", "0.22.2", ()),
        wheel_plan.Resolved("pydantic", "2.14.4", ()),
        wheel_plan.Resolved("hjson", "3.1.0", ()),
    ]
    reasons: dict[str, str] = {}
    kept = {
        r.name
        for r in wheel_plan.left_to_collect(resolved, have, [], target=TARGET, requirements=["numpy>=1.20"], reasons=reasons)
    }
    assert kept == {"litgpt", "torchmetrics", "datasets", "transformers", "jsonargparse", "deepspeed", "tokenizers",
                    "pydantic"}  # fmt: skip
    assert reasons == {
        "tokenizers": "the node's 0.23.2 breaks transformers: tokenizers<=0.23.0,>=0.22.0",
        "pydantic": "the node's 2.0.0 breaks jsonargparse: pydantic>=2.5",
    }
    # a package with requirements of its own stays carried (the node's version may need others than the carried
    # ones: the image's transformers 5.17 needs a huggingface_hub that litgpt's cap refuses)
    have_more = {**have, "pandas": "2.3.1"}
    more = [*resolved, wheel_plan.Resolved("pandas", "2.2.0", ("numpy>=1.26",))]
    assert "pandas" in {r.name for r in wheel_plan.left_to_collect(more, have_more, [], target=TARGET)}
    # without the target, as before: every differing version is carried
    assert {r.name for r in wheel_plan.left_to_collect(resolved, have, [])} == kept | {"numpy", "hjson"}


# ------------------------------------------------------------- refused before anything is downloaded


def _no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(command, what, **kwargs):
        raise AssertionError(f"pip ran ({what}): the input should have been refused first")

    monkeypatch.setattr(wh, "_run", refused)


_CLI_WITHOUT_PIP = """
import sys
from lab_helpers.assets import wheelhouse
from lab_helpers.cli import main
def refused(command, what, **kwargs):
    raise SystemExit(f"pip ran ({what}): the input should have been refused first")
wheelhouse._run = refused
sys.exit(main(sys.argv[1:]))
"""
"""The CLI's main in a process of its own (a hang is a timeout, not a stuck test), pip never run: nothing is
downloaded when a refusal is missed."""


@pytest.mark.parametrize("node_has", ["a FIFO", "/dev/zero", "a link", "100 MB"])
def test_a_node_list_that_is_no_regular_file_is_one_line_at_once(tmp_path: Path, node_has: str) -> None:
    """`--node-has /dev/zero` filled 24 GB until the kernel killed it; a FIFO hung. The real CLI now refuses each in
    one line before pip runs (a 60 s timeout stands for the hang)."""
    listing = tmp_path / "node.txt"
    if node_has == "a FIFO":
        os.mkfifo(listing)
    elif node_has == "a link":
        (tmp_path / "real.txt").write_text("numpy==2.4.6\n")
        listing.symlink_to(tmp_path / "real.txt")
    elif node_has == "100 MB":
        with open(listing, "wb") as fh:
            fh.truncate(100 * 2**20)  # sparse: no disk spent
    else:
        listing = Path(node_has)
    args = ["wheelhouse", "--python", "3.12", "--dest", str(tmp_path / "w"), "--node-has", str(listing)]
    proc = subprocess.run([sys.executable, "-c", _CLI_WITHOUT_PIP, *args], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: --node-has {listing}: "), lines
    why = {"a FIFO": "(a FIFO)", "/dev/zero": "(a device)", "a link": "symbolic link", "100 MB": "more than"}
    assert why[node_has] in lines[0]
    assert not (tmp_path / "w").exists()


def test_a_dest_that_is_no_folder_is_one_line_before_pip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wheelhouse --dest /proc/x` or an existing file was a traceback."""
    _no_pip(monkeypatch)
    (tmp_path / "a-file").write_text("mine\n")
    for dest, why in (("/proc/x", "special file system"), (str(tmp_path / "a-file"), "not a folder")):
        assert main(["wheelhouse", "--python", "3.12", "--dest", dest]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --dest {dest}: ") and why in err and "\n" not in err, err
    assert (tmp_path / "a-file").read_text() == "mine\n"


def test_a_cuda_bitsandbytes_has_no_library_for_is_refused_before_pip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--cuda 99.9` was refused only after 39 s and 200 MB of downloads (when the wheel was trimmed)."""
    _no_pip(monkeypatch)
    args = ["wheelhouse", "--python", "3.12", "--dest", str(tmp_path / "w"), "--with", "qlora", "--cuda", "99.9"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --cuda 99.9: bitsandbytes 0.49.2 has no library for it") and "13.0" in err
    assert not (tmp_path / "w").exists()


def test_the_cuda_list_is_the_pinned_bitsandbytes_ones() -> None:
    """BITSANDBYTES_CUDA was read from the pinned wheel: a new pin needs the list read again from its wheel."""
    assert wh.BITSANDBYTES_CUDA[0] == wheel_plan.pinned_version(wheel_plan.read_constraints(), "bitsandbytes")
