"""The lab's one error for bad input, in its own module so every checking module can raise it without a cycle."""

import difflib


class LabConfigError(ValueError):
    """Bad input found before any process starts; the message is one line naming the problem and the fix."""


def setup_function(command: str):
    """Its signature is the list of recipe keys and their types."""
    import importlib

    module = importlib.import_module("litgpt.finetune.full" if command == "finetune_full" else "litgpt.finetune.lora")
    return module.setup


def did_you_mean(word: str, choices, *, tight: bool = False) -> str:
    """``tight``: the choices are too many to list, so nothing is added when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return "" if tight else f"; known: {', '.join(sorted(choices))}"
