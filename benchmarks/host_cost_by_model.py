"""Host time per kernel across architectures, on a GPU: litgpt's LoRA step (r 8 on query and value, bf16-true,
micro batch 1, random weights on the GPU, no checkpoint) of each model named, timed as litgpt's finetune loop runs
it (lm head chunked by 128, chunked loss, ``loss.item()`` every iteration), then profiled for its kernels.

    python benchmarks/host_cost_by_model.py phi-1_5 stablelm-base-alpha-3b Llama-2-7b-hf Llama-2-13b-hf

Why: the traced time model charges each traced kernel one per-launch host cost; this shows what one kernel costs the
host, model by model, on one node and one software stack (``benchmarks/planner_time_published.py`` cites it).
``T`` (environment) sets the sequence length (120). ``LAB_EXTRA_SITE`` (environment) is a folder put first on
``sys.path``: the GPU machines' image has no litgpt, so the lab's copy was carried there.
"""

import os
import sys
import time
from collections import Counter

if os.environ.get("LAB_EXTRA_SITE"):
    sys.path.insert(0, os.environ["LAB_EXTRA_SITE"])
import torch  # noqa: E402
from litgpt.lora import GPT, Config, mark_only_lora_as_trainable  # noqa: E402
from litgpt.utils import chunked_cross_entropy  # noqa: E402

T = int(os.environ.get("T", "120"))


def measure(name: str) -> None:
    cfg = Config.from_name(
        name,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.05,
        lora_query=True,
        lora_key=False,
        lora_value=True,
        lora_projection=False,
        lora_mlp=False,
        lora_head=False,
    )
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = GPT(cfg)
    torch.set_default_dtype(torch.float32)
    mark_only_lora_as_trainable(model)
    model.max_seq_length = T

    def step(n_acc=128):
        x = torch.randint(0, cfg.padded_vocab_size, (1, T), device="cuda")
        logits = model(x, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        loss = chunked_cross_entropy(logits, x[..., 1:])
        (loss / n_acc).backward()
        return loss.item()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    wall = times[len(times) // 2]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    n_k = sum(1 for e in kernels if "Memcpy" not in e.name and "Memset" not in e.name) / 3
    busy = sum(e.device_time for e in kernels) / 3 / 1e3
    ops = Counter()
    cpu = Counter()
    for e in prof.key_averages():
        if e.key.startswith("aten::"):
            ops[e.key] = e.count / 3
            cpu[e.key] = e.self_cpu_time_total / 3 / 1e3
    top = ", ".join(f"{k[6:]} {ops[k]:.0f}x {cpu[k]:.1f}ms" for k, _ in cpu.most_common(8))
    print(
        f"{name}: layers {cfg.n_layer} wall {wall * 1e3:.1f} ms/micro-batch (median of 30; min {times[0] * 1e3:.1f}) "
        f"kernels {n_k:.0f} -> {wall / n_k * 1e6:.1f} us/kernel, device busy {busy:.1f} ms; "
        f"per layer {wall / cfg.n_layer * 1e3:.2f} ms",
        flush=True,
    )
    print(f"  top aten self-CPU under the profiler: {top}", flush=True)


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name(0), "T", T, flush=True)
    for model_name in sys.argv[1:]:
        measure(model_name)
        torch.cuda.empty_cache()  # the model died with measure()
