"""The multi-GPU section: the Lightning Trainer with the litgpt model under DDP, FSDP or DeepSpeed ZeRO-3.

``lab_helpers.lab`` calls :func:`build_command` for experiments with ``kind: lightning`` and runs the argv it
returns exactly like a single-GPU run; each rank of the training process reports for itself
(``lab_helpers.child_report``). Nothing heavy is imported here: the notebook imports this module cheaply.
"""

from lab_helpers.distributed.command import build_command, total_iterations
from lab_helpers.distributed.deepspeed_config import deepspeed_config

__all__ = ["build_command", "deepspeed_config", "total_iterations"]
