"""The parallelisms the lab does not run, named: what each shards or moves, and its model states per GPU in 02's
notation (``8/N``), computed for the real 7B on this node's GPUs. ``docs/parallelisms.md`` carries the same table,
generated (tests/test_parallelisms.py checks they agree), so no figure is typed. Each parallelism is taken alone
over N GPUs, where a real course combines them; only model states are computed, since activations depend on the
batch and sequence.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.recipe_defaults import DS_PREFETCH_BUCKET_NUMEL, DS_REDUCE_BUCKET_NUMEL
from lab_helpers.config.record_schema import GIB
from lab_helpers.hardware.node import gpu_memory_gib
from lab_helpers.planning import arithmetic
from lab_helpers.planning.decision import LAB_GPU_GIB, SIMULATED_WORLD
from lab_helpers.planning.planner.analytic import DS_MAX_LIVE_PARAMETERS, OFFLOADED_BYTES_PER_TRAINABLE_PARAM

EXPERIMENT = "one-gpu"
"""02's 7B, full fine-tuning, bf16-true."""


@dataclass(frozen=True)
class ModelParts:
    """By the part each parallelism splits."""

    name: str
    total: int
    block_linear: int  # the blocks' nn.Linear layers: attention's qkv and projection, the MLP
    embedding: int  # the token embedding
    head: int  # the output head (0 where it is tied to the embedding)
    final_norm: int  # the norm after the last block
    layers: int  # transformer blocks
    experts: int  # parameters of mixture-of-experts experts (0 in a dense model)
    hidden: int  # the residual stream's width (litgpt's n_embd): what tensor parallel all-reduces, per token

    @property
    def block(self) -> int:
        return (self.total - self.embedding - self.head - self.final_norm) // self.layers

    @property
    def root(self) -> int:
        """FSDP's root unit."""
        return self.embedding + self.head + self.final_norm


@functools.lru_cache(maxsize=8)
def model_parts(checkpoint_dir: str) -> ModelParts:
    import torch
    from litgpt.model import GPT
    from torch import nn

    from lab_helpers.planning.planner.spec import resolve_model_config

    config = resolve_model_config(checkpoint_dir)
    with torch.device("meta"):
        model = GPT(config)
    blocks = model.transformer.h
    linear = sum(p.numel() for m in blocks.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))
    head = 0 if model.lm_head.weight is model.transformer.wte.weight else model.lm_head.weight.numel()
    return ModelParts(
        name=str(config.name),
        total=sum(p.numel() for p in model.parameters()),
        block_linear=linear,
        embedding=model.transformer.wte.weight.numel(),
        head=head,
        final_norm=sum(p.numel() for p in model.transformer.ln_f.parameters()),
        layers=len(blocks),
        experts=sum(p.numel() for name, p in model.named_parameters() if ".experts." in name),
        hidden=int(config.n_embd),
    )


@dataclass(frozen=True)
class Parallelism:
    name: str
    moves: str  # what it shards or moves, activations included
    formula: str  # model states per GPU in bytes per parameter, in N (and G, M where it has them)
    per_gpu_gib: float  # the formula for the 7B at this node's N (FSDP's: between steps)
    figure: str  # per_gpu_gib in words, with what else the row has (host RAM, the other phase)
    when: str  # when a course reaches for it
    runs_here: bool = False  # the comparison row: what the lab runs


@dataclass(frozen=True)
class Setting:
    """N GPUs in all, G per node over M nodes."""

    ranks: int
    per_node: int
    nodes: int
    gpu_gib: float
    words: str  # how this node gave them, for the heading


def node_setting(node: Mapping[str, Any] | None = None) -> Setting:
    """Its GPUs where it has at least 2, else LAB.md's reference 4 (the world a simulated rank plays); its GPU's
    memory, else 80 GB."""
    gpus = (node or {}).get("gpus") or []
    memory = gpu_memory_gib(node or {})
    if len(gpus) >= 2:
        ranks, here = len(gpus), f"this node's {len(gpus)} GPUs"
    else:
        ranks, here = (
            SIMULATED_WORLD,
            f"LAB.md's {SIMULATED_WORLD} (this node has {len(gpus) or 'no'} GPU{'' if len(gpus) == 1 else 's'})",
        )
    gpu = f"this GPU's {memory:.1f} GiB" if memory else f"an {LAB_GPU_GIB:.0f} GiB GPU (none here)"
    return _setting(ranks, memory or LAB_GPU_GIB, here, gpu)


def reference_setting() -> Setting:
    return _setting(SIMULATED_WORLD, LAB_GPU_GIB, "LAB.md's reference GPUs", f"an {LAB_GPU_GIB:.0f} GiB GPU")


def _setting(ranks: int, gpu_gib: float, here: str, gpu: str) -> Setting:
    from lab_helpers.config.experiments import get_experiment

    nodes = get_experiment("multi-node").num_nodes
    words = f"N = {ranks}: {here}; G = {ranks} per node, M = {nodes} nodes (as `multi-node`); against {gpu}"
    return Setting(ranks, ranks, nodes, gpu_gib, words)


