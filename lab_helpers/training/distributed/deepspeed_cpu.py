"""Lightning's ``DeepSpeedStrategy`` let through on a CPU, so CI exercises the real ZeRO-3 + CPU-offload path.

Lightning refuses a non-CUDA accelerator in ``setup_environment`` and checks CUDA device indices in
``setup_distributed``; DeepSpeed itself runs on a CPU (``DS_ACCELERATOR=cpu``, gloo). Everything else --
``deepspeed.zero.Init`` around ``configure_model``, ``deepspeed.initialize``, the engine's backward and step --
is Lightning's and DeepSpeed's own code, so what CI runs is what a GPU runs minus the device and the C++ Adam
kernel (below). The changes: the two checks are skipped, and DeepSpeed's engine is given the local rank as its
device rank (a CPU device has no index, which DeepSpeed cannot compare).

Two of DeepSpeed's C++ ops are not built here, each 2-3 minutes of g++ on a 2-core machine and useless to the
ci profile's tiny models: the shared-memory all-reduce its CPU accelerator compiles when the process group
starts (used only by ``inference_all_reduce``; training's collectives go through gloo), and ``cpu_adam``
(torch's AdamW steps the offloaded states: ``deepspeed_config.optimizer_class_path``; the config gets
``zero_force_ds_cpu_optimizer: false`` so DeepSpeed accepts it).
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
    """Mark DeepSpeed's shared-memory all-reduce op incompatible, so starting the process group does not
    compile it (``deepspeed.comm.torch.build_shm_op`` builds only ops marked compatible; only
    ``inference_all_reduce`` would use it)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
