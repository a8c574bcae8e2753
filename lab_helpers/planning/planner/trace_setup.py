"""What the trace builds before it runs the step: the model at the run's precision on fake tensors, its activation
checkpointing, the forward's precision contexts, and the optimizer as the recipe asks for it.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from .errors import PlanError
from .fake_modules import CudaAutocastEmulation, NoStateOptimizer, PagedAdamWStandIn
from .optim8bit import AdamW8bitStandIn
from .spec import EIGHT_BIT_OPTIMIZERS, TrainingSpec


def _param_dtype(precision: str) -> torch.dtype:
    if precision == "bf16-true":
        return torch.bfloat16
    if precision == "16-true":
        return torch.float16
    return torch.float32


def precision_contexts(spec: TrainingSpec):
    """(module-init dtype, forward-context factory, output dtype) as Fabric's plugin would give them."""
    pdtype = _param_dtype(spec.precision)
    if spec.precision.endswith("-mixed"):
        low = torch.bfloat16 if spec.precision.startswith("bf16") else torch.float16
        return pdtype, lambda: CudaAutocastEmulation(low), low
    if pdtype != torch.float32:
        return pdtype, lambda: _default_dtype(pdtype), pdtype
    return pdtype, contextlib.nullcontext, None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def to_default_float(data):
    """Fabric's ``convert_output``: floating outputs become the default dtype (fp32)."""
    if isinstance(data, torch.Tensor):
        return data.to(torch.get_default_dtype()) if data.is_floating_point() else data
    if isinstance(data, list):
        return [to_default_float(d) for d in data]
    return data


def build_model(spec: TrainingSpec, pdtype: torch.dtype):
    config = copy.deepcopy(spec.model_config)
    if spec.method == "full":
        from litgpt.model import GPT

        with _default_dtype(pdtype):
            model = GPT(config)
    else:
        from litgpt.lora import GPT as LoRAGPT
        from litgpt.lora import Config as LoRAConfig
        from litgpt.lora import mark_only_lora_as_trainable

        if not isinstance(config, LoRAConfig):
            fields = {k: v for k, v in vars(config).items() if k in LoRAConfig.__dataclass_fields__}
            fields.pop("name", None)
            config = LoRAConfig(name=spec.model_config.name, **{**fields, **spec.lora})
        with _default_dtype(pdtype):
            model = LoRAGPT(config)
        mark_only_lora_as_trainable(model)
    return model


def torch_optimizer_kwargs(spec: TrainingSpec) -> tuple[dict, list[str]]:
    """Without the recipe's foreach/fused torch chooses by where the tensors are, and the trace's are fake CPU ones, so
    the device's choice is asked for explicitly. ``capturable=True`` needs CUDA tensors and is traced as False: the
    same parameter-sized temporaries."""
    kwargs = dict(spec.optimizer_kwargs)
    notes = []
    if kwargs.pop("capturable", None):
        notes.append(
            "optimizer capturable=True traced as False (it needs CUDA tensors): its step adds one-element "
            "tensors per parameter, not counted"
        )
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    if kwargs.get("foreach") is None and kwargs.get("fused") is None:
        kwargs["foreach"] = spec.device == "cuda"
    return kwargs, notes


def make_optimizer(spec: TrainingSpec, model: torch.nn.Module):
    params = list(model.parameters())
    if spec.method == "qlora":
        return PagedAdamWStandIn(params)
    if spec.optimizer == "DeepSpeedCPUAdam" or spec.strategy.startswith("deepspeed"):
        return NoStateOptimizer(params)  # ZeRO optimizer memory is analytic (see analytic.py)
    if spec.optimizer in EIGHT_BIT_OPTIMIZERS:  # bitsandbytes needs CUDA: its allocations, not its kernels
        return AdamW8bitStandIn(params, paged=spec.optimizer.startswith("Paged"))
    cls = getattr(torch.optim, spec.optimizer, None)
    if cls is None:
        raise PlanError(f"optimizer {spec.optimizer!r} is not a torch.optim class")
    kwargs, _ = torch_optimizer_kwargs(spec)
    try:
        # fused: one in-place op (_fused_adamw_) whose fake kernel allocates nothing, as CUDA's (ATen
        # fused_adamw_impl.cu: multi_tensor_apply in place over params, grads and both moments) and the CPU's
        # (measured on the ci profile: tests/test_optimizer_step.py) allocate nothing
        return cls(params, **kwargs)
    except (TypeError, RuntimeError, ValueError) as err:
        raise PlanError(f"optimizer {spec.optimizer} rejects its init_args: {err}") from None


def checkpoint_blocks(model: torch.nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    for block in model.transformer.h:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

        block.forward = forward