def rows(
    setting: Setting, *, exp_id: str = EXPERIMENT, profile: str = "gpu", model: ModelParts | None = None
) -> list[Parallelism]:
    """``model``: another experiment's parts, at ``exp_id``'s bytes per parameter."""
    from lab_helpers.config.experiments import resolve, resolve_path

    states = arithmetic.model_states(exp_id, profile=profile)
    run = resolve(exp_id, profile, check_files=False)
    parts = model or model_parts(str(resolve_path(run.recipe["checkpoint_dir"])))
    seq = int(run.recipe["train"]["max_seq_length"])
    b = states.trained  # bytes per parameter: weights, gradients, optimizer states
    total, w = b.total, b.weights
    n, g, m = setting.ranks, setting.per_node, setting.nodes

    def gib(params: float, per_param: float = total) -> float:
        return params * per_param / GIB

    def figure(value: float, extra: str = "") -> str:
        share = f" ({100 * value / setting.gpu_gib:.0f} % of the GPU)"
        return f"{value:.1f} GiB{share}" + (f"; {extra}" if extra else "")

    fsdp = arithmetic.fsdp_bytes_per_param(exp_id="fsdp", profile=profile)
    sharded_fsdp = gib(parts.total) / n
    accumulating = gib(parts.total, b.fsdp_accumulating(n))
    tp_split = parts.block_linear + parts.embedding + parts.head
    tp = gib(tp_split) / n + gib(parts.total - tp_split)
    per_stage = math.ceil(parts.layers / n) * parts.block
    stage = gib(per_stage + max(parts.embedding, parts.head + parts.final_norm))
    dense = parts.total - parts.experts
    expert = gib(parts.experts) / n + gib(dense)
    hsdp = gib(parts.total) / g
    zero_pp = gib(parts.total) / (g * m) + gib(parts.total, w) / g
    # ZeRO-Infinity: the planner's ZeRO-3 counts without the parameter shard, which now lives on the host
    live = min(parts.total, DS_MAX_LIVE_PARAMETERS, parts.block + DS_PREFETCH_BUCKET_NUMEL) + parts.root
    on_gpu = (live * w + DS_REDUCE_BUCKET_NUMEL * w) / GIB
    host_per_param = w + OFFLOADED_BYTES_PER_TRAINABLE_PARAM
    norms = parts.total - tp_split  # the blocks' norms and the final norm: tensor parallel keeps them whole
    return [
        Parallelism(
            "FSDP full shard (runs: `fsdp`)",
            "weights, gradients, optimizer states split over N GPUs, each block gathered while it computes; "
            "activations not split (each GPU its own samples)",
            f"{fsdp['sharded']}; {fsdp['accumulating']} while FSDP1 accumulates",
            sharded_fsdp,
            figure(sharded_fsdp, f"{accumulating:.1f} GiB while accumulating"),
            "the lab's answer when the model states do not fit one GPU",
            runs_here=True,
        ),
        Parallelism(
            "Tensor parallel",
            "each block's attention heads and MLP columns split over N GPUs, with their gradients and optimizer "
            "states (embedding and head split by vocabulary, norms whole); activations inside attention and MLP "
            "split, the block's inputs and outputs whole; activations all-reduced twice per block each way",
            f"{total:g}/N; the norms ({norms:,} parameters) {total:g}",
            tp,
            figure(tp),
            "layers too large or too slow for one GPU; inside one node (NVLink)",
        ),
        Parallelism(
            "Sequence parallel (with tensor parallel)",
            "the activations tensor parallel keeps whole (norms, dropout, residual) split along the sequence over "
            "the same N GPUs; all-reduces become reduce-scatter + all-gather (the same bytes)",
            "as tensor parallel",
            tp,
            figure(tp),
            "with tensor parallel, when the activations it keeps whole dominate (long sequences, large batches)",
        ),
        Parallelism(
            "Context parallel",
            "every layer's activations split along the sequence over N GPUs, keys and values passed around a ring "
            "for attention; model states not split (usually run with FSDP beside it)",
            f"{total:g}",
            gib(parts.total),
            figure(gib(parts.total)),
            f"long contexts whose activations exceed a GPU; not the lab's {seq} tokens",
        ),
        Parallelism(
            "Pipeline parallel",
            "the blocks split into N stages, one per GPU, with their gradients and optimizer states; activations "
            "sent only between stages; each stage holds the activations of the micro-batches in flight (1F1B: up "
            "to N on the first)",
            f"{total:g} on 1/N of the blocks (+ the embedding on the first stage, the head on the last)",
            stage,
            figure(stage, "the largest stage"),
            "models too large for one node, across nodes (little traffic); many micro-batches per step, since "
            "(N − 1)/(m + N − 1) of the time is idle with m of them (the bubble)",
        ),
        Parallelism(
            "Expert parallel",
            "a mixture-of-experts model's experts split over N GPUs, with their gradients and optimizer states; "
            "tokens sent to their expert's GPU and back (all-to-all); the rest not split",
            f"{total:g}/N on the experts ({100 * parts.experts / parts.total:.0f} % of the parameters here), "
            f"{total:g} on the rest",
            expert,
            figure(expert, f"{parts.name} is dense: no experts to split" if not parts.experts else ""),
            "mixture-of-experts models (Mixtral, DeepSeek); not the lab's dense models",
        ),
        Parallelism(
            "HSDP (FSDP hybrid shard)",
            "FSDP within each node's G GPUs, replicated across M nodes: the gathers stay inside the node; between "
            "nodes one all-reduce of each GPU's gradient shard per step",
            f"{total:g}/G whatever M ({fsdp['accumulating'].replace('N', 'G')} while FSDP1 accumulates)",
            hsdp,
            figure(hsdp, f"FSDP over all G × M = {g * m} GPUs: {gib(parts.total) / (g * m):.1f} GiB"),
            "several nodes with a slower network between them than inside",
        ),
        Parallelism(
            "ZeRO++ (on ZeRO-3)",
            "ZeRO-3 over G × M GPUs, weights gathered in int8 and gradients reduce-scattered in int4 (less "
            "traffic); hpZ keeps a second copy of the bf16 weights split over each node, so backward gathers "
            "inside the node",
            f"{total:g}/(G × M) + {w:g}/G (hpZ's copy)",
            zero_pp,
            figure(zero_pp),
            "ZeRO-3 across nodes on a slow network: less traffic between nodes for a little memory",
        ),
        Parallelism(
            "ZeRO-Infinity / parameter offload",
            "the weights moved to host RAM or NVMe too (DeepSpeed `offload_param`; FSDP's CPU offload likewise), "
            "beside `deepspeed-offload`'s optimizer; the GPU holds the weights being computed and the activations; "
            "every micro-batch copies the weights to the GPU over PCIe",
            f"GPU: {w:g} on the weights in use only; host: {w:g} + {OFFLOADED_BYTES_PER_TRAINABLE_PARAM} = "
            f"{host_per_param:g}",
            on_gpu,
            figure(on_gpu, f"the weights in use and a reduce bucket; host {gib(parts.total, host_per_param):.0f} GiB"),
            "a model too large for the GPUs even sharded, where fitting matters more than speed",
        ),
    ]


