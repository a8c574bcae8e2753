"""node.describe_node, the decision's sections_runnable and the doctor report.

The real code paths run on this (GPU-less) machine: NVML is absent, so the GPU list must be empty and every GPU
field None. NVML readings of real GPUs cannot happen on a CPU, so the GPU cases use ``fake_pynvml``: a stand-in
module put in ``sys.modules["pynvml"]`` that answers like NVML does for the GPUs it is given.
"""

from __future__ import annotations

import functools
import json
import sys
import types

import pytest

from lab_helpers.hardware import node
from lab_helpers.planning.sections import sections_runnable
from lab_helpers.present import doctor


def test_describe_node_on_this_machine_is_json_and_has_no_fake_zeros():
    facts = node.describe_node()
    json.dumps(facts)  # JSON-able as is
    assert facts["packages"]["torch"] and facts["packages"]["litgpt"]
    assert facts["host"]["cpu_count"] >= 1 and facts["host"]["ram_total_gib"] > 0
    if not facts["gpus"]:  # the CI machine: nothing about GPUs is made up
        assert facts["gpu_count"] == 0
        for key in ("driver_version", "cuda_driver_version", "interconnect", "topology"):
            assert facts[key] is None
        summary = node.environment_summary(facts)
        assert summary["gpu_names"] == [] and summary["driver_version"] is None
        sections = sections_runnable(facts)
        assert sections["single"] == (False, sections["single"][1]) and "ci profile" in sections["single"][1]


def test_describe_node_imports_neither_torch_nor_litgpt():
    import subprocess

    code = "import sys; from lab_helpers.hardware import node; node.describe_node(); print('torch' in sys.modules, 'litgpt' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_environment_summary_keys():
    summary = node.environment_summary()
    assert set(summary) >= {
        "gpu_names",
        "driver_version",
        "cuda",
        "torch",
        "lightning",
        "litgpt",
        "deepspeed",
        "bitsandbytes",
        "python",
        "hostname",
    }


# ------------------------------------------------------------------------------------------------ fake NVML


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


def _fake_pynvml(gpus: list[dict]) -> types.ModuleType:
    """A stand-in for pynvml: each GPU dict has name, total (bytes), cc (major, minor), links (active NVLinks)."""
    fake = types.ModuleType("pynvml")
    fake.NVMLError = _NVMLError
    fake.NVMLError_NotSupported = _NotSupported
    fake.NVMLError_InvalidArgument = type("InvalidArgument", (_NVMLError,), {})
    fake.NVML_NVLINK_MAX_LINKS = 18
    fake.NVML_FEATURE_ENABLED = 1
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    fake.nvmlSystemGetCudaDriverVersion = lambda: 12040
    fake.nvmlDeviceGetCount = lambda: len(gpus)
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: gpus[h]["name"].encode()  # old pynvml returns bytes
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=gpus[h]["total"])
    fake.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h]["cc"]

    def link_state(h, link):
        if gpus[h]["links"] == 0:
            raise _NotSupported("no NVLink")
        if link >= gpus[h]["links"]:
            raise fake.NVMLError_InvalidArgument("no such link")
        return 1

    fake.nvmlDeviceGetNvLinkState = link_state
    return fake


@pytest.fixture
def fake_nvml(monkeypatch):
    node._hardware.cache_clear()  # the hardware is read once per process: read the fake one
    monkeypatch.setattr(node, "_hardware", functools.cache(node._hardware.__wrapped__))

    def install(gpus, ram_total_gib=500.0, packages=None):
        monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(gpus))
        monkeypatch.setattr(node, "_nvidia_smi_topology", lambda: "GPU0\tX\tNV18")
        monkeypatch.setattr(
            node,
            "_host_memory",
            lambda: {"ram_total_gib": ram_total_gib, "ram_available_gib": ram_total_gib, "cpu_count": 64},
        )
        if packages is not None:
            monkeypatch.setattr(node, "package_versions", lambda: packages)
        return node.describe_node()

    return install


H100 = {"name": "NVIDIA H100 80GB HBM3", "total": 85520809984, "cc": (9, 0), "links": 18}
V100 = {"name": "Tesla V100-SXM2-16GB", "total": 17179869184, "cc": (7, 0), "links": 0}
ALL = {"torch": "2.5", "lightning": "2.6", "litgpt": "0.5.13", "deepspeed": "0.16", "bitsandbytes": "0.45"}


def _keys_of(facts, typed) -> None:
    """``facts`` has exactly the keys of the TypedDict ``typed`` (its required ones; optional ones allowed)."""
    assert typed.__required_keys__ <= set(facts) <= typed.__required_keys__ | typed.__optional_keys__, (
        set(facts) ^ typed.__required_keys__
    )


