"""Entry point of a single-GPU training process: litgpt's own CLI, plus what only this process can measure.

litgpt prints memory only on CUDA, only allocated, and in GB, and its "training time" includes validation. So its
unmodified CLI runs with ``fit``, ``validate`` and ``get_dataloaders`` wrapped; the lab's own switches
(``--compile``, ``--pad-multiple``, ...) are taken out of the argv before litgpt reads it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.recipe_defaults import ATTENTION_BACKENDS, BATCH_ORDERS, COMPILE_MODES, COMPILE_TARGETS
from lab_helpers.config.record_schema import GIB
from lab_helpers.training import activation_checkpointing, attention_backend, compile_blocks, loop_clock, pad_batches
from lab_helpers.training.child_report import (
    cuda_peaks_gib,
    device_name,
    device_uuid,
    reset_cuda_peaks,
    status_for_exception,
    whole_run_peak_gib,
    write_report,
)
from lab_helpers.training.loop_clock import LoopClock
from lab_helpers.training.orphan_guard import start_orphan_guard
from lab_helpers.training.quick_mode import (
    BATCH_ORDER_FLAG,
    put_longest_batch_in_second_step,
    quick_from_env,
    warmup_steps,
)
from lab_helpers.training.quick_stop import QuickStop
from lab_helpers.training.tensor_peak import LiveTensorPeak, PeakPhase
from lab_helpers.training.torch_trace import steps_from_env
from lab_helpers.training.trace_hook import TraceHook

COMMANDS = {"finetune_full": "litgpt.finetune.full", "finetune_lora": "litgpt.finetune.lora"}
TENSOR_PEAK_ENV = "LAB_TENSOR_PEAK"
SAVE_ENV = "LAB_SAVE_CHECKPOINT"  # "1" keeps litgpt's final checkpoint; the lab measures, so off by default


class _Training:
    def __init__(self, *, trace_steps: int | None = None) -> None:
        self.clock = LoopClock()
        self.trace = TraceHook(trace_steps)
        self.quick_stop = QuickStop(self.clock, self.trace)

    def watch_batches(
        self, dataloader, *, accumulation: int, epochs: int | None, warmup_steps: int = 1, quick: bool = False,
        train_args: Any = None, judge_stable: bool = True,
    ) -> _WatchedBatches:  # fmt: skip
        warmup_iterations = accumulation * warmup_steps
        self.clock.start_loop(warmup_iterations=warmup_iterations)
        self.quick_stop.start_loop(
            quick=quick, accumulation=accumulation, train_args=train_args, judge_stable=judge_stable
        )
        self.trace.start_loop(accumulation=accumulation, warmup_iterations=warmup_iterations, quick=quick)
        return _WatchedBatches(dataloader, self, epochs=epochs, train_args=train_args)

    def saw_batch(self, batch: Mapping[str, Any]) -> None:
        """The clock's start time first, so that starting the profiler is not the batch's time."""
        iteration = self.clock.start_batch()
        self.trace.at_batch(iteration)
        self.clock.count_untimed_tokens(batch)

    def report_fields(self) -> dict[str, Any]:
        return {
            **loop_clock.timings(self.clock),
            **loop_clock.host_fields(self.clock),
            **self.quick_stop.fields(),
            **self.trace.fields,
        }


class _FitWrapper:
    def __init__(
        self, training: _Training, *, checkpoint_blocks: bool = False, whole_run_tensors: LiveTensorPeak | None = None,
        compile_mode: tuple[str, str] | None = None, attention: str | None = None,
    ) -> None:  # fmt: skip
        self.training = training
        self.checkpoint_blocks = checkpoint_blocks
        self.compile_mode = compile_mode  # (mode torch.compile is given, why it is not the one asked for or "")
        self.compile_watch = compile_blocks.CompileWatch()
        self.attention = attention
        self.whole_run_tensors = whole_run_tensors
        self.tensor_peak_bytes: int | None = None
        self.alloc_before_fit_gib: float | None = None  # on CUDA: max_memory_allocated before fit's reset
        self.peak_phases: PeakPhase | None = None

    def wrap(self, fit):
        def timed_fit(*args, **kwargs):
            # peak over the training run, not over loading the checkpoint; the load's peak is kept for the whole run
            self.alloc_before_fit_gib = reset_cuda_peaks()
            model = _model_of(args, kwargs)
            if self.checkpoint_blocks:
                wrapped = activation_checkpointing.checkpoint_blocks(model)
                print(f"lab: activation checkpointing on {wrapped} blocks (torch.utils.checkpoint, non-reentrant)")
            if self.compile_mode is not None:
                self._compile(model)
            if self.whole_run_tensors is not None and model is not None:
                self.whole_run_tensors.seed([*model.parameters(), *model.buffers()])  # the training peak starts here
            self._watch_peak_phases(args, kwargs)
            self.training.clock.start_fit()
            try:
                with attention_backend.only_backend(self.attention) if self.attention else contextlib.nullcontext():
                    result = fit(*args, **kwargs)
            finally:
                if self.peak_phases is not None:
                    self.peak_phases.boundary("end of training")
                if self.whole_run_tensors is not None and model is not None:
                    self.tensor_peak_bytes = self.whole_run_tensors.peak_bytes
            self.training.clock.end_fit(result)
            self.training.trace.finish()  # after the clock stopped: writing the trace is not training time
            return result

        return timed_fit

    def _compile(self, model: Any) -> None:
        mode, why = self.compile_mode
        count = compile_blocks.compile_blocks(model, mode)
        self.compile_watch.start(f"blocks ({count}, mode {mode}{'; ' + why if why else ''})")
        print(f"lab: compiled {self.compile_watch.compiled}: torch.compile per block, compiling at the first forward")

    def outside_the_loop(self, function: Callable) -> Callable:
        if self.compile_mode is not None:
            function = compile_blocks.eager(function)
        if self.attention:
            function = attention_backend.any_backend(function)
        return function

    def _watch_peak_phases(self, args: tuple, kwargs: dict) -> None:
        fabric, optimizer = _fabric_and_optimizer(args, kwargs)
        if optimizer is not None:
            print(optimizer_words(optimizer))
        if self.whole_run_tensors is not None:
            tensors = self.whole_run_tensors
            self.peak_phases = PeakPhase(lambda: tensors.peak_bytes)
        elif _on_cuda():
            import torch

            self.peak_phases = PeakPhase(torch.cuda.max_memory_allocated)
        if self.peak_phases is None or fabric is None or optimizer is None:
            return
        fabric.backward = self.peak_phases.wrap(fabric.backward, "backward", before="forward")
        optimizer.step = self.peak_phases.wrap(optimizer.step, "optimizer step", before="before the optimizer step")

    def watch_phase(self, function: Callable, phase: str) -> Callable:

        def watched(*args, **kwargs):
            if self.peak_phases is not None:
                self.peak_phases.boundary("after the optimizer step")
            try:
                return function(*args, **kwargs)
            finally:
                if self.peak_phases is not None:
                    self.peak_phases.boundary(phase)

        return watched

    def report_fields(self) -> dict[str, Any]:
        tensors = self.whole_run_tensors
        return {
            "peak_tensor_gib": None if self.tensor_peak_bytes is None else self.tensor_peak_bytes / GIB,
            "peak_tensor_whole_run_gib": None if tensors is None else tensors.whole_run_peak_gib,
            "peak_phase": None if self.peak_phases is None else self.peak_phases.phase,
            **self.compile_watch.fields(),
        }


class _WatchedBatches:
    """litgpt draws one batch past the last epoch and stops without training on it: that one is not counted."""

    def __init__(self, dataloader, training: _Training, *, epochs: int | None, train_args: Any) -> None:
        self._dataloader = dataloader
        self._training = training
        self._epochs = epochs
        self._train_args = train_args  # litgpt's TrainArgs, the object its fit loop reads ``epochs`` from
        self._passes = 0
        self._held = None  # the batch drawn when quick mode's rule ended the timing (never trained on)

    def __iter__(self):
        self._passes += 1
        if self._held is not None:  # the loop ended on it: litgpt draws once more, sees the epoch limit and stops
            yield self._held
            return
        # (a quick run whose timing ended but whose profiled steps run on reaches here too when the data set's pass
        # ends first: the next pass trains on, until the profiled window ends the loop)
        trained = self._epochs is None or self._passes <= self._epochs
        for batch in self._dataloader:
            if trained and self._training.quick_stop.should_stop():
                # end this pass and make it the last epoch: litgpt's own check (``epoch >= train.epochs``) then
                # ends the loop before training on another batch; no DataLoader is started again for it
                self._held = batch
                self._epochs = self._passes
                if self._train_args is not None:
                    self._train_args.epochs = self._passes
                return
            if trained:
                self._training.saw_batch(batch)
            yield batch

    def __len__(self) -> int:
        return len(self._dataloader)

    def __getattr__(self, name: str):
        return getattr(self._dataloader, name)


def _wrap_get_dataloaders(
    get_dataloaders, training: _Training, *, quick: bool, batch_order: str = "shuffle", pad: int | str | None = None
):
    judge_stable = batch_order == "shuffle"  # length-grouped micro-batches differ in length by design

    def wrapped(fabric, data, tokenizer, train):
        accumulation = train.gradient_accumulation_iters(fabric.world_size, 1)  # devices x nodes = world size
        if quick or batch_order != "shuffle":
            put_longest_batch_in_second_step(
                data, train.micro_batch_size, accumulation, batch_order=batch_order, warmup=quick
            )
        if pad is not None:
            pad_batches.pad_train_batches(data, pad)
        train_loader, val_loader = get_dataloaders(fabric, data, tokenizer, train)
        steps = warmup_steps(train.max_steps, quick=quick)  # quick: the peak step is warm-up too
        watched = training.watch_batches(
            train_loader, accumulation=accumulation, epochs=train.epochs, warmup_steps=steps, quick=quick,
            train_args=train, judge_stable=judge_stable,
        )  # fmt: skip
        return watched, val_loader

    return wrapped


def _skip_final_save(module) -> None:
    """The lab measures; LoRA's ``merge_lora`` alone writes a full model copy (26 GB for 13B, minutes), and a disk
    filling half-way turns a finished run into an error."""
    import lightning as L

    def say(path) -> None:
        print(f"lab: not saving {path} (the lab measures time and memory; set {SAVE_ENV}=1 to keep weights)")

    def save(self, path, state, filter=None):  # noqa: A002 - Fabric.save's own signature
        if self.is_global_zero:
            say(path)

    L.Fabric.save = save
    if hasattr(module, "save_lora_checkpoint"):
        module.save_lora_checkpoint = lambda fabric, model, file_path: say(file_path) if fabric.is_global_zero else None
    if hasattr(module, "merge_lora"):
        module.merge_lora = lambda checkpoint_dir, **_: say(f"a merged model in {checkpoint_dir}")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m lab_helpers.training.child_litgpt {{{'|'.join(COMMANDS)}}} --config RECIPE", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)  # the runner's SIGTERM still produces a report
    start_orphan_guard()
    module = importlib.import_module(COMMANDS[argv[0]])
    training = _Training(trace_steps=steps_from_env())
    checkpoint_blocks = activation_checkpointing.FLAG in argv
    if checkpoint_blocks:  # the lab's switch, not litgpt's: litgpt's CLI never sees it
        argv.remove(activation_checkpointing.FLAG)
    levers = take_levers(argv)
    whole_run_tensors = None
    count_tensors = not _on_cuda() and os.environ.get(TENSOR_PEAK_ENV) != "0"
    if count_tensors and levers.compile_target:
        # the count is a TorchDispatchMode, and torch.compile runs a frame called under one eagerly, for good
        print("lab: no live-tensor count (peak_tensor_gib) on a compiled CPU run: its dispatch mode would keep "
              f"torch.compile from compiling; compare times with runs made with {TENSOR_PEAK_ENV}=0", flush=True)  # fmt: skip
        count_tensors = False
    if count_tensors:
        # a CPU has no max_memory_allocated: count live tensors from before the checkpoint is loaded
        # (LAB_TENSOR_PEAK=0 turns it off)
        whole_run_tensors = LiveTensorPeak()
    fit = _FitWrapper(
        training, checkpoint_blocks=checkpoint_blocks, whole_run_tensors=whole_run_tensors, attention=levers.attention,
        compile_mode=compile_blocks.effective_mode(levers.compile_mode, on_cuda=_on_cuda())
        if levers.compile_target else None,
    )  # fmt: skip
    module.fit = fit.wrap(module.fit)
    # validation and example generation: out of the clock's time, phases of the peak watch (inside that window), and
    # without the loop's levers
    module.validate = training.clock.wrap_excluded(fit.watch_phase(fit.outside_the_loop(module.validate), "validation"))
    module.generate_example = training.clock.wrap_excluded(
        fit.watch_phase(fit.outside_the_loop(module.generate_example), "example generation")
    )
    module.get_dataloaders = _wrap_get_dataloaders(
        module.get_dataloaders, training, quick=quick_from_env(), batch_order=levers.batch_order, pad=levers.pad
    )
    if os.environ.get(SAVE_ENV) != "1":
        _skip_final_save(module)

    status, error, code = _run_litgpt(argv, whole_run_tensors)
    for reason in fit.compile_watch.reasons():
        print(f"lab: recompiled: {reason.strip()}")
    peak_alloc_gib, peak_reserved_gib = cuda_peaks_gib()
    write_report(
        {
            "status": status,
            "error": error,
            "world_size": 1,
            "peak_alloc_gib": peak_alloc_gib,
            "peak_reserved_gib": peak_reserved_gib,
            "peak_alloc_whole_run_gib": whole_run_peak_gib(fit.alloc_before_fit_gib, peak_alloc_gib),
            **training.report_fields(),
            **fit.report_fields(),
            "device_name": device_name(),
            "device_uuid": device_uuid(),
        }
    )
    return code


def _run_litgpt(argv: list[str], whole_run_tensors: LiveTensorPeak | None) -> tuple[str, str | None, int]:
    status, error, code = "ok", None, 0
    try:
        from litgpt.__main__ import main as litgpt_main

        sys.argv = ["litgpt", *argv]
        if whole_run_tensors is None:
            litgpt_main()
        else:
            with whole_run_tensors:
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
    return status, error, code


def _fabric_and_optimizer(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``fit(fabric, state, ...)`` for full fine-tuning, ``fit(fabric, model, optimizer, ...)`` for LoRA."""
    fabric = kwargs.get("fabric", args[0] if args else None)
    optimizer = kwargs.get("optimizer", args[2] if len(args) > 2 else None)
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    if isinstance(state, dict):
        optimizer = state.get("optimizer")
    return fabric, optimizer if hasattr(optimizer, "step") else None


