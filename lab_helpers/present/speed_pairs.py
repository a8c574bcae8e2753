"""Speed verdicts beyond the noise, by the one rule (``compare``) that the notebooks' sentences, the answer key and
``compare --pairs`` all call. A quick run times a handful of micro-batches, first-seen lengths cost 2-3x a repeated
one on a GPU, and two runs of one experiment on the H200 differed by a quarter: a verdict read off two medians is
often noise. So each side's time is its steady time per sample, the spread a two-level bootstrap (runs, then
micro-batches), and "faster" or "slower" needs the whole 95 % interval of the ratio on one side of x1.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab_helpers.config.iteration_times import (
    BOOTSTRAP_RESAMPLES,
    MIN_STEADY_ITERATIONS,
    finite_number,
    first_seen_iterations,
    interval_95,
    length_split,
    timed_iterations,
)

LESSON_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("bf16-true", "grad-accum", "bf16 against fp32, the same recipe (32 / 8)"),
    ("bf16-mixed", "bf16-true", "mixed precision against pure bf16"),
    ("grad-accum", "small-batch", "accumulating 4 micro-batches against one"),
    ("lora-1b", "full-7b", "a 1.1B LoRA against a full 7B"),
    ("fill-gpu", "lora-1b", "the largest micro batch that fits and divides the global batch against 4"),
    ("length-grouped", "small-batch", "micro-batches of similar length against shuffled"),
    ("compile", "lora-1b", "each block compiled against eager"),
    ("pad-64", "small-batch", "padded to a multiple of 64 tokens against to the longest sample"),
    ("compile-static", "compile", "compiled at one padded length (CUDA graphs on a GPU) against compiled"),
    ("fused-adamw", "small-batch", "the fused AdamW step against the default"),
    ("attention-flash", "bf16-true", "the flash attention backend against torch's choice"),
    ("act-ckpt", "full-7b", "activation checkpointing against none"),
    ("adamw-8bit", "full-7b", "8-bit AdamW against AdamW"),
    ("fsdp", "ddp", "FSDP full shard against DDP"),
    ("fsdp-bs8", "fsdp", "FSDP at micro batch 8 against 4"),
    ("fsdp-grad-op", "fsdp", "SHARD_GRAD_OP against full shard"),
    ("fsdp-course", "fsdp", "the course's FSDP (one unit) against per block"),
    ("ddp-course", "ddp", "the course's DDP (no bucket views) against the lab's"),
)
"""In the notebooks' order; every ``pair:`` of configs/experiments is one of them (tests/test_speed_pairs.py)."""

STEP_OVERRIDES = ("optimizer.foreach", "optimizer.fused")
"""01's lever: such a run is a variant of its experiment, never the experiment the other questions mean."""


def step_variant(record: Mapping[str, Any]) -> bool:
    overrides = record.get("overrides")
    return isinstance(overrides, Mapping) and any(key in overrides for key in STEP_OVERRIDES)


@dataclass(frozen=True)
class RunTimes:
    """One run's timed micro-batches, in seconds per sample, and what they are of."""

    run_id: str
    per_sample_s: tuple[float, ...]
    mean: bool  # a length-grouped run: its centre is the mean micro-batch
    steady: bool  # True: micro-batches of lengths seen before; False: all timed ones
    first_seen_count: int | None
    first_seen_extra_s: float | None
    basis: str

    @property
    def centre_s(self) -> float:
        return statistics.fmean(self.per_sample_s) if self.mean else statistics.median(self.per_sample_s)


def run_times(record: Mapping[str, Any], *, steady: bool) -> RunTimes | None:
    """The record's steady micro-batches (``steady``), else all its timed ones, per sample; None without them."""
    config = record.get("config") if isinstance(record.get("config"), Mapping) else {}
    micro = finite_number((config.get("train") or {}).get("micro_batch_size"))
    timed = timed_iterations(record)
    if not micro or not timed:
        return None
    split = length_split(record)
    if steady:
        if split["steady_iter_s"] is None:
            return None
        first_seen = first_seen_iterations(record["seq_lens"])  # the split length_split made, the same rule
        chosen = [seconds for iteration, seconds in timed if iteration not in first_seen]
    else:
        chosen = [seconds for _, seconds in timed]
    return RunTimes(
        run_id=str(record.get("run_id")),
        per_sample_s=tuple(seconds / micro for seconds in chosen),
        mean=record.get("batch_order") == "length-grouped",
        steady=steady,
        first_seen_count=split["first_seen_count"],
        first_seen_extra_s=split["first_seen_extra_s"],
        basis=split["steady_basis"],
    )


