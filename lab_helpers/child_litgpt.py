"""Entry point of a single-GPU training process: litgpt's own CLI, plus what only this process can measure.

    python -m lab_helpers.child_litgpt finetune_full --config RUN_DIR/recipe.yaml

litgpt prints memory only on CUDA, only allocated, and in GB, and its "training time" includes validation.
This wrapper runs litgpt's unmodified CLI but wraps the finetune module's ``fit`` and ``validate`` so that it
can report peak allocated and reserved memory over training, seconds inside the training loop minus
validation, and the token counts ``fit`` returns. A CUDA OOM ends the process with status ``oom`` and the
allocator's message; the GPU is freed because the process is gone.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from typing import Any

from lab_helpers.child_report import cuda_peaks_gib, reset_cuda_peaks, status_for_exception, write_report
from lab_helpers.orphan_guard import start_orphan_guard

COMMANDS = {"finetune_full": "litgpt.finetune.full", "finetune_lora": "litgpt.finetune.lora"}
SAVE_ENV = "LAB_SAVE_CHECKPOINT"  # "1" keeps litgpt's final checkpoint; the lab measures, so off by default


class _TrainingClock:
    """Time inside ``fit`` minus time inside validation and example generation."""

    def __init__(self) -> None:
        self.fit_s: float | None = None
        self.excluded_s = 0.0
        self.token_counts: dict[str, Any] = {}

    @property
    def train_s(self) -> float | None:
        return None if self.fit_s is None else self.fit_s - self.excluded_s

    def wrap_fit(self, fit):
        def timed_fit(*args, **kwargs):
            reset_cuda_peaks()  # peak over the training run, not over loading the checkpoint
            start = time.perf_counter()
            self.excluded_s = 0.0
            result = fit(*args, **kwargs)
            self.fit_s = time.perf_counter() - start
            self.token_counts = dict(result or {})
            return result

        return timed_fit

    def wrap_excluded(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.excluded_s += time.perf_counter() - start

        return timed


def _skip_final_save() -> None:
    import lightning as L

    def save(self, path, state, filter=None):  # noqa: A002 - Fabric.save's own signature
        self.print(f"lab: not saving {path} (the lab measures time and memory; set {SAVE_ENV}=1 to keep weights)")

    L.Fabric.save = save


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m lab_helpers.child_litgpt {{{'|'.join(COMMANDS)}}} --config RECIPE", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # the runner's SIGTERM still produces a report
    start_orphan_guard()
    module = importlib.import_module(COMMANDS[argv[0]])
    clock = _TrainingClock()
    module.fit = clock.wrap_fit(module.fit)
    module.validate = clock.wrap_excluded(module.validate)
    module.generate_example = clock.wrap_excluded(module.generate_example)
    if os.environ.get(SAVE_ENV) != "1":
        _skip_final_save()

    status, error, code = "ok", None, 0
    try:
        from litgpt.__main__ import main as litgpt_main

        sys.argv = ["litgpt", *argv]
        litgpt_main()
    except SystemExit as exc:  # jsonargparse rejecting an argument, or an explicit exit
        if exc.code not in (0, None):
            status, error, code = (
                "error",
                f"litgpt exited with {exc.code}",
                exc.code if isinstance(exc.code, int) else 1,
            )
    except BaseException as exc:  # noqa: BLE001 - every ending must leave a report
        status, error = status_for_exception(exc)
        code = {"oom": 3, "interrupted": 130}.get(status, 1)
        print(error if status != "error" else error.rstrip().splitlines()[-1], file=sys.stderr)
        if status == "error":
            import traceback

            traceback.print_exception(exc)
    peak_alloc_gib, peak_reserved_gib = cuda_peaks_gib()
    write_report(
        {
            "status": status,
            "error": error,
            "world_size": 1,
            "peak_alloc_gib": peak_alloc_gib,
            "peak_reserved_gib": peak_reserved_gib,
            "train_s": clock.train_s,
            "tokens": clock.token_counts.get("raw_tokens_plus_prompt_template"),
            "tokens_padded": clock.token_counts.get("raw_tokens_plus_prompt_template_and_padding"),
            "device_name": _device_name(),
        }
    )
    return code


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


if __name__ == "__main__":
    sys.exit(main())
