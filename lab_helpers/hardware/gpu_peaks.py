"""The lab's own table of dense peak FLOP/s per GPU model and precision: the denominator of MFU.

Why a table of our own: vendors quote tensor-core peaks *with 2:4 structured sparsity* (twice the dense rate),
and fine-tuning never uses sparsity, so an MFU against the headline number would look half as good as it is.
Every row below is the dense figure (a with-sparsity datasheet figure halved) with its source.

Precisions map onto the units that do the matmuls:

* ``bf16-true`` / ``bf16-mixed``: bf16 tensor cores (none on V100: it has no native bf16, so no peak);
* ``16-true`` / ``16-mixed``: fp16 tensor cores, with fp32 accumulation (what PyTorch uses; GeForce cards run
  that at half their fp16-accumulate rate, so their rows use the fp32-accumulate figure);
* ``32-true``: TF32 tensor cores on Ampere and newer, because litgpt's CLI calls
  ``torch.set_float32_matmul_precision("high")``; plain FP32 on V100, which has no TF32.

Anything else (``transformer-engine``, ``64-true``) and any GPU not in the table gives ``None``: an MFU against
a guessed peak would mislead, so the lab shows none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    """Dense peak TFLOP/s of one GPU model; ``fp32_matmul`` is TF32 tensor cores where they exist, else FP32."""

    model: str
    bf16: float | None
    fp16: float | None
    fp32_matmul: float | None


# (pattern on the upper-cased NVML / torch device name, peak). The first match wins, so specific names
# (H100 NVL, A10G) come before general ones (H100, A10).
_TABLE: tuple[tuple[str, Peak | None], ...] = (
    # GH200: its GPU is the H100 SXM5-class Hopper part; NVIDIA's GH200 datasheet quotes the same tensor rates
    # as H100 SXM (BF16/FP16 989 dense, TF32 494.7 dense); see the H100 SXM row for the source of the numbers.
    (r"\bGH200\b", Peak("GH200", bf16=989.4, fp16=989.4, fp32_matmul=494.7)),
    # H200 NVL: NVIDIA H200 datasheet, H200 NVL column: BF16/FP16 1,671 and TF32 835 TFLOPS with sparsity.
    (r"\bH200\b.*\bNVL\b", Peak("H200 NVL", bf16=835.5, fp16=835.5, fp32_matmul=417.5)),
    # H200 SXM: same GH100 compute as H100 SXM (NVIDIA H200 datasheet: BF16/FP16 1,979, TF32 989 with
    # sparsity); dense ~989 BF16 also in itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html.
    (r"\bH200\b", Peak("H200 SXM", bf16=989.4, fp16=989.4, fp32_matmul=494.7)),
    # H100 NVL: NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), H100 NVL column: BF16/FP16 1,671,
    # TF32 835 TFLOPS with sparsity. (Recalled from the vendor page; no copy reachable through the lab's
    # search when this row was written: check it against the datasheet when one is at hand.)
    (r"\bH100\b.*\bNVL\b", Peak("H100 NVL", bf16=835.5, fp16=835.5, fp32_matmul=417.5)),
    # H100 PCIe: NVIDIA H100 datasheet: BF16/FP16 1,513, TF32 756 TFLOPS "shown with sparsity"
    # (reproduced at archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html).
    (r"\bH100\b.*\bPCIE\b", Peak("H100 PCIe", bf16=756.5, fp16=756.5, fp32_matmul=378.0)),
    # H100 SXM5 (NVML: "NVIDIA H100 80GB HBM3"): NVIDIA H100 datasheet BF16/FP16 1,979, TF32 989 with sparsity;
    # dense matrix rates 989.4 / 494.7 in glennklockwood.com/garden/processors/h100 (citing the whitepaper).
    (r"\bH100\b.*\b(SXM\d?|HBM3)\b", Peak("H100 SXM", bf16=989.4, fp16=989.4, fp32_matmul=494.7)),
    # A100 SXM4 and PCIe, 40 and 80 GB: NVIDIA A100 datasheet BF16/FP16 312 (624 sparse), TF32 156 (312 sparse),
    # the same for every A100 variant (glennklockwood.com/garden/processors/A100 citing the datasheet).
    (r"\bA100\b", Peak("A100", bf16=312.0, fp16=312.0, fp32_matmul=156.0)),
    # A10G (AWS g5): NVIDIA publishes no datasheet; public sources disagree (some give the A10's numbers, some
    # lower tensor rates, e.g. baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference), so: unknown.
    (r"\bA10G\b", None),
    # A10: NVIDIA A10 datasheet: BF16/FP16 125 (250 sparse), TF32 62.5 (125 sparse).
    (r"\bA10\b", Peak("A10", bf16=125.0, fp16=125.0, fp32_matmul=62.5)),
    # A40: NVIDIA A40 datasheet: BF16 and FP16 tensor 149.7 (299.4 sparse), TF32 74.8 (149.6 sparse) TFLOPS
    # (the datasheet table reproduced at ecer.com, .../nvidia-a40-gpu-and-vga-outputs.html).
    (r"\bA40\b", Peak("A40", bf16=149.7, fp16=149.7, fp32_matmul=74.8)),
    # RTX A6000 (NVML: "NVIDIA RTX A6000"): FP16/BF16 tensor 154.8 dense (309.7 sparse), from NVIDIA's RTX A6000
    # datasheet as quoted by Microway's Ampere comparison (llmperf.net/categories/gpu/Nvidia-A6000-GPUs cites it);
    # TF32 at half that, as on every GA102 part (the A40 datasheet: 74.8 against 149.7). Anchored at the end so
    # the "RTX 6000 Ada Generation" (Ada, another chip) does not match.
    (r"\bRTX A6000$", Peak("RTX A6000", bf16=154.8, fp16=154.8, fp32_matmul=77.4)),
    # L40S: NVIDIA L40S datasheet: BF16/FP16 362.05 (733 sparse), TF32 183 (366 sparse)
    # (reproduced at mullet.se/product.html?product_id=355414).
    (r"\bL40S\b", Peak("L40S", bf16=362.05, fp16=362.05, fp32_matmul=183.0)),
    # L4: NVIDIA L4 datasheet: FP16/BF16 242, TF32 120 TFLOPS with sparsity (grokipedia.com/page/NVIDIA_L4_vs_L40S
    # quotes the 242 sparse FP16 figure; store.sourcecode.com lists TF32 120 with sparsity).
    (r"\bL4\b", Peak("L4", bf16=121.0, fp16=121.0, fp32_matmul=60.0)),
    # V100 SXM2: NVIDIA V100 datasheet: 125 tensor TFLOPS (fp16, no sparsity on Volta), 15.7 FP32; no bf16, no TF32
    # (developer.nvidia.com/programming-tensor-cores-cuda-9-0 quotes the 125).
    (r"\bV100\b.*\bSXM2\b", Peak("V100 SXM2", bf16=None, fp16=125.0, fp32_matmul=15.7)),
    # V100 PCIe: NVIDIA V100 PCIe product brief: 112 tensor TFLOPS, 14 FP32 (io-tech.fi reproduces the numbers).
    (r"\bV100\b.*\bPCIE\b", Peak("V100 PCIe", bf16=None, fp16=112.0, fp32_matmul=14.0)),
    # RTX 4090: NVIDIA Ada Lovelace architecture whitepaper: FP16/BF16 tensor with FP32 accumulate 165.2
    # (330.4 sparse), TF32 82.6 (165.2 sparse) (waredb.com/processor/nvidia-geforce-rtx-4090 reproduces them).
    # Anchored at the end so the "RTX 4090 D" and laptop parts (fewer SMs) do not match.
    (r"\bRTX 4090$", Peak("RTX 4090", bf16=165.2, fp16=165.2, fp32_matmul=82.6)),
    # RTX 3090: NVIDIA Ampere GA102 whitepaper, appendix A: FP16/BF16 tensor with FP32 accumulate 71 (142 sparse),
    # TF32 35.6 (71 sparse). Anchored so the 3090 Ti (faster clocks) does not match.
    (r"\bRTX 3090$", Peak("RTX 3090", bf16=71.0, fp16=71.0, fp32_matmul=35.6)),
)


# Memory of the models whose NVML name does not say it (those that do, "A100-SXM4-80GB", "H100 80GB HBM3",
# "V100-SXM2-32GB", are read from the name): the datasheet's nominal size, one size per model. NVML reports a
# little less (ECC, reserved memory), which --fit's margin is there for; a node's own figure beats both.
_NOMINAL_MEMORY_GB: tuple[tuple[str, float], ...] = (
    (r"\bH200\b.*\bNVL\b", 141.0),
    (r"\bH200\b", 141.0),
    (r"\bH100\b.*\bNVL\b", 94.0),
    (r"\bA10G?\b", 24.0),
    (r"\bA40\b", 48.0),
    (r"\bRTX A6000$", 48.0),
    (r"\bL40S\b", 48.0),
    (r"\bL4\b", 24.0),
    (r"\bRTX 4090$", 24.0),
    (r"\bRTX 3090$", 24.0),
)


def nominal_memory_gib(gpu_name: str | None) -> float | None:
    """The size the NVML name carries ("A100-SXM4-80GB" -> 80), else the datasheet's for a one-size model. NVIDIA's
    "80GB" memories are 80 GiB (2^30-byte units) of HBM/GDDR, so the figure is used as GiB."""
    if not gpu_name:
        return None
    name = " ".join(str(gpu_name).upper().split())
    if "GH200" in name:  # "GH200 480GB" counts the Grace CPU's memory too: not the GPU's
        return None
    sized = re.search(r"(\d+)\s*GB\b", name)
    if sized:
        return float(sized.group(1))
    return next((size for pattern, size in _NOMINAL_MEMORY_GB if re.search(pattern, name)), None)


def precision_unit(precision: str) -> str | None:
    """Which matmul unit a Lightning/litgpt precision string runs on: "bf16", "fp16", "fp32_matmul" or None."""
    p = str(precision).strip().lower()
    if p in ("bf16", "bf16-true", "bf16-mixed"):
        return "bf16"
    if p in ("16", "16-true", "16-mixed", "fp16"):
        return "fp16"
    if p in ("32", "32-true", "fp32"):
        return "fp32_matmul"
    return None


def find_gpu(gpu_name: str | None) -> Peak | None:
    if not gpu_name:
        return None
    name = " ".join(str(gpu_name).upper().split())
    for pattern, peak in _TABLE:
        if re.search(pattern, name):
            return peak
    return None


def dense_peak_flops(gpu_name: str | None, precision: str) -> float | None:
    """Dense peak FLOP/s (not TFLOP/s) of ``gpu_name`` at ``precision``; None for an unknown GPU or precision."""
    peak = find_gpu(gpu_name)
    unit = precision_unit(precision)
    if peak is None or unit is None:
        return None
    tflops = getattr(peak, unit)
    return tflops * TERA if tflops is not None else None


# Memory bandwidth (GB/s, 10^9 bytes per second), the roofline's other axis (planner.timing: an op that moves more
# bytes than its FLOPs can hide takes bytes / bandwidth). The first match wins; variants whose memory differs
# (A100 40 GB HBM2 against 80 GB HBM2e) have their own rows. Each line: the datasheet figure and where it was read.
_BANDWIDTH_GBS: tuple[tuple[str, float], ...] = (
    # GH200: NVIDIA GH200 datasheet, 96 GB HBM3 at 4 TB/s (the 144 GB HBM3e part: 4.9 TB/s). Recalled from the
    # datasheet; the lower figure is kept, since NVML's name does not say which memory the node has.
    (r"\bGH200\b", 4000.0),
    # H200 SXM and NVL: NVIDIA H200 datasheet, "GPU Memory Bandwidth 4.8TB/s" for both (aiwiki.ai/wiki/nvidia_h200:
    # "141 GB at 4.8 TB/s on its SXM and NVL boards").
    (r"\bH200\b", 4800.0),
    # H100 NVL: NVIDIA H100 datasheet, H100 NVL column, 3.9 TB/s (94 GB HBM3; 3.93 TB/s in grokipedia.com/page/210100120).
    (r"\bH100\b.*\bNVL\b", 3900.0),
    # H100 PCIe: NVIDIA H100 datasheet, "GPU memory bandwidth 2TB/s" (HBM2e; the table reproduced at
    # archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html: 2000 GB/sec).
    (r"\bH100\b.*\bPCIE\b", 2000.0),
    # H100 SXM5: NVIDIA H100 datasheet, "GPU memory bandwidth 3.35TB/s" (same page: 3,350 GB/sec).
    (r"\bH100\b", 3350.0),
    # A100 80 GB: NVIDIA A100 datasheet, 1,935 GB/s PCIe and 2,039 GB/s SXM (HBM2e; glennklockwood.com/garden/
    # processors/A100 quotes the SXM's 2.039 TB/s from the datasheet). The PCIe figure first: NVML says "PCIE".
    (r"\bA100\b(?=.*\bPCIE\b)(?=.*\b80GB\b)", 1935.0),
    (r"\bA100\b.*\b80GB\b", 2039.0),
    # A100 40 GB (SXM4 and PCIe): NVIDIA A100 datasheet, 1,555 GB/s (HBM2; glennklockwood.com, same page: 1.555 TB/s).
    (r"\bA100\b", 1555.0),
    # A10G: no NVIDIA datasheet (see the peak table); AWS's g5 page gives 600 GB/s, as the A10's. Used for bytes only.
    (r"\bA10G\b", 600.0),
    # A10: NVIDIA A10 datasheet, "GPU Memory Bandwidth 600 GB/s" (GDDR6). Recalled from the datasheet.
    (r"\bA10\b", 600.0),
    # A40: NVIDIA A40 datasheet, "GPU memory bandwidth 696 GB/s" (GDDR6 with ECC). Recalled from the datasheet.
    (r"\bA40\b", 696.0),
    # RTX A6000: NVIDIA RTX A6000 datasheet, "768 GB/s" (GDDR6). Recalled from the datasheet.
    (r"\bRTX A6000$", 768.0),
    # L40S: NVIDIA L40S datasheet, "GPU Memory Bandwidth 864GB/s". Recalled from the datasheet.
    (r"\bL40S\b", 864.0),
    # L4: NVIDIA L4 datasheet, "GPU Memory Bandwidth 300GB/s". Recalled from the datasheet.
    (r"\bL4\b", 300.0),
    # V100 SXM2 and PCIe: NVIDIA V100 datasheet, "Memory Bandwidth 900 GB/sec" (HBM2) for both.
    (r"\bV100\b", 900.0),
    # RTX 4090: NVIDIA Ada Lovelace whitepaper, 1,008 GB/s (21 Gbps GDDR6X, 384-bit).
    (r"\bRTX 4090$", 1008.0),
    # RTX 3090: NVIDIA Ampere GA102 whitepaper, 936 GB/s (19.5 Gbps GDDR6X, 384-bit).
    (r"\bRTX 3090$", 936.0),
)


def memory_bandwidth(gpu_name: str | None) -> float | None:
    """Datasheet memory bandwidth of ``gpu_name`` in bytes/s (not GB/s); None for a GPU not in the table."""
    if not gpu_name:
        return None
    name = " ".join(str(gpu_name).upper().split())
    gbs = next((value for pattern, value in _BANDWIDTH_GBS if re.search(pattern, name)), None)
    return gbs * 1e9 if gbs is not None else None


def dense_peaks(gpu_name: str | None) -> dict[str, float | None]:
    """FLOP/s of every matmul unit; empty for an unknown GPU."""
    peak = find_gpu(gpu_name)
    if peak is None:
        return {}
    return {
        unit: (getattr(peak, unit) * TERA if getattr(peak, unit) else None) for unit in ("bf16", "fp16", "fp32_matmul")
    }


def known_gpus() -> list[str]:
    return [peak.model for _, peak in _TABLE if peak is not None]


# Words of an NVML name that say neither the model nor a variant with other figures: the vendor and brand, the
# memory size (it comes back from nominal_memory_gib) and the SXM form factor with its HBM, the one the
# data-centre parts are measured in ("NVIDIA H100 80GB HBM3" is the H100 SXM5). PCIe and NVL stay in the name.
_NOT_THE_MODEL = re.compile(r"^(NVIDIA|TESLA|GEFORCE|QUADRO|\d+GB|HBM\d*E?|SXM\d*)$")


def reference_name_for_gpu(gpu_name: str | None) -> str | None:
    """Model and memory: "NVIDIA H100 80GB HBM3" -> ``h100-80gb``, "NVIDIA H200" -> ``h200-141gb`` (the datasheet's
    one size); the model alone when its memory is unknown."""
    if not gpu_name or not str(gpu_name).strip():
        return None
    words = [w for w in re.split(r"[^A-Z0-9]+", str(gpu_name).upper()) if w and not _NOT_THE_MODEL.match(w)]
    if not words:
        return None
    memory = nominal_memory_gib(str(gpu_name))
    return "-".join(words).lower() + (f"-{memory:g}gb" if memory else "")