def optimizer_words(optimizer: Any) -> str:
    """What the planner was asked about (``planner.spec.step_implementation``), in the run's own log."""
    from lab_helpers.planning.planner.spec import step_implementation

    inner = getattr(optimizer, "optimizer", optimizer)  # Fabric's _FabricOptimizer wraps the optimizer
    name = f"{type(inner).__module__}.{type(inner).__name__}"
    defaults = getattr(inner, "defaults", None) or {}
    if "foreach" not in defaults:
        return f"lab: optimizer {name}"
    params = [p for group in inner.param_groups for p in group["params"]]
    device = params[0].device.type if params else "cpu"
    foreach, fused = defaults.get("foreach"), defaults.get("fused")
    implementation = step_implementation(foreach, fused, device)
    return f"lab: optimizer {name} foreach={foreach} fused={fused} on {device}: the {implementation} step"


@dataclass(frozen=True)
class Levers:
    batch_order: str = "shuffle"
    compile_target: str | None = None
    compile_mode: str = "default"
    pad: int | str | None = None
    attention: str | None = None


def take_levers(argv: list[str]) -> Levers:
    batch_order = _take_choice(argv, BATCH_ORDER_FLAG, BATCH_ORDERS) or "shuffle"
    compile_target = _take_choice(argv, compile_blocks.FLAG, COMPILE_TARGETS)
    compile_mode = _take_choice(argv, compile_blocks.MODE_FLAG, COMPILE_MODES) or "default"
    pad_text = _take_value(argv, pad_batches.FLAG)
    try:
        pad = None if pad_text is None else pad_batches.parse_pad(pad_text)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    attention = _take_choice(argv, attention_backend.FLAG, tuple(ATTENTION_BACKENDS))
    return Levers(batch_order, compile_target, compile_mode, pad, attention)


def _take_value(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    at = argv.index(flag)
    value = argv[at + 1] if at + 1 < len(argv) else ""
    del argv[at : at + 2]
    return value


def _take_choice(argv: list[str], flag: str, choices: tuple[str, ...]) -> str | None:
    value = _take_value(argv, flag)
    if value is not None and value not in choices:
        raise SystemExit(f"{flag} {value!r}: expected one of {', '.join(choices)}")
    return value


def _model_of(args: tuple, kwargs: dict) -> Any:
    if kwargs.get("model") is not None:
        return kwargs["model"]
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    return state.get("model") if isinstance(state, dict) else None


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
