"""The LightningModule: the litgpt GPT trained on the recipe's data with the recipe's optimizer and schedule.

It mirrors litgpt's ``finetune_full`` loop (chunked cross-entropy on shifted targets, warmup then cosine) so
the multi-GPU numbers compare with the single-GPU section's; what differs is only how the model is placed:
``configure_model`` builds it (meta device + mmap, or inside ZeRO-3's partitioned init) and, for FSDP2,
shards it per transformer block.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lab_helpers.training.distributed.deepspeed_config import CPU_ADAM_CLASS, cpu_adam_kwargs
from lab_helpers.training.distributed.model_loading import build_gpt_zero3, load_gpt, mapped_state_dict, param_dtype


class LitGPTFinetune(L.LightningModule):
    def __init__(
        self,
        recipe: dict[str, Any],
        *,
        checkpoint_dir: Path,
        strategy: str,
        fsdp_impl: str | None = None,
        wrap: str | None = None,
        optimizer_class: str,
        reshard_after_forward: bool = True,
        zero_gradients_in_place: bool = False,
    ) -> None:
        super().__init__()
        self.recipe = recipe
        self.checkpoint_dir = Path(checkpoint_dir)
        self.strategy_name = strategy
        self.fsdp_impl = fsdp_impl
        self.wrap = wrap
        self.optimizer_class = optimizer_class  # deepspeed_config.optimizer_class_path, derived by the caller
        self.reshard_after_forward = reshard_after_forward  # False: SHARD_GRAD_OP (ZeRO-2), FSDP2's form
        # DDP with gradient_as_bucket_view: zero the gradients instead of freeing them (see optimizer_zero_grad)
        self.zero_gradients_in_place = zero_gradients_in_place
        self.model: torch.nn.Module | None = None
        self.train_args = recipe.get("train") or {}
        # ZeRO-3 builds the model inside deepspeed.zero.Init, which patches tensor constructors: import litgpt
        # (its import builds tensors) and map the checkpoint now, outside it
        if strategy == "deepspeed-zero3":
            import litgpt.model  # noqa: F401
        self._zero3_state = mapped_state_dict(self.checkpoint_dir) if strategy == "deepspeed-zero3" else None

    # ------------------------------------------------------------------------------------------- model
    def configure_model(self) -> None:
        if self.model is not None:
            return
        max_len = self.train_args.get("max_seq_length")
        precision = str(self.recipe.get("precision") or "32-true")
        if self.strategy_name == "deepspeed-zero3":
            self.model = build_gpt_zero3(self.checkpoint_dir, self._zero3_state, max_seq_length=max_len)
            self._zero3_state = None
            return
        model = load_gpt(self.checkpoint_dir, precision=precision, max_seq_length=max_len)
        if self.fsdp_impl == "fsdp2":
            self._fully_shard(model)
        self.model = model

    def _fully_shard(self, model: torch.nn.Module) -> None:
        """FSDP2: each Block its own unit (gathered one at a time) when wrap=block, then the root.

        ``reshard_after_forward=False`` keeps each unit's gathered weights from its forward to its backward
        (SHARD_GRAD_OP): one all-gather per unit per step instead of two."""
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        reshard = self.reshard_after_forward
        if self.wrap == "block":
            for block in model.transformer.h:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        # the root unit (embedding, head, final norm; the whole model with wrap=none): torch's default (None) keeps
        # it whole from forward to backward, where it is needed first, as FSDP1 does; an explicit True would free
        # it after forward and gather it again for backward (measured on simulated ranks)
        fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False)

    # ------------------------------------------------------------------------------------------- step
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        from litgpt.utils import chunked_cross_entropy

        input_ids, targets = batch["input_ids"], batch["labels"]
        logits = self.model(input_ids)
        # shift the targets so that output n predicts token n+1 (as litgpt's finetune_full)
        return chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])

    # ------------------------------------------------------------------------------------------- optimizer
    def configure_optimizers(self) -> dict[str, Any]:
        from litgpt.finetune.full import get_lr_scheduler

        optimizer = self.build_optimizer(self.parameters())
        if self.global_rank == 0:  # said once in the log, so a student (and a test) sees which optimizer stepped
            print(f"[lab] optimizer: {type(optimizer).__name__}", flush=True)
        max_steps = int(self.train_args.get("max_steps") or 1)
        warmup = int(self.train_args.get("lr_warmup_steps") or 0)
        scheduler = get_lr_scheduler(optimizer, warmup_steps=warmup, max_steps=max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer) -> None:
        """DDP with bucket views: zero the gradients, never free them. Freed (torch's set_to_none), the next step's
        first micro-batches run under ``no_sync`` where DDP's reducer does not run, so autograd makes new gradient
        tensors beside the buckets -- a second copy of every gradient while accumulating. Zeroed, they stay views
        into the buckets and accumulate there."""
        optimizer.zero_grad(set_to_none=not self.zero_gradients_in_place)

    def build_optimizer(self, params) -> torch.optim.Optimizer:
        class_path = self.optimizer_class
        if class_path == CPU_ADAM_CLASS:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(params, **cpu_adam_kwargs(self.recipe))
        module_name, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module_name), name)
        optimizer = self.recipe.get("optimizer")
        init_args = dict(optimizer.get("init_args") or {}) if isinstance(optimizer, dict) else {}
        if "betas" in init_args:
            init_args["betas"] = tuple(init_args["betas"])
        return cls(params, **init_args)

    @property
    def weights_dtype(self) -> torch.dtype:
        return param_dtype(str(self.recipe.get("precision") or "32-true"))