def test_the_node_is_one_typed_object_and_the_recorded_nodes_have_its_shape(fake_nvml):
    """describe_node (here, and with NVML's GPUs) and every recorded node the decision tests use have NodeFacts'
    keys, their GPUs GpuFacts' and their host HostFacts': a fixture cannot drift from what a node reports."""
    from node_fixtures import NODES

    for facts in (node.describe_node(), fake_nvml([H100] * 4, packages=ALL), *NODES.values()):
        _keys_of(facts, node.NodeFacts)
        _keys_of(facts["host"], node.HostFacts)
        for gpu in facts["gpus"]:
            _keys_of(gpu, node.GpuFacts)
    _keys_of(doctor.check_node(), node.CheckedNodeFacts)  # this machine: torch's facts, no nvcc without GPUs


def test_four_h100_with_nvlink_run_everything(fake_nvml):
    facts = fake_nvml([H100] * 4, packages=ALL)
    json.dumps(facts)
    assert facts["gpu_count"] == 4 and facts["interconnect"] == "NVLink"
    gpu = facts["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["compute_capability"] == "9.0" and gpu["bf16_native"]
    assert gpu["memory_total_gib"] == pytest.approx(79.6, abs=0.1) and gpu["nvlink_links_active"] == 18
    assert facts["driver_version"] == "550.54.15" and facts["cuda_driver_version"] == "12.4"
    sections = sections_runnable(facts)
    assert all(sections[k][0] for k in ("single", "single bf16", "qlora", "multi", "deepspeed-offload"))
    assert sections["multi-node"][0] is False and "informational" in sections["multi-node"][1]
    assert node.environment_summary(facts)["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 4


def test_one_v100_pcie_without_extras(fake_nvml):
    facts = fake_nvml([V100], ram_total_gib=64.0, packages={**ALL, "bitsandbytes": None})
    assert facts["interconnect"] == "PCIe" and facts["gpus"][0]["bf16_native"] is False
    sections = sections_runnable(facts)
    assert sections["single"][0]
    assert not sections["single bf16"][0] and "no native bf16" in sections["single bf16"][1]
    assert not sections["qlora"][0] and "bitsandbytes" in sections["qlora"][1]
    assert not sections["multi"][0] and "rank 0 of 4" in sections["multi"][1]
    ok, why = sections["deepspeed-offload"]
    assert not ok and "196 GiB" in why and "64 GiB" in why and "run the 3B instead" in why  # as decide runs it
    report = doctor.format_report(facts)
    assert "Tesla V100-SXM2-16GB" in report and "✘ single bf16" in report
    assert "the bf16 experiments run in 16-mixed" in report and "bf16-true is skipped" in report  # decide's route


def test_offload_host_ram_number():
    """16 bytes per parameter (fp32 master, Adam moments, fp32 gradients) plus each rank's process, as planned:
    the planner's formula on the 13B's real parameter count, with the node's ranks (fixtures: one and four GPUs)."""
    from node_fixtures import node as fixture

    from lab_helpers.config.experiments import resolve
    from lab_helpers.planning.arithmetic import model_states
    from lab_helpers.planning.node_limits import offload_fit
    from lab_helpers.planning.planner.analytic import HOST_PROCESS_BYTES

    params = model_states("deepspeed-offload").counts.total
    run = resolve("deepspeed-offload", "gpu", check_files=False)
    one, four = offload_fit(run, fixture("H100-80GB")), offload_fit(run, fixture("4xH100"))
    assert 12.9e9 < params < 13.1e9
    assert one.need_gib == pytest.approx((params * 16 + HOST_PROCESS_BYTES) / 2**30)
    assert four.need_gib == pytest.approx((params * 16 + 4 * HOST_PROCESS_BYTES) / 2**30)
    assert not one.fits and one.smaller[0] == "7b" and four.fits  # 128 GiB: the 7B; 1007 GiB: the 13B


def test_doctor_report_and_cli_on_this_machine(capsys):
    facts = node.describe_node()
    report = doctor.format_report(facts)
    assert "Lab sections on this node" in report and "single" in report
    if not facts["gpus"]:
        assert "no GPU: use LAB_PROFILE=ci" in report
    assert doctor.main([]) == 0
    assert "Lab node check" in capsys.readouterr().out
    assert doctor.main(["--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert "sections" in payload and payload["sections"]["single"]["reason"]


def test_the_hardware_is_read_once_per_process_and_free_memory_every_time(monkeypatch):
    """NVML and nvidia-smi run once per process (every run asks for the node); host memory is read fresh."""
    calls = []
    monkeypatch.setattr(node, "_read_nvml", lambda: calls.append(1) or {
        "gpus": [], "error": "no NVML here (test)", "driver_version": None, "cuda_driver_version": None})  # fmt: skip
    monkeypatch.setattr(node, "_hardware", functools.cache(node._hardware.__wrapped__))
    free = iter([10.0, 7.0, 5.0])
    monkeypatch.setattr(node, "_host_memory", lambda: {"ram_available_gib": next(free)})
    first, second = node.describe_node(), node.describe_node()
    assert calls == [1]
    assert first["host"]["ram_available_gib"] == 10.0 and second["host"]["ram_available_gib"] == 7.0
    first["gpus"].append("changed by a caller")
    assert node.describe_node()["gpus"] == [] and calls == [1]  # each caller gets its own copy
