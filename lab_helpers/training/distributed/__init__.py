"""The multi-GPU section: the Lightning Trainer with the litgpt model under DDP, FSDP or DeepSpeed ZeRO-3.

Nothing heavy is imported here: the notebook imports this module cheaply.
"""

from lab_helpers.training.distributed.command import build_command
from lab_helpers.training.distributed.deepspeed_config import deepspeed_config

__all__ = ["build_command", "deepspeed_config"]
