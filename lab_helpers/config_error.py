"""The lab's one error for bad input, in its own module so every checking module can raise it without a cycle."""


class LabConfigError(ValueError):
    """Bad input found before any process starts; the message is one line naming the problem and the fix."""


def setup_function(command: str):
    """litgpt's ``setup`` for a command: its signature is the list of recipe keys and their types."""
    import importlib

    module = importlib.import_module("litgpt.finetune.full" if command == "finetune_full" else "litgpt.finetune.lora")
    return module.setup
