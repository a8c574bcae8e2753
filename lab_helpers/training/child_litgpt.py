"""Entry point of a single-GPU training process: litgpt's own CLI, plus what only this process can measure.

    python -m lab_helpers.training.child_litgpt finetune_full --config RUN_DIR/recipe.yaml [--activation-checkpointing]
        [--batch-order length-grouped]

litgpt prints memory only on CUDA, only allocated, and in GB, and its "training time" includes validation.
This wrapper runs litgpt's unmodified CLI but wraps the finetune module's ``fit``, ``validate`` and
``get_dataloaders`` so that it can report peak allocated and reserved memory over training (on a CPU: the peak
of live tensor bytes, ``tensor_peak``) and the same peaks over the whole process (checkpoint load included, as
litgpt prints them: ``peak_alloc_whole_run_gib``, ``peak_tensor_whole_run_gib``), seconds inside the training
loop minus validation with the first optimizer step timed apart as warm-up, and the token counts of the timed
part. In quick mode (``quick_mode``) the longest samples open the second optimizer step, which is warm-up too, and
the timing stops at an optimizer step's end once quick mode's stopping rule says so (``quick_mode.stop_reason``:
the loop is ended through litgpt's own epoch check). No weights are saved unless asked. ``--activation-checkpointing`` (the lab's switch, not litgpt's) wraps every transformer block
in ``torch.utils.checkpoint`` before ``fit`` (``activation_checkpointing``). ``--batch-order length-grouped`` (the
lab's too) trains on micro-batches of samples of similar length (``quick_mode.LengthGroupedSampler``), in quick and
full mode; its quick run is never ``stable`` by the rule (its micro-batches differ in length by design). A CUDA OOM
ends the process with status ``oom`` and the allocator's message; the GPU is freed because the process is gone.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab_helpers.config.recipe_defaults import BATCH_ORDERS
from lab_helpers.config.record_schema import GIB
from lab_helpers.training import activation_checkpointing
from lab_helpers.training.child_report import (
    cuda_peaks_gib,
    device_name,
    device_uuid,
    reset_cuda_peaks,
    status_for_exception,
    whole_run_peak_gib,
    write_report,
)
from lab_helpers.training.orphan_guard import start_orphan_guard
from lab_helpers.training.quick_mode import (
    BATCH_ORDER_FLAG,
    put_longest_batch_in_second_step,
    quick_from_env,
    stable_halves_pct,
    stop_reason,
    warmup_steps,
)
from lab_helpers.training.step_profile import DIR_ENV as PROFILE_DIR_ENV
from lab_helpers.training.step_profile import StepProfiler, steps_from_env
from lab_helpers.training.tensor_peak import LiveTensorPeak, PeakPhase

COMMANDS = {"finetune_full": "litgpt.finetune.full", "finetune_lora": "litgpt.finetune.lora"}
TENSOR_PEAK_ENV = "LAB_TENSOR_PEAK"
SAVE_ENV = "LAB_SAVE_CHECKPOINT"  # "1" keeps litgpt's final checkpoint; the lab measures, so off by default


class _TrainingClock:
    """Time inside ``fit`` minus validation and example generation, with the first optimizer step timed apart.

    The first optimizer step is warm-up (kernel selection, allocator growth, optimizer states being created;
    in quick mode the peak step after it too, ``quick_warmup_steps``):
    ``train_s`` and the token counts cover the iterations after it, ``warmup_s`` the iterations of it. The
    clock sees each training batch as litgpt asks for it (``watch_batches``), so it needs nothing from litgpt's
    loop beyond the batches it draws. A run shorter than two optimizer steps has no steady part: then the
    whole loop is timed and ``warmup_iterations`` is 0.
    """

    def __init__(self) -> None:
        self.fit_start: float | None = None
        self.fit_end: float | None = None
        self.excluded: list[tuple[float, float]] = []
        self.batch_starts: list[float] = []  # when each trained batch was asked for
        self.warmup_iterations = 0  # micro-batches in one optimizer step, from the recipe
        self.warmup_tokens = [0, 0]  # (tokens, padded tokens) of the warm-up batches
        self.epochs: int | None = None
        self.token_counts: dict[str, Any] = {}
        self.checkpoint_blocks = False  # --activation-checkpointing: wrap every Block before litgpt's fit
        # on a CPU: live tensors over the whole process (``whole_run_tensors``, started before litgpt loads the
        # checkpoint); ``tensor_peak_bytes`` is its peak between the start and the end of ``fit``
        self.whole_run_tensors: LiveTensorPeak | None = None
        self.tensor_peak_bytes: int | None = None
        self.alloc_before_fit_gib: float | None = None  # on CUDA: max_memory_allocated before fit's reset
        # the phase of the loop in which the training peak was first reached (tensor_peak.PeakPhase: backward,
        # optimizer step, ...), read at fabric.backward's and optimizer.step's boundaries
        self.peak_phases: PeakPhase | None = None
        # the process's CPU time (time.process_time: every thread, the autograd engine's included) and the monotonic
        # clock where the timed loop starts and ends, and the CPU time of validation inside it: host_core_pct and
        # loop_monotonic_s
        self.thread_s: dict[str, float] = {}
        self.monotonic_s: dict[str, float] = {}
        self.excluded_thread_s: list[tuple[float, float]] = []  # (perf_counter start, thread seconds)
        self.profile_steps: int | None = None  # --profile-steps N (step_profile), off by default
        self.profiler: StepProfiler | None = None
        self.profile_fields: dict[str, Any] = {}
        # quick mode's stopping rule (quick_mode.stop_reason), asked at every optimizer step's end after warm-up
        self.quick = False
        self.judge_stable = True  # False for a length-grouped run: only the rule's caps or the run's end stop it
        self.accumulation = 1
        self.train_args: Any = None  # litgpt's TrainArgs, the object its fit loop reads ``epochs`` from
        self.quick_stop: str | None = None
        self.quick_stop_halves_pct: float | None = None
        # quick mode with --profile-steps: (perf_counter, process_time) when the timing ended and the profiled steps
        # began, and the tokens and padded tokens of those steps (left out of the timed part like warm-up's)
        self.after_timing: tuple[float, float] | None = None
        self.after_timing_tokens = [0, 0]

    def wrap_fit(self, fit):
        def timed_fit(*args, **kwargs):
            # peak over the training run, not over loading the checkpoint; the load's peak is kept for the whole run
            self.alloc_before_fit_gib = reset_cuda_peaks()
            model = _model_of(args, kwargs)
            if self.checkpoint_blocks:
                wrapped = activation_checkpointing.checkpoint_blocks(model)
                print(f"lab: activation checkpointing on {wrapped} blocks (torch.utils.checkpoint, non-reentrant)")
            if self.whole_run_tensors is not None and model is not None:
                self.whole_run_tensors.seed([*model.parameters(), *model.buffers()])  # the training peak starts here
            self._watch_peak_phases(args, kwargs)
            self._mark("fit_start")
            self.fit_start = time.perf_counter()
            self.excluded.clear()
            try:
                result = fit(*args, **kwargs)
            finally:
                if self.peak_phases is not None:
                    self.peak_phases.boundary("end of training")
                if self.whole_run_tensors is not None and model is not None:
                    self.tensor_peak_bytes = self.whole_run_tensors.peak_bytes
            self._mark("end")
            self.fit_end = time.perf_counter()
            self.token_counts = dict(result or {})
            if self.profiler is not None:  # after the clock stopped: writing the trace is not training time
                self.profile_fields = self.profiler.finish()
            return result

        return timed_fit

    def _watch_peak_phases(self, args: tuple, kwargs: dict) -> None:
        """Cut the loop at ``fabric.backward`` and ``optimizer.step`` (the objects litgpt's ``fit`` calls) so that
        the report can say in which phase the training peak was reached; and print how the optimizer steps."""
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

    def wrap_excluded(self, function, phase: str | None = None):
        def timed(*args, **kwargs):
            start, thread_start = time.perf_counter(), time.process_time()
            if phase is not None and self.peak_phases is not None:
                self.peak_phases.boundary("after the optimizer step")
            try:
                return function(*args, **kwargs)
            finally:
                if phase is not None and self.peak_phases is not None:
                    self.peak_phases.boundary(phase)
                self.excluded.append((start, time.perf_counter()))
                self.excluded_thread_s.append((start, time.process_time() - thread_start))

        return timed

    def watch_batches(
        self, dataloader, *, accumulation: int, epochs: int | None, warmup_steps: int = 1, quick: bool = False,
        train_args: Any = None,
    ):  # fmt: skip
        self.warmup_iterations, self.epochs = accumulation * warmup_steps, epochs
        self.quick, self.accumulation, self.train_args = quick, accumulation, train_args
        if self.profile_steps:
            # full mode profiles the steps right after warm-up; quick mode the steps after its timing ends (the
            # rule decides when), so that a profiled quick run times the same micro-batches as an unprofiled one
            out_dir = Path(os.environ.get(PROFILE_DIR_ENV) or "profile")
            first_iter = None if quick else self.warmup_iterations + 1
            self.profiler = StepProfiler(self.profile_steps, accumulation=accumulation, first_iter=first_iter,
                                         out_dir=out_dir)  # fmt: skip
        return _WatchedBatches(dataloader, self)

    def _mark(self, name: str) -> None:
        self.thread_s[name], self.monotonic_s[name] = time.process_time(), time.monotonic()

    def saw_batch(self, batch: Mapping[str, Any]) -> None:
        self.batch_starts.append(time.perf_counter())
        if len(self.batch_starts) == self.warmup_iterations + 1:
            self._mark("steady_start")
        if self.profiler is not None:
            self.profiler.at_batch(len(self.batch_starts))
        untimed = self.warmup_tokens if len(self.batch_starts) <= self.warmup_iterations else None
        if self.after_timing is not None:  # quick mode's profiled steps after its timing ended
            untimed = self.after_timing_tokens
        if untimed is not None:  # the batch is still on the host: no device sync
            untimed[0] += int(batch["token_counts"]["raw_plus_prompt_template"].sum().item())
            untimed[1] += int(batch["input_ids"].numel())

    def rule_times_s(self, now: float) -> list[float]:
        """Seconds of each timed iteration so far (the last one ends ``now``), validation and example generation
        taken out, profiled iterations left out (as ``iteration_times.timed_iterations`` leaves them out)."""
        starts = [*self.batch_starts[self.warmup_iterations :], now]
        first_iter = self.warmup_iterations + 1
        profiled = range(0)
        # the profiled steps and the micro-batch that stops the profiler
        if self.profiler is not None and self.profiler.first_iter is not None:
            profiled = range(self.profiler.first_iter, self.profiler.last_iter + 2)
        return [
            b - a - self._excluded_between(a, b)
            for number, (a, b) in enumerate(zip(starts, starts[1:], strict=False), start=first_iter)
            if number not in profiled
        ]

    def should_stop(self) -> bool:
        """Quick mode, at an optimizer step's end after warm-up: whether the loop ends here. The stopping rule ends
        the timing; with ``--profile-steps`` the profiled steps follow it, left out of every time figure, and the
        loop ends after them."""
        done = len(self.batch_starts) - self.warmup_iterations
        if not self.quick or done <= 0 or done % self.accumulation:
            return False
        if self.quick_stop is not None:  # only profiled steps run after the timing: end after their window
            if self.after_timing is None or len(self.batch_starts) < self.profiler.last_iter:
                return False
            self.profiler.stop_after_window()
            began, thread_began = self.after_timing
            self.excluded.append((began, time.perf_counter()))
            self.excluded_thread_s.append((began, time.process_time() - thread_began))
            return True
        times = self.rule_times_s(time.perf_counter())
        reason = stop_reason(times, stable_pct=self._stable_pct()) or ("run_end" if self._own_steps_done() else None)
        if reason is None:
            return False
        self._say_stop(reason, times)
        if self.profiler is None or self.profiler.first_iter is not None:
            return True
        self._mark("timing_end")  # the loop window (host_core_pct, gpu_busy_pct) ends with the timing
        self.after_timing = (time.perf_counter(), time.process_time())
        self.profiler.begin_at(len(self.batch_starts) + 1)
        return False

    def _own_steps_done(self) -> bool:
        """A profiled quick run whose rule has not ended the timing: whether the recipe's own steps are done, so that
        the steps the launcher added for the profile (``lab.settled_overrides``: N + 1) are profiled now."""
        if self.profiler is None or self.profiler.first_iter is not None or self.train_args is None:
            return False
        max_steps = getattr(self.train_args, "max_steps", None)
        if not max_steps:
            return False  # a run by epochs ends with its data: no room was made for the profile
        return len(self.batch_starts) >= (max_steps - self.profile_steps - 1) * self.accumulation

    def _stable_pct(self) -> float | None:
        """The rule's ``stable`` agreement; None (never stable) for micro-batches that differ in length by design."""
        return stable_halves_pct() if self.judge_stable else None

    def _say_stop(self, reason: str, times: list[float]) -> None:
        from lab_helpers.config.iteration_times import iteration_stats

        self.quick_stop, self.quick_stop_halves_pct = reason, iteration_stats(times)["iter_halves_pct"]
        halves = "n/a" if self.quick_stop_halves_pct is None else f"{self.quick_stop_halves_pct:.1f}%"
        rule = f"stable within {stable_halves_pct():g}%" if self.judge_stable else "length-grouped: no stable rule"
        print(f"lab: quick mode: timing ends ({reason}) after {len(times)} timed micro-batches, "
              f"{sum(times):.1f} s; medians of the two halves {halves} apart ({rule})", flush=True)  # fmt: skip

    def quick_fields(self) -> dict[str, Any]:
        """``quick_stop`` and ``quick_stop_halves_pct`` for the report: what ended a quick run's timing (None in full
        mode). A run whose own steps or data ended before the rule stopped it is judged once more at its end: the
        rule's verdict on all its timed iterations, else ``run_end``."""
        if not self.quick:
            return {"quick_stop": None, "quick_stop_halves_pct": None}
        if self.quick_stop is None:
            times = self.rule_times_s(self.fit_end) if self.steady and self.fit_end is not None else []
            self._say_stop(stop_reason(times, stable_pct=self._stable_pct()) or "run_end", times)
        return {"quick_stop": self.quick_stop, "quick_stop_halves_pct": self.quick_stop_halves_pct}

    @property
    def steady(self) -> bool:
        return self.fit_end is not None and len(self.batch_starts) > self.warmup_iterations > 0

    def _excluded_between(self, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.excluded)

    def host_fields(self) -> dict[str, Any]:
        """host_core_pct and loop_monotonic_s over the timed loop (the whole loop where nothing was timed apart)."""
        start = "steady_start" if self.steady and "steady_start" in self.thread_s else "fit_start"
        end = "timing_end" if "timing_end" in self.thread_s else "end"  # quick mode's profiled steps come after it
        if start not in self.thread_s or "end" not in self.thread_s or self.fit_start is None:
            return {"host_core_pct": None, "loop_monotonic_s": None}
        start_perf = self.batch_starts[self.warmup_iterations] if start == "steady_start" else self.fit_start
        end_perf = self.after_timing[0] if self.after_timing is not None else self.fit_end
        wall_s = self.monotonic_s[end] - self.monotonic_s[start] - self._excluded_between(start_perf, end_perf)
        thread_s = self.thread_s[end] - self.thread_s[start]
        thread_s -= sum(spent for began, spent in self.excluded_thread_s if start_perf <= began < end_perf)
        return {
            "host_core_pct": 100 * thread_s / wall_s if wall_s > 0 else None,
            "loop_monotonic_s": [self.monotonic_s[start], self.monotonic_s[end]],
        }

    def timings(self) -> dict[str, Any]:
        """train_s, warmup_s, iterations (timed), warmup_iterations and token counts for the report."""
        tokens = self.token_counts.get("raw_tokens_plus_prompt_template")
        padded = self.token_counts.get("raw_tokens_plus_prompt_template_and_padding")
        if self.fit_end is None or self.fit_start is None:
            return {"train_s": None, "tokens": tokens, "tokens_padded": padded}
        if not self.steady:
            return {
                "train_s": self.fit_end - self.fit_start - self._excluded_between(self.fit_start, self.fit_end),
                "warmup_iterations": 0,
                "iterations": len(self.batch_starts) or None,
                "tokens": tokens,
                "tokens_padded": padded,
            }
        first, steady_start = self.batch_starts[0], self.batch_starts[self.warmup_iterations]
        profiled_after = 0  # quick mode's profiled micro-batches after the timing (their time is excluded already)
        if self.after_timing is not None:
            profiled_after = sum(1 for start in self.batch_starts if start >= self.after_timing[0])
        untimed = [w + a for w, a in zip(self.warmup_tokens, self.after_timing_tokens, strict=True)]
        end = self.after_timing[0] if self.after_timing is not None else self.fit_end
        return {
            "train_s": end - steady_start - self._excluded_between(steady_start, end),
            "warmup_s": steady_start - first - self._excluded_between(first, steady_start),
            "warmup_iterations": self.warmup_iterations,
            "iterations": len(self.batch_starts) - self.warmup_iterations - profiled_after,
            "tokens": None if tokens is None else tokens - untimed[0],
            "tokens_padded": None if padded is None else padded - untimed[1],
        }


class _WatchedBatches:
    """The training dataloader as litgpt sees it, telling the clock about every batch that is trained on.

    litgpt draws one batch past the last epoch and then stops without training on it: batches of a pass
    beyond ``epochs`` are not counted.
    """

    def __init__(self, dataloader, clock: _TrainingClock) -> None:
        self._dataloader = dataloader
        self._clock = clock
        self._passes = 0
        self._held = None  # the batch drawn when quick mode's rule ended the timing (never trained on)

    def __iter__(self):
        self._passes += 1
        if self._clock.quick_stop is not None:  # litgpt draws once more, sees the epoch limit and stops
            yield self._held
            return
        trained = self._clock.epochs is None or self._passes <= self._clock.epochs
        for batch in self._dataloader:
            if trained and self._clock.should_stop():
                # end this pass and make it the last epoch: litgpt's own check (``epoch >= train.epochs``) then
                # ends the loop before training on another batch; no DataLoader is started again for it
                self._held = batch
                self._clock.epochs = self._passes
                if self._clock.train_args is not None:
                    self._clock.train_args.epochs = self._passes
                return
            if trained:
                self._clock.saw_batch(batch)
            yield batch

    def __len__(self) -> int:
        return len(self._dataloader)

    def __getattr__(self, name: str):
        return getattr(self._dataloader, name)


def _wrap_get_dataloaders(get_dataloaders, clock: _TrainingClock, *, quick: bool, batch_order: str = "shuffle"):
    """litgpt's ``get_dataloaders``, with the training batches watched (and, in quick mode or in another order than
    litgpt's shuffle, reordered: ``quick_mode.batch_sampler``)."""
    clock.judge_stable = batch_order == "shuffle"

    def wrapped(fabric, data, tokenizer, train):
        accumulation = train.gradient_accumulation_iters(fabric.world_size, 1)  # devices x nodes = world size
        if quick or batch_order != "shuffle":
            put_longest_batch_in_second_step(
                data, train.micro_batch_size, accumulation, batch_order=batch_order, warmup=quick
            )
        train_loader, val_loader = get_dataloaders(fabric, data, tokenizer, train)
        steps = warmup_steps(train.max_steps, quick=quick)  # quick: the peak step is warm-up too
        watched = clock.watch_batches(
            train_loader, accumulation=accumulation, epochs=train.epochs, warmup_steps=steps, quick=quick, train_args=train
        )
        return watched, val_loader

    return wrapped


def _skip_final_save(module) -> None:
    """Save no weights: the lab measures time and memory, and litgpt's final save costs disk and minutes.

    Full fine-tuning saves through ``Fabric.save``; LoRA saves its adapters (``save_lora_checkpoint``) and then
    merges them into a complete copy of the model (``merge_lora``: 26 GB for a 13B model, minutes of work, and a
    full disk half-way turns a finished run into an error). All three are replaced by a line saying so.
    """
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
    clock = _TrainingClock()
    clock.profile_steps = steps_from_env()
    if activation_checkpointing.FLAG in argv:  # the lab's switch, not litgpt's: litgpt's CLI never sees it
        argv.remove(activation_checkpointing.FLAG)
        clock.checkpoint_blocks = True
    module.fit = clock.wrap_fit(module.fit)
    module.validate = clock.wrap_excluded(module.validate, "validation")
    module.generate_example = clock.wrap_excluded(module.generate_example, "example generation")
    module.get_dataloaders = _wrap_get_dataloaders(
        module.get_dataloaders, clock, quick=quick_from_env(), batch_order=_take_batch_order(argv)
    )
    if os.environ.get(SAVE_ENV) != "1":
        _skip_final_save(module)

    status, error, code = "ok", None, 0
    if not _on_cuda() and os.environ.get(TENSOR_PEAK_ENV) != "0":
        # a CPU has no max_memory_allocated: count live tensors from before the checkpoint is loaded
        # (LAB_TENSOR_PEAK=0 turns it off)
        clock.whole_run_tensors = LiveTensorPeak()
    try:
        from litgpt.__main__ import main as litgpt_main

        sys.argv = ["litgpt", *argv]
        if clock.whole_run_tensors is None:
            litgpt_main()
        else:
            with clock.whole_run_tensors:
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
    tensors = clock.whole_run_tensors
    write_report(
        {
            "status": status,
            "error": error,
            "world_size": 1,
            "peak_alloc_gib": peak_alloc_gib,
            "peak_reserved_gib": peak_reserved_gib,
            "peak_alloc_whole_run_gib": whole_run_peak_gib(clock.alloc_before_fit_gib, peak_alloc_gib),
            **clock.timings(),
            **clock.host_fields(),
            **clock.quick_fields(),
            **clock.profile_fields,
            "peak_tensor_gib": None if clock.tensor_peak_bytes is None else clock.tensor_peak_bytes / GIB,
            "peak_tensor_whole_run_gib": None if tensors is None else tensors.whole_run_peak_gib,
            "peak_phase": None if clock.peak_phases is None else clock.peak_phases.phase,
            "device_name": device_name(),
            "device_uuid": device_uuid(),
        }
    )
    return code


def _fabric_and_optimizer(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """The Fabric and the (Fabric-wrapped) optimizer litgpt's ``fit`` uses: ``fit(fabric, state, ...)`` for full
    fine-tuning (``state["optimizer"]``), ``fit(fabric, model, optimizer, ...)`` for LoRA."""
    fabric = kwargs.get("fabric", args[0] if args else None)
    optimizer = kwargs.get("optimizer", args[2] if len(args) > 2 else None)
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    if isinstance(state, dict):
        optimizer = state.get("optimizer")
    return fabric, optimizer if hasattr(optimizer, "step") else None


def optimizer_words(optimizer: Any) -> str:
    """The optimizer as the run built it (from ``optimizer.init_args``, by litgpt's ``instantiate_torch_optimizer``)
    and, for a torch optimizer, which step implementation torch runs (``planner.spec.step_implementation``): what
    the planner was asked about, in the run's own log."""
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


def _take_batch_order(argv: list[str]) -> str:
    """``--batch-order ORDER`` taken out of ``argv`` (litgpt's CLI never sees it); ``shuffle`` without it."""
    if BATCH_ORDER_FLAG not in argv:
        return "shuffle"
    at = argv.index(BATCH_ORDER_FLAG)
    order = argv[at + 1] if at + 1 < len(argv) else ""
    del argv[at : at + 2]
    if order not in BATCH_ORDERS:
        raise SystemExit(f"{BATCH_ORDER_FLAG} {order!r}: expected one of {', '.join(BATCH_ORDERS)}")
    return order


def _model_of(args: tuple, kwargs: dict) -> Any:
    """The model litgpt's ``fit`` trains: ``model=`` (LoRA) or ``state["model"]`` (full fine-tuning)."""
    if kwargs.get("model") is not None:
        return kwargs["model"]
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    return state.get("model") if isinstance(state, dict) else None


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