@dataclass(frozen=True)
class TensorParallelTraffic:
    """Megatron's all-reduces of the activations: two per block in the forward (after attention, after the MLP) and two
    in the backward, each of micro batch x tokens x hidden."""

    ranks: int
    all_reduces: int  # per micro-batch
    tensor_bytes: int  # one all-reduce's tensor
    tokens: int  # per sequence: the recipe's longest (micro-batches are padded to their own longest: an upper bound)
    micro_batch: int

    @property
    def link_bytes_per_gpu(self) -> float:
        """Ring all-reduce: 2(N - 1)/N of the tensor each; a lower bound."""
        return self.all_reduces * 2 * (self.ranks - 1) / self.ranks * self.tensor_bytes


def tensor_parallel_traffic(ranks: int, *, exp_id: str = EXPERIMENT, profile: str = "gpu") -> TensorParallelTraffic:
    from lab_helpers.config.experiments import resolve, resolve_path

    run = resolve(exp_id, profile, check_files=False)
    parts = model_parts(str(resolve_path(run.recipe["checkpoint_dir"])))
    train = run.recipe["train"]
    micro, tokens = int(train["micro_batch_size"]), int(train["max_seq_length"])
    weight = arithmetic.model_states(exp_id, profile=profile).trained.weights  # activations in the weights' dtype
    return TensorParallelTraffic(ranks, 4 * parts.layers, int(micro * tokens * parts.hidden * weight), tokens, micro)


def markdown(setting: Setting, *, exp_id: str = EXPERIMENT, profile: str = "gpu") -> str:
    states = arithmetic.model_states(exp_id, profile=profile)
    found = rows(setting, exp_id=exp_id, profile=profile)
    head = (
        f"{states.model} ({states.counts.total / 1e9:.2f}e9 parameters), {states.precision} with {states.optimizer}: "
        f"{states.trained.formula()} of model states on one GPU. Each parallelism alone; {setting.words}. "
        "Model states only: activations come on top."
    )
    lines = [
        head,
        "",
        "| parallelism | what it splits or moves | model states per GPU, B/param | per GPU here | a course reaches for it |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.name} | {r.moves} | {r.formula} | {r.figure} | {r.when} |" for r in found]
    return "\n".join(lines)


def show(node: Mapping[str, Any] | None = None, *, profile: str = "gpu") -> None:
    text = markdown(node_setting(node), profile=profile)
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        print(text)


DOC_START = (
    "<!-- generated by scripts/write_parallelisms_doc.py from lab_helpers.planning.parallelisms: do not edit -->"
)
DOC_END = "<!-- end of the generated table -->"


def doc_block() -> str:
    return f"{DOC_START}\n{markdown(reference_setting())}\n{DOC_END}"


def with_doc_block(text: str) -> str:
    start, end = text.find(DOC_START), text.find(DOC_END)
    if start < 0 or end < start:
        raise ValueError(f"no generated block: the page needs the lines {DOC_START!r} and {DOC_END!r}")
    return text[:start] + doc_block() + text[end + len(DOC_END) :]
