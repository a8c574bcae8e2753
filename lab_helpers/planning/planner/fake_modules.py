"""Stand-ins for what cannot run on fake CPU tensors but whose memory behaviour is known.

* ``NF4Linear``: bitsandbytes' ``Linear4bit`` as Lightning's ``BitsandbytesPrecision`` builds it (read in bnb
  0.49.2): bnb's exact bytes, the whole weight dequantized for each matmul as ``MatMul4Bit`` does;
* ``PagedAdamWStandIn``: litgpt's QLoRA optimizer, its 32-bit states paged (CUDA managed memory, invisible to
  ``max_memory_allocated``) for tensors of at least 1e5 elements;
* ``CudaAutocastEmulation``: CPU autocast casts differently (it keeps ``log_softmax`` in bf16 where CUDA uses fp32).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ._compat import pytree

NF4_BLOCK = 64  # bnb 4-bit blocksize: one absmax per 64 weights
DQ_BLOCK = 256  # double quantization: the 8-bit absmax values are quantized again in blocks of 256
PAGED_MIN_NUMEL = 100_000  # bnb pages optimizer state tensors of at least this many elements


def nf4_storage_bytes(numel: int, double_quant: bool) -> dict[str, int]:
    blocks = math.ceil(numel / NF4_BLOCK)
    parts = {"packed": math.ceil(numel / 2)}
    if double_quant:
        parts["absmax_u8"] = blocks
        parts["absmax2_fp32"] = 4 * math.ceil(blocks / DQ_BLOCK)
        parts["code_fp32"] = 4 * 256
    else:
        parts["absmax_fp32"] = 4 * blocks
    return parts


QUANT_STATE_DTYPE = torch.float16
"""Lightning's ``_Linear4bit.quantize`` quantizes ``weight.to(torch.half)``, so ``dequantize_4bit`` returns fp16
whatever the compute dtype."""


def _dequantized(like: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``F.dequantize_4bit(B, quant_state).to(A.dtype)`` (bnb 0.49.2): an fp16 copy of the weight, then, unless the
    compute dtype is fp16, a second one in it; both alive while ``.to`` runs."""
    fp16 = torch.empty(*shape, dtype=QUANT_STATE_DTYPE, device=like.device)
    return fp16 if like.dtype == QUANT_STATE_DTYPE else fp16.to(like.dtype)


class _DequantMatmul(torch.autograd.Function):
    """Dequantized weights live only during each matmul. bnb >= 0.43.2 keeps nothing per token
    (``ctx.tensors = (None, B)``); earlier releases kept ``(A, B)`` (``keeps_input``) as a plain attribute, not
    ``save_for_backward``, so ``A`` dies with the graph, not after the node's backward. Where no input needs a
    gradient no node is recorded, as in bnb."""

    @staticmethod
    def forward(ctx, x, packed, out_features, in_features, keeps_input):
        y = F.linear(x, _dequantized(x, (out_features, in_features)))
        ctx.shape = (out_features, in_features)
        if keeps_input:
            ctx.kept_input = x  # bitsandbytes 0.42: ctx.tensors = (A, B)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad @ _dequantized(grad, ctx.shape), None, None, None, None


class NF4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, double_quant: bool, keeps_input: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.keeps_input = keeps_input
        device = linear.weight.device
        for name, nbytes in nf4_storage_bytes(linear.weight.numel(), double_quant).items():
            self.register_buffer(name, torch.empty(nbytes, dtype=torch.uint8, device=device))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    @property
    def weight(self) -> torch.Tensor:
        """The packed 4-bit storage (litgpt only reads its device)."""
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _DequantMatmul.apply(x, self.packed, self.out_features, self.in_features, self.keeps_input)
        return y if self.bias is None else y + self.bias


def quantize_linears(model: nn.Module, double_quant: bool, keeps_input: bool = False) -> int:
    """Lightning's bnb plugin converts every plain ``nn.Linear``, lm_head included."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, NF4Linear(child, double_quant, keeps_input))
                count += 1
    return count


class StableEmbedding(nn.Module):
    """bnb.nn.StableEmbedding: embedding + LayerNorm computed in the default dtype; trainable by default."""

    def __init__(self, num: int, dim: int, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim, dtype=dtype, device=device))
        self.norm = nn.LayerNorm(dim, dtype=dtype, device=device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        emb = F.embedding(idx, self.weight).to(torch.get_default_dtype())
        return self.norm(emb).to(self.weight.dtype)


class PagedAdamWStandIn(torch.optim.Optimizer):
    """Allocates what bnb PagedAdamW allocates on the CUDA allocator; counts the paged rest."""

    def __init__(self, params) -> None:
        super().__init__(params, {})
        self.paged_bytes = 0

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D401 - memory only, no math
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if state:
                    continue
                state["step"] = 0
                if p.numel() >= PAGED_MIN_NUMEL:
                    state["paged"] = True
                    self.paged_bytes += 2 * 4 * p.numel()
                else:
                    state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                    state["state2"] = torch.zeros_like(p, dtype=torch.float32)


class CudaDropout(nn.Module):
    """``nn.Dropout`` as CUDA runs it: the fused kernel keeps a 1-byte bool mask for backward. (On CPU, dropout
    multiplies by a noise tensor of the input's dtype, which would overstate LoRA activations.)"""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.ops.aten.native_dropout.default(x, self.p, True)[0]


def use_cuda_dropout(model: nn.Module) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, CudaDropout(child.p))
                count += 1
    return count


class NoStateOptimizer(torch.optim.Optimizer):
    """A placeholder step for optimizers whose state lives off the GPU (DeepSpeedCPUAdam)."""

    def __init__(self, params) -> None:
        super().__init__(params, {})

    def step(self, closure=None):
        return None


_LOWER = {
    "linear",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "addbmm",
    "scaled_dot_product_attention",
    "conv1d",
    "conv2d",
    "prelu",
    "chain_matmul",
}
_FP32 = {
    "log_softmax",
    "softmax",
    "cross_entropy",
    "nll_loss",
    "layer_norm",
    "group_norm",
    "rsqrt",
    "pow",
    "__pow__",
    "exp",
    "log",
    "log1p",
    "expm1",
    "reciprocal",
    "softplus",
    "sum",
    "cumsum",
    "cumprod",
    "prod",
    "logsumexp",
    "norm",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "cosine_similarity",
    "rms_norm",
}


class CudaAutocastEmulation(TorchFunctionMode):
    """At the torch-function level, so autograd records the casts as it does the real ones; weight casts of leaf tensors
    that require grad are cached, as CUDA autocast does."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        _, self._tree_map = pytree()

    def _lower(self, t):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return t
        if t.is_leaf and t.requires_grad and t._base is None:
            entry = self._cache.get(id(t))
            if entry is None or entry[0] is not t:
                entry = self._cache[id(t)] = (t, t.to(self.dtype))  # keeps t alive, so its id stays unique
            return entry[1]
        return t.to(self.dtype)

    def _upper(self, t):
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16):
            return t.float()
        return t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _LOWER:
            args, kwargs = self._tree_map(self._lower, (args, kwargs))
        elif name in _FP32 and "dtype" not in kwargs:
            args, kwargs = self._tree_map(self._upper, (args, kwargs))
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        self._cache.clear()
        return super().__exit__(*exc)
