"""Lightning's ``DeepSpeedStrategy`` let through on a CPU, so CI exercises the real ZeRO-3 + CPU-offload path.

Lightning refuses a non-CUDA accelerator in ``setup_environment`` and checks CUDA device indices in
``setup_distributed``; DeepSpeed itself runs on a CPU (``DS_ACCELERATOR=cpu``, gloo, its ``cpu_adam`` op built
with g++ on first use). Everything else -- ``deepspeed.zero.Init`` around ``configure_model``,
``deepspeed.initialize``, the engine's backward and step -- is Lightning's and DeepSpeed's own code, so
what CI runs is what a GPU runs minus the device. What changes is only about device placement: the two
checks are skipped and DeepSpeed's engine is given the local rank as its device rank (a CPU device has no
index, which DeepSpeed cannot compare).
"""

from __future__ import annotations

import argparse
import os

# must be set before deepspeed is first imported (its accelerator is chosen once, at import)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy  # noqa: E402
from lightning.pytorch.strategies.deepspeed import reset_seed  # noqa: E402


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """``DeepSpeedStrategy`` without its CUDA-only checks; for the lab's CPU (CI) profile only."""

    strategy_name = "deepspeed_cpu"

    def setup_environment(self) -> None:
        # skip DeepSpeedStrategy's "only supported on CUDA GPUs" check; DDPStrategy's setup is what it calls next
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        # DeepSpeedStrategy.setup_distributed minus _validate_device_index_selection (CPU devices have no index)
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        # DeepSpeedStrategy._setup_model_and_optimizer with device_rank=local_rank instead of the CPU's None
        import deepspeed

        deepspeed_engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return deepspeed_engine, deepspeed_optimizer
