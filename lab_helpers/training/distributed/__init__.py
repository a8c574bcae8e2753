"""The multi-GPU section: the Lightning Trainer with the litgpt model under DDP, FSDP or DeepSpeed ZeRO-3.

The ``lightning-strategy`` launcher (``lab_helpers.launch``) calls :func:`build_command` and the lab runs the
argv it returns exactly like a single-GPU run; each rank of the training process reports for itself
(``lab_helpers.training.child_report``). Nothing heavy is imported here: the notebook imports this module cheaply.
"""

from lab_helpers.training.distributed.command import build_command
from lab_helpers.training.distributed.deepspeed_config import deepspeed_config

__all__ = ["build_command", "deepspeed_config"]
