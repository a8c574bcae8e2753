"""What a fresh GPU node needs before the first run: a torch that can drive its GPUs, Volta kernels, an nvcc for
DeepSpeed, bitsandbytes for QLoRA, and measurements that hold on a GPU node (OOM text, NVML by UUID, PSS).

Driver versions, CUDA builds, NVML readings and cuBLAS error texts cannot be produced on this CPU machine: the
node facts below are fixtures recorded from the shapes `describe_node()`, `torch.cuda.get_arch_list()`,
`nvcc --version` and NVML return on such nodes. The code under test is the real one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import types

import pytest

from lab_helpers import lab
from lab_helpers.config.experiments import LabConfigError, resolve
from lab_helpers.hardware import cuda_compat, node
from lab_helpers.launch.sampler import ProcessTreeMemory, TimelineSampler, process_tree_rss_bytes, visible_nvml_indices
from lab_helpers.planning.decision import blocked
from lab_helpers.planning.node_limits import offload_fit
from lab_helpers.planning.sections import sections_runnable
from lab_helpers.present import doctor
from lab_helpers.record import run_record
from lab_helpers.training.child_report import is_oom_text, is_out_of_memory
from lab_helpers.training.distributed.nodes import node_gpus

H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_gib": 79.6, "compute_capability": "9.0",
        "bf16_native": True, "nvlink_links_active": 18}  # fmt: skip
V100 = {"index": 0, "name": "Tesla V100-SXM2-32GB", "memory_total_gib": 31.7, "compute_capability": "7.0",
        "bf16_native": False, "nvlink_links_active": 0}  # fmt: skip


def facts(gpus, *, driver="550.54.15", driver_cuda="12.4", torch_cuda="13.0", available=False, arch=None, **extra):
    """A node as describe_node() + torch_facts() report it (recorded shapes, not this machine)."""
    return {
        "gpus": gpus,
        "driver_version": driver,
        "cuda_driver_version": driver_cuda,
        "torch_cuda": torch_cuda,
        "torch_version": "2.13.0" + ("" if torch_cuda is None else f"+cu{torch_cuda.replace('.', '')}"),
        "torch_cuda_available": available,
        "torch_arch_list": arch or [],
        "packages": {"torch": "2.13.0", "lightning": "2.6.6", "litgpt": "0.5.13", "deepspeed": "0.19.8",
                     "bitsandbytes": "0.49.2"},  # fmt: skip
        "host": {"ram_total_gib": 500.0, "ram_available_gib": 480.0, "cpu_count": 64},
        **extra,
    }


# ------------------------------------------------------------------------------------ torch build vs driver


def test_a_cuda13_torch_on_a_cuda12_driver_names_the_driver_and_the_matching_build():
    problem = cuda_compat.torch_gpu_problem(facts([H100] * 4))
    assert "driver 550.54.15" in problem and "CUDA 13.0" in problem and "12.4" in problem
    assert "pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" in problem


def test_any_cuda12_driver_gets_the_cu126_build_and_a_cuda13_driver_pypi():
    """torch 2.13 ships cu126, cu130 (PyPI) and cu132 builds: no cu128."""
    assert "whl/cu126" in cuda_compat.torch_gpu_problem(facts([H100], driver="570.86", driver_cuda="12.8"))
    problem = cuda_compat.torch_gpu_problem(facts([H100], driver="560.35", driver_cuda="12.6", torch_cuda=None))
    assert "CPU-only build" in problem and "whl/cu126" in problem
    cpu_build = cuda_compat.torch_gpu_problem(facts([H100], driver="580.65", driver_cuda="13.0", torch_cuda=None))
    assert cpu_build.endswith("pip install --force-reinstall torch==2.13.0")  # PyPI's default is the CUDA 13 build


def test_blackwell_on_a_cuda12_driver_needs_the_driver_updated():
    b200 = {**H100, "name": "NVIDIA B200", "compute_capability": "10.0"}
    problem = cuda_compat.torch_gpu_problem(facts([b200], driver="570.86", driver_cuda="12.8"))
    assert "update the NVIDIA driver" in problem and "whl/cu126" not in problem


def test_a_driver_older_than_cuda12_must_be_updated():
    problem = cuda_compat.torch_gpu_problem(facts([H100], driver="470.82", driver_cuda="11.4"))
    assert "update the NVIDIA driver" in problem and ">= 525.60" in problem and ">= 580" in problem


def test_a_working_gpu_torch_or_no_gpu_is_no_problem():
    arch = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert cuda_compat.torch_gpu_problem(facts([H100], driver_cuda="13.0", available=True, arch=arch)) is None
    assert cuda_compat.torch_gpu_problem(facts([], torch_cuda=None)) is None


def test_a_v100_with_a_build_without_volta_kernels_is_sent_to_cu126():
    arch = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    problem = cuda_compat.torch_gpu_problem(facts([V100], driver_cuda="13.0", available=True, arch=arch))
    assert "Volta" in problem and "no kernel image" in problem and "whl/cu126" in problem and "16-mixed" in problem
    # torch could not even start: judged by the build
    assert "whl/cu126" in cuda_compat.torch_gpu_problem(facts([V100], driver="580.65", driver_cuda="13.0"))
    # the cu126 build has sm_70: nothing to fix
    ok = facts([V100], driver_cuda="12.8", torch_cuda="12.6", available=True, arch=["sm_50", "sm_60", "sm_70", "sm_90"])
    assert cuda_compat.torch_gpu_problem(ok) is None


def test_default_profile_stops_on_a_gpu_node_whose_gpus_torch_cannot_use(monkeypatch):
    """NVML sees an H100 (fixture) but torch here is a CPU build: never silently the ci profile."""
    monkeypatch.delenv("LAB_PROFILE", raising=False)
    monkeypatch.setattr(node, "describe_node", lambda: facts([H100], torch_cuda=None))
    with pytest.raises(LabConfigError, match=r"CPU-only build.*torch==.*LAB_PROFILE=ci"):
        lab.default_profile()
    monkeypatch.setenv("LAB_PROFILE", "ci")
    assert lab.default_profile() == "ci"


def test_the_gpu_profile_on_a_machine_without_cuda_stops_before_anything_runs(results, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(node, "describe_node", lambda: facts([]))
    with pytest.raises(LabConfigError, match="needs a CUDA GPU"):
        lab.run_experiment("small-batch", profile="gpu", overrides={"checkpoint_dir": "/nonexistent"}, echo=False)
    assert not (results / "runs.jsonl").exists()


# ------------------------------------------------------------------------------------ doctor verdicts


def test_doctor_flags_the_driver_mismatch_first():
    report = doctor.format_report(facts([H100] * 2))
    first = report.splitlines()[2]
    assert first.startswith("✘ PROBLEM") and "whl/cu126" in first
    assert "✘ single" in report


def test_doctor_flags_a_v100():
    report = doctor.format_report(facts([V100], driver_cuda="13.0", available=True, arch=["sm_75", "sm_90"]))
    assert "PROBLEM" in report and "Volta" in report and "✘ single bf16" in report


def test_doctor_flags_missing_or_mismatched_nvcc_for_deepspeed():
    missing = cuda_compat.deepspeed_build_problem("12.8", None)
    assert "no nvcc" in missing and "cuda-toolkit-12-8" in missing and "Docker image" in missing
    assert "refuses" in cuda_compat.deepspeed_build_problem("13.0", "12.8")
    assert cuda_compat.deepspeed_build_problem("12.8", "12.6") is None  # DeepSpeed's own minor-version table
    assert cuda_compat.deepspeed_build_problem("13.0", "13.0") is None
    assert cuda_compat.deepspeed_build_problem(None, None) is None  # a CPU torch builds cpu_adam with g++
    node_facts = facts([H100] * 4, driver_cuda="13.0", available=True, arch=["sm_90"])
    node_facts["deepspeed_build_problem"] = cuda_compat.deepspeed_build_problem("13.0", None)
    ok, why = sections_runnable(node_facts)["deepspeed-offload"]
    assert not ok and "no nvcc" in why


def test_doctor_names_the_pinned_bitsandbytes_install_when_it_is_missing():
    node_facts = facts([H100], driver_cuda="13.0", available=True, arch=["sm_90"])
    node_facts["packages"]["bitsandbytes"] = None
    ok, why = sections_runnable(node_facts)["qlora"]
    assert not ok and f"pip install '{node.bitsandbytes_requirement()}'" in why
    assert node.bitsandbytes_requirement().startswith("bitsandbytes") and "<" in node.bitsandbytes_requirement()


def test_nvcc_version_reads_the_release_line(tmp_path):
    """nvcc itself is not on this machine: a stand-in prints nvcc's real --version text."""
    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n"
    )
    fake.chmod(0o755)
    assert cuda_compat.nvcc_version(str(fake)) == (str(fake), "12.8")