@dataclass(frozen=True)
class Verdict:
    """``exp`` against ``against`` on one device: both times, their ratio with its interval, and the words."""

    exp: str
    against: str
    device: str
    ranks: int  # 1, or the N of a simulated rank 0 of N
    exp_runs: tuple[RunTimes, ...]
    against_runs: tuple[RunTimes, ...]
    ratio: float  # exp's time / against's: below 1 is faster
    low: float
    high: float
    unlike: str = ""  # why the two were not timed alike (on a CPU: the live-tensor count on one side only)

    @property
    def steady(self) -> bool:
        return self.exp_runs[0].steady

    @property
    def exp_ms(self) -> float:
        return 1e3 * _experiment_s([r.per_sample_s for r in self.exp_runs], mean=self.exp_runs[0].mean)

    @property
    def against_ms(self) -> float:
        return 1e3 * _experiment_s([r.per_sample_s for r in self.against_runs], mean=self.against_runs[0].mean)

    @property
    def noise_pct(self) -> float:
        """Half the interval's width, % of x1."""
        return 100 * (self.high - self.low) / 2

    @property
    def timed_counts(self) -> tuple[int, int]:
        return (sum(len(r.per_sample_s) for r in self.exp_runs), sum(len(r.per_sample_s) for r in self.against_runs))

    @property
    def verdict(self) -> str:
        """A bootstrap of one or two values has no width to judge by: too few to tell."""
        if self.unlike:
            return "not like for like"
        if min(self.timed_counts) < MIN_STEADY_ITERATIONS:
            return "too few to tell"
        if self.high < 1:
            return "faster"
        if self.low > 1:
            return "slower"
        return "within noise"

    @property
    def label(self) -> str:
        return f"within noise (±{self.noise_pct:.0f} %)" if self.verdict == "within noise" else self.verdict

    def words(self) -> str:
        kind = "steady" if self.steady else "all timed micro-batches (first-seen lengths included)"
        runs = f"{len(self.exp_runs)} and {len(self.against_runs)} runs" if max(
            len(self.exp_runs), len(self.against_runs)) > 1 else "one run each"  # fmt: skip
        change = 100 * (self.ratio - 1)
        interval = f"95 % interval {100 * (self.low - 1):+.0f} to {100 * (self.high - 1):+.0f} %"
        said = {
            "within noise": self.label,
            "too few to tell": "too few micro-batches to tell ({} and {})".format(*self.timed_counts),
            "not like for like": f"not like for like ({self.unlike})",
        }.get(self.verdict, f"{self.exp} {self.verdict}")
        return (
            f"{self.exp} {self.exp_ms:.1f} ms/sample against {self.against} {self.against_ms:.1f} ({kind}, {runs}): "
            f"{change:+.0f} % ({interval}): {said}"
        )

    def first_seen_words(self) -> str:
        parts = []
        for name, runs in ((self.exp, self.exp_runs), (self.against, self.against_runs)):
            latest = runs[-1]
            if latest.first_seen_count == 0:
                parts.append(f"{name}: no first-seen length among its timed micro-batches")
            elif latest.first_seen_extra_s is None:
                parts.append(f"{name}: {latest.basis}")
            else:
                parts.append(f"{name}: {latest.first_seen_count} of a first-seen length, "
                             f"{1e3 * latest.first_seen_extra_s:+.0f} ms each over a steady one")  # fmt: skip
        return "; ".join(parts)


def _experiment_s(runs: Sequence[Sequence[float]], *, mean: bool) -> float:
    centre = statistics.fmean if mean else statistics.median
    return statistics.median(centre(run) for run in runs)


def _resampled_s(draw: random.Random, runs: Sequence[Sequence[float]], *, mean: bool) -> float:
    picked = draw.choices(runs, k=len(runs))
    return _experiment_s([draw.choices(run, k=len(run)) for run in picked], mean=mean)


def _device(record: Mapping[str, Any]) -> str:
    name = record.get("device_name")
    return name if isinstance(name, str) and name else "unknown device"


def world(record: Mapping[str, Any]) -> int:
    """The ranks a record's run stands for: a simulated rank 0 of N is compared with runs of N only."""
    return int(finite_number(record.get("simulated_world_size")) or finite_number(record.get("world_size")) or 1)


def finished_runs(records: Iterable[Mapping[str, Any]], exp: str) -> list[Mapping[str, Any]]:
    """A table's NaN rank is a single process's None."""
    return [
        r for r in records
        if r.get("experiment") == exp and r.get("status") == "ok" and finite_number(r.get("rank")) in (None, 0)
        and not step_variant(r)
    ]  # fmt: skip


def compare(records: Iterable[Mapping[str, Any]], exp: str, against: str, *, ranks: int | None = None) -> Verdict | str:
    """On the device of ``exp``'s latest run, at its ranks; a string saying why not where records cannot compare."""
    records = list(records)
    mine = [r for r in finished_runs(records, exp) if ranks is None or world(r) == ranks]
    if not mine:
        return f"no finished run of {exp}" + (f" at {ranks} ranks" if ranks else "")
    device, ranks = _device(mine[-1]), world(mine[-1])
    mine = [r for r in mine if _device(r) == device and world(r) == ranks]
    theirs = [r for r in finished_runs(records, against) if _device(r) == device and world(r) == ranks]
    if not theirs:
        return f"no finished run of {against} on {device}" + (f" at {ranks} ranks" if ranks > 1 else "")
    for steady in (True, False):
        a = [t for t in (run_times(r, steady=steady) for r in mine) if t is not None]
        b = [t for t in (run_times(r, steady=steady) for r in theirs) if t is not None]
        if len(a) == len(mine) and len(b) == len(theirs):
            break
    else:
        return f"{exp} or {against} has a run with no timed micro-batch"
    a_times, b_times = [r.per_sample_s for r in a], [r.per_sample_s for r in b]
    a_mean, b_mean = a[0].mean, b[0].mean
    ratio = _experiment_s(a_times, mean=a_mean) / _experiment_s(b_times, mean=b_mean)
    draw = random.Random(0)  # the same interval on every read
    low, high = interval_95([
        _resampled_s(draw, a_times, mean=a_mean) / _resampled_s(draw, b_times, mean=b_mean)
        for _ in range(BOOTSTRAP_RESAMPLES)
    ])  # fmt: skip
    return Verdict(exp, against, device, ranks, tuple(a), tuple(b), ratio, low, high, _unlike(mine, theirs))


