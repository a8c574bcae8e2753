"""Exporting recorded runs as the lab's reference results, and reading them back for the analysis."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO, cli

from lab_helpers.config.experiments import LabConfigError
from lab_helpers.present.tables import load_reference
from lab_helpers.record.records import append_record
from lab_helpers.record.reference import export_reference, reference_name_for_gpu


@pytest.fixture
def lab_home(tmp_path, monkeypatch, results):
    home = tmp_path / "home"
    home.mkdir()
    (home / "configs").symlink_to(REPO / "configs")
    monkeypatch.setenv("LAB_HOME", str(home))
    return home


def test_export_keeps_the_latest_record_per_experiment_and_its_timeline(lab_home, results):
    (results / "runs" / "b").mkdir(parents=True)
    (results / "runs" / "b" / "timeline.csv").write_text(
        "t_s,gpu,util_pct,mem_used_gib,power_w,host_cpu_pct,host_ram_gib\n"
    )
    append_record(
        {
            "experiment": "grad-accum",
            "profile": "ci",
            "status": "ok",
            "run_id": "a",
            "started_at": "2026-01-01T00:00:00",
            "train_s": 9.0,
        }
    )
    append_record(
        {
            "experiment": "grad-accum",
            "profile": "ci",
            "status": "ok",
            "run_id": "b",
            "started_at": "2026-01-02T00:00:00",
            "train_s": 1.0,
            "timeline_path": "runs/b/timeline.csv",
        }
    )
    append_record(
        {
            "experiment": "bf16-true",
            "profile": "gpu",
            "status": "ok",
            "run_id": "c",
            "started_at": "2026-01-02T00:00:00",
        }
    )
    path = export_reference("cpu-ci", profile="ci", note="test export")
    assert path == lab_home / "reference_results" / "cpu-ci.jsonl"
    assert (lab_home / "reference_results" / "runs" / "b" / "timeline.csv").is_file()
    frame = load_reference("cpu-ci")
    assert list(frame["experiment"]) == ["grad-accum"] and list(frame["train_s"]) == [1.0]
    assert list(frame["reference_note"]) == ["test export"]
    assert "rank_n" not in frame.columns  # only what was recorded, nothing the analysis added


def test_export_refuses_bad_names_and_empty_profiles(lab_home, results):
    with pytest.raises(LabConfigError, match="letters, digits"):
        export_reference("../H100", profile="ci")
    with pytest.raises(LabConfigError, match="no records of profile 'gpu'"):
        export_reference("H100", profile="gpu")


def test_exported_reference_can_be_analysed(lab_home, results):
    from lab_helpers.present.tables import comparison_table

    for rank in (0, 1):
        append_record(
            {
                "experiment": "ddp",
                "profile": "ci",
                "status": "ok",
                "rank": rank,
                "run_id": "r1",
                "started_at": "2026-01-01T00:00:00",
                "train_s": 2.0,
            }
        )
    export_reference("cpu-ci", profile="ci")
    table = comparison_table(load_reference("cpu-ci"))
    assert list(table["experiment"]) == ["ddp"] and list(table["train_s"]) == [2.0]


# --------------------------------------------------------------------- item 4: an export that only adds

H100_SHIPPED = REPO / "reference_results" / "h100-80gb.jsonl"
H200_CHUNK = REPO / "reference_results" / "gpu-chunks" / "h200-20261126-speed" / "runs.jsonl"


def _lines(path, first: int, last: int) -> bytes:
    """Real records: lines ``first``..``last`` (1-based) of a shipped file, as they are stored."""
    return b"".join(path.read_bytes().splitlines(keepends=True)[first - 1 : last])


def _run_ids(path) -> list[str]:
    return [json.loads(line)["run_id"] for line in path.read_text().splitlines()]


def _export(capsys, *args: str) -> tuple[int, str, str]:
    from lab_helpers.cli import main

    code = main(["export-reference", *args])
    captured = capsys.readouterr()
    return code, captured.out.strip(), captured.err.strip()


@pytest.mark.parametrize(
    ("gpu", "stem"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),  # the name of the shipped H100 file
        ("NVIDIA H200", "h200-141gb"),  # no size in the name: the datasheet's one size
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090-24gb"),
        ("NVIDIA B300", "b300"),  # size unknown: the model alone
        ("", None),
        (None, None),
    ],
)
def test_the_file_is_named_after_the_gpu(gpu, stem):
    assert reference_name_for_gpu(gpu) == stem


def test_an_export_appends_keeps_the_shipped_lines_and_adds_a_run_only_once(lab_home, results, capsys):
    folder = lab_home / "reference_results"
    folder.mkdir()
    shipped = _lines(H100_SHIPPED, 1, 3)  # an earlier GPU session: three records
    (folder / "h100-80gb.jsonl").write_bytes(shipped)
    results.mkdir()
    (results / "runs.jsonl").write_bytes(_lines(H100_SHIPPED, 3, 5))  # one of them again, and two new ones
    new_id = json.loads(_lines(H100_SHIPPED, 4, 4))["run_id"]
    (results / "runs" / new_id).mkdir(parents=True)
    (results / "runs" / new_id / "timeline.csv").write_text("t_s,gpu,util_pct\n0.0,0,99\n")

    with pytest.warns(UserWarning, match="exported without it"):  # line 5's timeline is not in these results
        code, out, err = _export(capsys, "--profile", "gpu", "--note", "second session")
    assert (code, err) == (0, "")
    assert out == f"{folder / 'h100-80gb.jsonl'}: 2 added, 1 already there (measured on NVIDIA H100 80GB HBM3)"
    text = (folder / "h100-80gb.jsonl").read_bytes()
    assert text.startswith(shipped)  # the earlier session's lines, byte for byte
    ids = _run_ids(folder / "h100-80gb.jsonl")
    assert len(ids) == 5 and len(set(ids)) == 5
    added = [json.loads(line) for line in text[len(shipped) :].splitlines()]
    assert {r["reference_note"] for r in added} == {"second session"}
    assert (folder / "runs" / new_id / "timeline.csv").read_text() == "t_s,gpu,util_pct\n0.0,0,99\n"
    assert [r["timeline_path"] for r in added] == [f"runs/{new_id}/timeline.csv", None]
    assert sorted(p.name for p in folder.iterdir()) == ["h100-80gb.jsonl", "runs"]  # no temporary file left

    code, out, _ = _export(capsys, "--profile", "gpu")  # the same export again adds nothing
    assert code == 0 and out.endswith("h100-80gb.jsonl: 0 added, 3 already there (measured on NVIDIA H100 80GB HBM3)")
    assert (folder / "h100-80gb.jsonl").read_bytes() == text


def test_h200_records_go_to_their_own_file_and_a_wrong_name_is_refused_in_one_line(lab_home, results, tmp_path, capsys):
    folder = lab_home / "reference_results"
    folder.mkdir()
    h100 = _lines(H100_SHIPPED, 1, 2)
    (folder / "h100-80gb.jsonl").write_bytes(h100)
    chunk = tmp_path / "chunk" / "runs.jsonl"  # what a GPU chunk brings back
    chunk.parent.mkdir()
    chunk.write_bytes(_lines(H200_CHUNK, 1, 3))

    code, out, err = _export(capsys, "h100-80gb", "--from", str(chunk))
    assert code == 2 and "\n" not in err and out == ""
    assert err.startswith("error: export-reference h100-80gb: the records were measured on another GPU")
    assert "NVIDIA H200: reference_results/h200-141gb.jsonl" in err
    assert sorted(p.name for p in folder.iterdir()) == ["h100-80gb.jsonl"]  # nothing written

    with pytest.warns(UserWarning, match="exported without it"):  # no results.tar.gz beside this copy
        code, out, err = _export(capsys, "--from", str(chunk), "--note", "H200 chunk")
    assert (code, err) == (0, "")
    assert out == f"{folder / 'h200-141gb.jsonl'}: 3 added, 0 already there (measured on NVIDIA H200)"
    assert (folder / "h100-80gb.jsonl").read_bytes() == h100  # the H100 file is not touched
    assert _run_ids(folder / "h200-141gb.jsonl") == _run_ids(chunk)

    code, out, _ = _export(capsys, "h200-141gb", "--from", str(chunk))  # the right name is accepted
    assert code == 0 and out.endswith(": 0 added, 3 already there (measured on NVIDIA H200)")


def test_from_a_chunk_file_takes_every_record_and_the_timelines_of_its_archive(lab_home, results, tmp_path, capsys):
    import io
    import tarfile

    folder = lab_home / "reference_results"
    chunk = tmp_path / "chunk" / "runs.jsonl"
    chunk.parent.mkdir()
    chunk.write_bytes(_lines(H200_CHUNK, 1, 2) + _lines(H100_SHIPPED, 6, 7))  # two GPUs in one file
    h200_id = json.loads(_lines(H200_CHUNK, 1, 1))["run_id"]
    with tarfile.open(chunk.parent / "results.tar.gz", "w:gz") as tar:  # as scripts/gpu-chunk.sh packs it
        data = b"t_s,gpu,util_pct\n0.0,0,10\n"
        member = tarfile.TarInfo(f"./runs/{h200_id}/timeline.csv")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))

    with pytest.warns(UserWarning, match="exported without it"):  # three of the four timelines are not there
        code, out, err = _export(capsys, "--from", str(chunk))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{folder / 'h200-141gb.jsonl'}: 2 added, 0 already there (measured on NVIDIA H200)",
        f"{folder / 'h100-80gb.jsonl'}: 2 added, 0 already there (measured on NVIDIA H100 80GB HBM3)",
    ]
    assert (folder / "runs" / h200_id / "timeline.csv").read_bytes() == data
    h200 = [json.loads(line) for line in (folder / "h200-141gb.jsonl").read_text().splitlines()]
    assert [r["timeline_path"] for r in h200] == [f"runs/{h200_id}/timeline.csv", None]
    assert all(r["environment"]["gpu_names"] == ["NVIDIA H200"] for r in h200)

    code, _, err = _export(capsys, "--from", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such file" in err


def test_compare_reads_the_exported_h200_file(lab_home, results, tmp_path, capsys):
    from lab_helpers.cli import main
    from lab_helpers.present.tables import reference_label

    chunk = tmp_path / "chunk" / "runs.jsonl"
    chunk.parent.mkdir()
    chunk.write_bytes(_lines(H200_CHUNK, 2, 3))
    with pytest.warns(UserWarning, match="exported without it"):
        assert _export(capsys, "--from", str(chunk))[0] == 0
    frame = load_reference("h200-141gb")
    assert list(frame["experiment"]) == ["bf16-true", "small-batch"]
    assert reference_label(frame).startswith("h200-141gb.jsonl: real GPU measurement (NVIDIA H200), random weights")
    assert main(["compare", "--reference", "h200-141gb", "--markdown", "--out", str(tmp_path / "figures")]) == 0
    out = capsys.readouterr().out
    assert "| bf16-true | ok |" in out and "| small-batch | ok |" in out


def test_records_without_a_gpu_go_to_ci_cpu_on_the_ci_profile_else_need_a_name(lab_home, results, capsys):
    append_record({"experiment": "grad-accum", "profile": "gpu", "status": "ok", "run_id": "g"})
    code, _, err = _export(capsys, "--profile", "gpu")
    assert code == 2 and "names no GPU" in err and "give NAME" in err and "\n" not in err
    append_record({"experiment": "grad-accum", "profile": "ci", "status": "ok", "run_id": "a"})
    code, out, _ = _export(capsys, "--profile", "ci")  # the ci profile's file, as compare.reference_for names it
    assert code == 0 and out.endswith("ci-cpu.jsonl: 1 added, 0 already there")
    code, out, _ = _export(capsys, "ci-cpu", "--profile", "ci")
    assert code == 0 and out.endswith("ci-cpu.jsonl: 0 added, 1 already there")


# -------------------------------------------------------- an export never lands in another kind's file


def _cli_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli("export-reference", *args), capture_output=True, text=True, timeout=180, cwd=REPO)


def test_a_ci_export_named_after_the_shipped_h100_file_is_refused_unless_forced(lab_home, results):
    """The issue's repro through the real CLI: `export-reference h100-80gb` from the ci profile silently added ci
    records to the shipped H100 file. Now one line, exit 2, the file byte for byte; --force adds them."""
    folder = lab_home / "reference_results"
    folder.mkdir()
    shipped = H100_SHIPPED.read_bytes()
    (folder / "h100-80gb.jsonl").write_bytes(shipped)
    append_record({"experiment": "grad-accum", "profile": "ci", "status": "ok", "run_id": "a",
                   "device_name": "cpu (x86_64)"})  # fmt: skip
    refused = _cli_export("h100-80gb", "--profile", "ci")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "profile gpu on NVIDIA H100 80GB HBM3" in lines[0] and "profile ci on no GPU" in lines[0]
    assert "--force" in lines[0] and (folder / "h100-80gb.jsonl").read_bytes() == shipped
    forced = _cli_export("h100-80gb", "--profile", "ci", "--force")
    assert forced.returncode == 0, forced.stderr
    text = (folder / "h100-80gb.jsonl").read_bytes()
    assert text.startswith(shipped) and len(text.splitlines()) == len(shipped.splitlines()) + 1


def test_a_ci_run_on_a_cpu_names_no_gpu_and_goes_to_the_name_given(lab_home, results, capsys):
    """A ci run's device_name is "cpu (<processor>)": no GPU, so NAME decides (it went to cpu-x86-64.jsonl)."""
    append_record({"experiment": "grad-accum", "profile": "ci", "status": "ok", "run_id": "a",
                   "device_name": "cpu (x86_64)"})  # fmt: skip
    code, out, _ = _export(capsys, "ci-cpu", "--profile", "ci")
    assert code == 0 and out.endswith("ci-cpu.jsonl: 1 added, 0 already there")
    assert sorted(p.name for p in (lab_home / "reference_results").iterdir()) == ["ci-cpu.jsonl"]