@pytest.mark.slow
def test_doctor_on_this_machine_still_passes():
    done = subprocess.run([sys.executable, "-m", "lab_helpers", "doctor"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Lab sections on this node" in done.stdout


# ------------------------------------------------------------------------------------ QLoRA without bitsandbytes


def test_qlora_on_a_cuda_node_without_bitsandbytes_is_skipped_with_the_install_command():
    """A CUDA node is a fixture here (an H100's NVML facts); its packages are this machine's, whose bitsandbytes
    is really absent: run_experiment's gate (the decision's checks) skips QLoRA with the pinned install."""
    packages = node.package_versions()
    if packages["bitsandbytes"] is not None:
        pytest.skip("bitsandbytes is installed here")
    run = resolve("qlora-7b", "gpu", check_files=False)
    reason = blocked(run, facts([H100], packages=packages))
    assert reason == f"bitsandbytes is not installed ({node.bitsandbytes_install_command()}): QLoRA is skipped"


# ------------------------------------------------------------------------------------ measurements on GPU nodes


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
    ],
)
def test_allocation_failures_outside_torchs_allocator_are_ooms(message):
    """Recorded error texts of cuBLAS / cuDNN allocation failures (a CPU cannot produce them)."""
    assert is_out_of_memory(RuntimeError(message)) and is_oom_text(message)
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_a_cublas_alloc_failure_in_the_log_is_recorded_as_oom(tmp_path):
    from lab_helpers.launch.runner import ProcessOutcome
    from lab_helpers.launch.sampler import TimelineSummary

    outcome = ProcessOutcome(
        returncode=1,
        interrupted=False,
        wall_s=1.0,
        log_path=tmp_path / "output.log",
        timeline=TimelineSummary(path=tmp_path / "timeline.csv"),
        tail=["Traceback ...", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"],
    )
    status, reason, _ = run_record._status({}, outcome, launched=True)
    assert status == "oom" and "CUBLAS_STATUS_ALLOC_FAILED" in reason


def test_process_tree_memory_counts_pages_shared_by_forked_workers_once(tmp_path):
    """Like DataLoader workers: a parent touches 300 MiB, then forks 3 children that share those pages."""
    script = textwrap.dedent(
        """
        import os, time
        data = bytearray(300 * 2**20)
        for i in range(0, len(data), 4096):
            data[i] = 1
        for _ in range(3):
            if os.fork() == 0:
                time.sleep(30); os._exit(0)
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        import psutil

        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        rss_sum = sum(p.memory_info().rss for p in tree)
        counted = process_tree_rss_bytes(proc.pid)
        assert rss_sum > 3.5 * 300 * 2**20  # what summing RSS reports: the shared pages four times
        assert 300 * 2**20 < counted < 1.5 * 300 * 2**20  # each page once
        memory = ProcessTreeMemory(proc.pid)  # the sampler's: exact, then estimated from RSS between readings
        for now_s in (0.0, 0.5):
            assert 300 * 2**20 < memory.read_bytes(now_s) < 1.5 * 300 * 2**20
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_visible_devices_map_to_nvml_indices():
    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]
    assert visible_nvml_indices(None, uuids) == [0, 1, 2, 3]
    assert visible_nvml_indices("2,3", uuids) == [2, 3]
    assert visible_nvml_indices("GPU-dddd,GPU-bb", uuids) == [3, 1]
    assert visible_nvml_indices("1,7,2", uuids) == [1]  # like CUDA: the list ends at the first unknown entry
    assert visible_nvml_indices("", uuids) == []


def test_a_ranks_nvml_peak_is_found_by_its_uuid_under_cuda_visible_devices(tmp_path, monkeypatch):
    """NVML readings cannot happen on a CPU: a stand-in pynvml reports 4 GPUs whose used memory is 10 + index GiB."""
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}{h}{h}{h}".encode(),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=90),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(10 + h) * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 300_000,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with TimelineSampler(tmp_path / "t.csv", root_pid=1, interval_s=0.05, visible_devices="3,1") as sampler:
        time.sleep(0.3)
    summary = sampler.summary
    assert set(summary.gpu_used_peak_gib) == {1, 3}  # someone else's GPUs 0 and 2 are not sampled
    assert summary.gpu_used_peak_for(0) == pytest.approx(13.0)  # rank 0 sees GPU 3 as cuda:0
    assert summary.gpu_used_peak_for(1, "GPU-1111") == pytest.approx(11.0)
    assert summary.gpu_used_peak_for(0, "GPU-1111") == pytest.approx(11.0)  # the reported UUID wins


def test_played_nodes_take_their_slice_of_the_visible_gpus():
    assert node_gpus(1, 2, None) == ["2", "3"]
    assert node_gpus(1, 2, "4,5,6,7") == ["6", "7"]
    assert node_gpus(0, 1, "GPU-aaaa,GPU-bbbb") == ["GPU-aaaa"]
    with pytest.raises(ValueError, match="lists 2"):
        node_gpus(1, 2, "4,5")


def test_the_offload_host_ram_gate_uses_the_planners_16_bytes_per_parameter():
    needed = offload_fit(resolve("deepspeed-offload", "gpu", check_files=False), facts([H100])).need_gib
    assert 193 < needed < 198  # 16 B x 13.0e9 = 194 GiB plus one process: not 12 B (145 GiB)
    node_facts = facts([H100] * 4, driver_cuda="13.0", available=True, arch=["sm_90"])
    node_facts["host"]["ram_total_gib"] = 128.0
    ok, why = sections_runnable(node_facts)["deepspeed-offload"]
    assert not ok and "not enough host RAM" in why and "128 GiB" in why and "run the 7B instead" in why
    node_facts["host"]["ram_total_gib"] = 256.0
    assert sections_runnable(node_facts)["deepspeed-offload"][0]


def test_the_volta_route_torch_is_one_litgpt_and_lightning_accept():
    """The cu126 route installs the pinned torch version; litgpt's and Lightning's installed metadata must allow it."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    pinned = Version(cuda_compat.pinned_torch_version())
    for package in ("litgpt", "lightning"):
        torch_requirements = [
            Requirement(r) for r in importlib.metadata.requires(package) or [] if Requirement(r).name == "torch"
        ]
        assert torch_requirements and all(pinned in r.specifier for r in torch_requirements if not r.marker)
    major_minor = (pinned.major, pinned.minor)
    assert major_minor <= tuple(int(x) for x in cuda_compat.LAST_VOLTA_TORCH.split("."))  # cu126 still published


@pytest.mark.slow
def test_prepare_can_take_one_model_at_a_time_on_a_small_disk(results):
    """Random weights of all four gpu models are ~49 GB: a node (or a measuring call) may build them one by one."""
    from lab_helpers.assets.prepare import gpu_downloads

    assert list(gpu_downloads(["7b"])) == ["7b"] and len(gpu_downloads(None)) == 4
    with pytest.raises(LabConfigError, match="unknown model 70b"):
        gpu_downloads(["70b"])
    done = subprocess.run(
        [sys.executable, "-m", "lab_helpers", "prepare", "--profile", "gpu", "--random-weights", "--models", "70b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "unknown model 70b" in done.stderr and "Traceback" not in done.stderr


def test_the_gpu_profile_on_a_v100_with_a_build_without_volta_kernels_stops_before_anything_runs(results, monkeypatch):
    """CUDA works (fixture: torch.cuda answers patched) but the build has no sm_70: never a 'no kernel image' error."""
    monkeypatch.setattr(node, "describe_node", lambda: facts([V100], driver_cuda="13.0", torch_cuda="13.0"))
    monkeypatch.setattr(
        cuda_compat,
        "torch_facts",
        lambda: {"torch_version": "2.13.0+cu130", "torch_cuda_available": True, "torch_arch_list": ["sm_75", "sm_90"]},
    )
    with pytest.raises(LabConfigError, match="Volta.*whl/cu126"):
        lab.run_experiment("small-batch", profile="gpu", echo=False)
    assert not (results / "runs.jsonl").exists()


def test_an_offload_run_the_host_cannot_hold_is_skipped_naming_the_model_that_fits(ci_assets):
    """The pre-run gate (decision.blocked): the planner's one offload formula on the run's real parameter counts
    against the node's RAM (a node without GPUs whose RAM is a fixture number)."""
    from lab_helpers.planning.arithmetic import count_params
    from lab_helpers.planning.planner.analytic import offload_host_bytes

    def cpu_node(ram_gib: float) -> dict:
        return {"gpus": [], "packages": node.package_versions(), "host": {"ram_total_gib": ram_gib}}

    run = resolve("deepspeed-offload", "ci", check_files=False)
    assert blocked(run, cpu_node(10_000.0)) is None
    small = count_params("checkpoints/lab-ci/ci-llama-xs").total
    ram_gib = offload_host_bytes(small, small, run.devices) / 2**30 + 0.001  # only the smallest model fits
    reason = blocked(run, cpu_node(ram_gib))
    assert "of host RAM" in reason and "--set checkpoint_dir=checkpoints/lab-ci/ci-llama-xs" in reason
    assert "no model" in blocked(run, cpu_node(0.01))
    assert blocked(resolve("fsdp", "ci", check_files=False), cpu_node(1)) is None


def test_an_offload_run_too_big_for_the_host_is_skipped_before_its_checkpoint_is_asked_for(
    ci_assets, results, tmp_path, monkeypatch
):
    """Seen on the H100 device (126 GiB RAM): deepspeed-offload stopped on 'no checkpoint at .../open_llama_13b',
    asking for a 26 GB download that could never run there. The host gate now speaks first; the missing
    checkpoint is still an error for a run the node can hold. The checkpoints below hold configs only (no
    weights), and the node's RAM (describe_node's host reading) is a fixture number that only the smallest ci
    model fits."""
    import shutil

    from lab_helpers.planning.arithmetic import count_params
    from lab_helpers.planning.planner.analytic import offload_host_bytes

    configs_only = tmp_path / "checkpoints"
    for model_dir in (ci_assets["ci-llama-xs"].parent).iterdir():
        if (model_dir / "model_config.yaml").is_file():
            (configs_only / "lab-ci" / model_dir.name).mkdir(parents=True)
            shutil.copy(model_dir / "model_config.yaml", configs_only / "lab-ci" / model_dir.name)
    monkeypatch.setenv("LAB_CHECKPOINTS", str(configs_only))
    run = resolve("deepspeed-offload", "ci", check_files=False)
    small = count_params(str(configs_only / "lab-ci" / "ci-llama-xs")).total
    ram_gib = offload_host_bytes(small, small, run.devices) / 2**30
    monkeypatch.setattr(node, "_host_memory", lambda: {"ram_total_gib": ram_gib, "cpu_count": 2})

    (record,) = lab.run_experiment("deepspeed-offload", profile="ci", echo=False, summary=False)
    assert record["status"] == "skipped"
    assert "of host RAM" in record["reason"] and "--set checkpoint_dir=checkpoints/lab-ci/ci-llama-xs" in record["reason"]
    monkeypatch.setattr(node, "_host_memory", lambda: {"ram_total_gib": 10_000.0, "cpu_count": 2})
    with pytest.raises(LabConfigError, match="no checkpoint at .*ci-llama"):
        lab.run_experiment("deepspeed-offload", profile="ci", echo=False, summary=False)
