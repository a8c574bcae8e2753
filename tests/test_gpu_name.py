"""``plan --time --gpu-name NAME`` plans for that GPU: its size from the name (or its one datasheet size), an
unknown name is one line naming the GPUs the lab has peaks for. The plan traces the real 7B LoRA recipe on the
meta device (no GPU needed); the GPU is only named."""

from __future__ import annotations

import pytest

from lab_helpers.hardware.gpu_peaks import find_gpu, known_gpus, nominal_memory_gib


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("NVIDIA A100-SXM4-80GB", 80.0),
        ("NVIDIA A100-PCIE-40GB", 40.0),
        ("NVIDIA H100 80GB HBM3", 80.0),
        ("Tesla V100-SXM2-16GB", 16.0),
        ("NVIDIA H200", 141.0),  # no size in the name: the datasheet's one size
        ("NVIDIA L4", 24.0),
        ("NVIDIA GH200 480GB", None),  # that 480 GB counts the Grace CPU's memory
        ("NVIDIA B300", None),
    ],
)
def test_the_size_comes_from_the_name_or_the_one_size_the_model_has(name, gib):
    assert nominal_memory_gib(name) == gib


def test_every_gpu_with_a_peak_is_named_in_known_gpus():
    assert "A100" in known_gpus() and "H100 SXM" in known_gpus()
    assert all(find_gpu(f"NVIDIA {model}") is not None or " " in model for model in known_gpus())


@pytest.mark.slow  # one trace of the 7B on the meta device: seconds
def test_plan_for_a_named_gpu_knows_its_size_and_the_flag_by_its_name(capsys):
    from lab_helpers.cli import main

    args = ["plan", "configs/gpu/open_llama_7b/lora.yaml", "--time", "--gpu-name", "NVIDIA A100-SXM4-80GB"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "of 80.0 GiB): fits" in out and "GPU size unknown" not in out
    assert "per device on NVIDIA A100-SXM4-80GB" in out and "no GPU records yet" not in out
    assert "MFU" in out and "-bound" in out  # the traced time model names what bounds the step

    assert main([*args[:-1], "NVIDIA B300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gpu-name 'NVIDIA B300': the lab has no dense peak") and "A100" in err
    assert "\n" not in err