def _unlike(mine: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]]) -> str:
    """Why two sets of CPU runs were not timed alike, or "": the lab's live-tensor count (LAB_TENSOR_PEAK, CPU
    only) slows a run severalfold and cannot run beside torch.compile, so a compiled CPU run has none."""
    counted = {
        finite_number(r.get("peak_tensor_gib")) is not None for r in (*mine, *theirs) if _device(r).startswith("cpu")
    }
    if len(counted) < 2:
        return ""
    return (
        "on a CPU the live-tensor count, which slows a run, ran on one side only (it cannot run beside "
        "torch.compile): the time difference is not the lever's; LAB_TENSOR_PEAK=0 times both alike"
    )


def pairs_rows(
    records: Iterable[Mapping[str, Any]], pairs: Sequence[tuple[str, str, str]] = LESSON_PAIRS
) -> list[dict]:
    records = list(records)
    rows = []
    for exp, against, what in pairs:
        for ranks in sorted({world(r) for r in finished_runs(records, exp)}):
            verdict = compare(records, exp, against, ranks=ranks)
            name = f"{exp} vs {against}" + (f" (rank 0 of {ranks})" if ranks > 1 else "")
            if isinstance(verdict, str):
                if not verdict.startswith("no finished run of"):
                    rows.append({"pair": name, "what": what, "verdict": verdict})
                continue
            a, b = verdict.exp_runs[-1], verdict.against_runs[-1]
            rows.append({
                "pair": name,
                "what": what,
                "time": "steady" if verdict.steady else "all timed",
                "exp_ms_per_sample": verdict.exp_ms,
                "against_ms_per_sample": verdict.against_ms,
                "runs": f"{len(verdict.exp_runs)}/{len(verdict.against_runs)}",
                "first_seen": f"{_first_seen(a)} / {_first_seen(b)}",
                "change_pct": 100 * (verdict.ratio - 1),
                "interval": f"{100 * (verdict.low - 1):+.0f} to {100 * (verdict.high - 1):+.0f}",
                "verdict": verdict.label,
            })  # fmt: skip
    return rows


def _first_seen(run: RunTimes) -> str:
    if run.first_seen_extra_s is None or run.first_seen_count == 0:
        return "not recorded" if run.first_seen_count is None else f"{run.first_seen_count} new"
    return f"{run.first_seen_count} new {1e3 * run.first_seen_extra_s:+.0f} ms"


def steady_note() -> str:
    """Why some rows compare all timed micro-batches: what ``compare --pairs`` prints under its table."""
    return (
        f"steady: micro-batches of a sequence length the run had already seen (at least {MIN_STEADY_ITERATIONS} "
        "in every run of both sides), else all timed ones for both sides; ms per sample, the median over runs of "
        "each run's median micro-batch (length-grouped: mean); change = first / second - 1 with its 95 % bootstrap "
        "interval (runs, then micro-batches); faster or slower only when the interval excludes 0, and a side of fewer than "
        f"{MIN_STEADY_ITERATIONS} micro-batches is too few to tell"
    )


PAIR_COLUMNS = (
    ("pair", "pair"), ("what", "what differs"), ("time", "time"), ("exp_ms_per_sample", "ms/sample"), ("against_ms_per_sample", "vs ms/sample"),
    ("runs", "runs"), ("first_seen", "first-seen (timed, cost each)"), ("change_pct", "change %"),
    ("interval", "95 % interval %"), ("verdict", "verdict"),
)  # fmt: skip


def pairs_text(records: Iterable[Mapping[str, Any]], *, markdown: bool = False) -> str:
    rows = pairs_rows(records)
    if not rows:
        return "no lesson pair has finished runs of both its experiments here"

    def cell(row: Mapping[str, Any], key: str) -> str:
        value = row.get(key)
        if value is None:
            return ""
        if key == "change_pct":
            return f"{value:+.0f}"
        return f"{value:.1f}" if key.endswith("ms_per_sample") else str(value)

    table = [[cell(row, key) for key, _ in PAIR_COLUMNS] for row in rows]
    heads = [head for _, head in PAIR_COLUMNS]
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
    else:
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(heads)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines) + "\n\n" + steady_note()