@pytest.mark.parametrize("name", [".", "..", ".hidden", "x" * 300, "a/b"])
def test_a_name_that_is_no_reference_file_name_is_one_line(lab_home, results, name):
    append_record({"experiment": "grad-accum", "profile": "ci", "status": "ok", "run_id": "a"})
    proc = _cli_export(name, "--profile", "ci")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "reference name" in lines[0], proc.stderr
    assert len(lines[0]) < 300 and not (lab_home / "reference_results").exists()


def test_an_export_never_writes_through_a_link_planted_as_a_timeline(lab_home, results):
    """The export's timelines are written by the rule of every file the lab writes (paths.write_lab_file): a link
    planted where a timeline goes is refused in one line, even one that stays inside the reference folder."""
    (results / "runs" / "a").mkdir(parents=True)
    (results / "runs" / "a" / "timeline.csv").write_text("t_s,gpu\n0.0,0\n")
    append_record({"experiment": "grad-accum", "profile": "ci", "status": "ok", "run_id": "a",
                   "timeline_path": "runs/a/timeline.csv"})  # fmt: skip
    folder = lab_home / "reference_results"
    (folder / "runs" / "a").mkdir(parents=True)
    victim = folder / "README.md"
    victim.write_text("untouched\n")
    (folder / "runs" / "a" / "timeline.csv").symlink_to(victim)
    proc = _cli_export("ci-cpu", "--profile", "ci")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "symbolic link" in lines[0], proc.stderr
    assert victim.read_text() == "untouched\n" and not (folder / "ci-cpu.jsonl").exists()
