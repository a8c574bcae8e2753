"""Lightning's ``DeepSpeedStrategy`` let through on a CPU, so CI exercises the real ZeRO-3 + CPU-offload path.

DeepSpeed runs on a CPU (``DS_ACCELERATOR=cpu``, gloo); only Lightning's two CUDA checks refuse it. Two C++ ops are
not built, each 2-3 minutes of g++ on 2 cores and useless to tiny models: the shared-memory all-reduce (inference
only) and ``cpu_adam`` (torch's AdamW steps the offloaded states instead).
"""

from __future__ import annotations

import argparse
import os

# must be set before deepspeed is first imported (its accelerator is chosen once, at import)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy  # noqa: E402
from lightning.pytorch.strategies.deepspeed import reset_seed  # noqa: E402


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    strategy_name = "deepspeed_cpu"

    def __init__(self, *, config: dict, **kwargs) -> None:
        # a torch optimizer steps the offloaded states on a CPU (see the module docstring)
        super().__init__(config={**config, "zero_force_ds_cpu_optimizer": False}, **kwargs)

    def setup_environment(self) -> None:
        # skip DeepSpeedStrategy's "only supported on CUDA GPUs" check; DDPStrategy's setup is what it calls next
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        # DeepSpeedStrategy.setup_distributed minus _validate_device_index_selection (CPU devices have no index)
        reset_seed()
        self.set_world_ranks()
        _skip_inference_shm_build()
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


def _skip_inference_shm_build() -> None:
    """``deepspeed.comm.torch.build_shm_op`` builds only ops marked compatible."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
