"""The answer key (issue 43): every question the notebooks ask, answered from one reference's records.

Why generated: a typed key drifts from the notebooks and from the data, and the shipped references differ (an
H100's quick runs, an H200's speed chunk and simulated ranks, the ci profile on a CPU). So the questions are read
from the notebooks themselves (``**Question.**`` paragraphs, keyed by notebook, section and order), and each answer
is a short function of that reference's records (measured columns and the planner's stored prediction) and of the
lab's arithmetic (``lab_helpers.arithmetic``, ``planner.communication``, ``activations_by_hand``): no figure is
typed here. Where a question is open, the answer gives the figures and one sentence whose wording is chosen by
comparing them. What a reference cannot answer (an experiment it did not run, a CPU's missing GPU memory, a
simulated rank's missing communication) is said, with why. ``python -m lab_helpers answers --reference NAME``.

A section is the backticked experiment id of the nearest ``##``/``###`` heading above the question (else a slug of
the heading), so rewording a question keeps its answer; a question without an entry here is printed as such and
fails tests/test_answers.py. Where a section asks fewer questions than it has entries, its last question gets the
rest too (a section that merges two questions keeps both answers).
"""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab_helpers.iteration_times import finite_number, one_off_excess_s, timed_iterations
from lab_helpers.record_schema import BREAKDOWN_PARTS, GIB

WIDTH = 120
MARK = "**Question.**"

# ------------------------------------------------------------------------------------------------ questions


@dataclass(frozen=True)
class Question:
    notebook: str  # "01"
    file: str  # "01_single_gpu"
    section: str  # "grad-accum", or a slug of a heading without an experiment id
    n: int  # its order within the section, from 1
    text: str

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.notebook, self.section, self.n)


def notebooks_dir() -> Path:
    from lab_helpers.paths import lab_home

    return lab_home() / "notebooks"


def section_key(heading: str) -> str:
    """``## 3 · `grad-accum`: ...`` -> ``grad-accum``; ``## 6 · Timeline: where the GPUs wait`` ->
    ``timeline-where-the-gpus-wait`` (its number left out, so renumbering keeps the key)."""
    text = heading.lstrip("#").strip()
    named = re.search(r"`([^`]+)`", text)
    if named:
        return named.group(1)
    text = re.sub(r"^\d+[a-z]?\s*·\s*", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def notebook_questions(folder: Path | None = None) -> list[Question]:
    """Every ``**Question.**`` of the notebooks, in order: from the marker to the end of its paragraph."""
    questions: list[Question] = []
    for path in sorted((folder or notebooks_dir()).glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        section, counts = "intro", {}
        for cell in cells:
            if cell.get("cell_type") != "markdown":
                continue
            source = "".join(cell.get("source", []))
            for paragraph in re.split(r"\n\s*\n", source):
                lines = []
                for line in paragraph.splitlines():
                    if re.match(r"^#{2,3}\s", line):
                        section = section_key(line)
                    elif not line.startswith("#"):
                        lines.append(line)
                for asked in " ".join(" ".join(lines).split()).split(MARK)[1:]:
                    counts[section] = counts.get(section, 0) + 1
                    questions.append(
                        Question(path.stem[:2], path.stem, section, counts[section], f"{MARK} {asked.strip()}")
                    )
    return questions


# ------------------------------------------------------------------------------------------------ facts


class Cannot(Exception):
    """What this reference cannot answer, and why (one clause)."""


def gib(value: float) -> str:
    """GiB with two decimals; under 1 GiB in MiB (the ci stand-ins allocate tens of MiB)."""
    return f"{value:.2f} GiB" if abs(value) >= 1 else f"{value * 1024:.1f} MiB"


def words(part: str) -> str:
    return part.replace("_", " ")


def larger(a: float, b: float, more: str = "more", less: str = "less") -> str:
    return more if a > b else less


@dataclass(frozen=True)
class Plan:
    """The planner's prediction stored in a record (``predicted``)."""

    exp: str
    data: Mapping[str, Any]

    def part(self, name: str) -> float:
        return float((self.data.get("breakdown_gib") or {}).get(name) or 0.0)

    @property
    def parts(self) -> dict[str, float]:
        return {p: self.part(p) for p in BREAKDOWN_PARTS if p in (self.data.get("breakdown_gib") or {})}

    @property
    def peak(self) -> float:
        return float(self.data["peak_alloc_gib"])

    @property
    def used(self) -> float:
        return float(self.data.get("gpu_used_gib") or self.peak)

    @property
    def micro(self) -> int:
        return int(self.data["micro_batch_size"])

    @property
    def params(self) -> int:
        return int(self.data["total_params"])

    def largest(self, exclude: Iterable[str] = ()) -> tuple[str, float]:
        return max(((p, v) for p, v in self.parts.items() if p not in exclude), key=lambda pv: pv[1])

    def model_states(self) -> float:
        return sum(self.part(p) for p in ("parameters", "gradients", "optimizer_states"))


def phase_words(phase: str | None) -> str:
    """The planner's phase names (``w1m1-backward``, ``w0-step``) in words."""
    match = re.fullmatch(r"w(\d+)(?:m(\d+))?-(\w+)", str(phase or ""))
    if not match:
        return str(phase)
    window, micro, kind = match.groups()
    step = "the first optimizer step" if window == "0" else "a steady optimizer step"
    what = {"forward": "forward", "backward": "backward", "step": "optimizer update"}.get(kind, kind)
    return f"the {what} of {step}" + (f", micro-batch {int(micro) + 1}" if micro is not None else "") + f" ({phase})"


@dataclass
class Answer:
    text: str
    missing: list[str] = field(default_factory=list)
    computed: bool = True


class Facts:
    """One reference's records, and the small questions every answer asks of them."""

    def __init__(self, name: str, records: list[dict[str, Any]]):
        self.name = name
        self.records = records
        latest: dict[tuple[str, int], dict[str, Any]] = {}
        ordered = sorted(enumerate(records), key=lambda ir: (str(ir[1].get("started_at") or ""), ir[0]))
        for _, record in ordered:
            if record.get("rank") in (None, 0) and record.get("experiment"):
                latest[(record["experiment"], self.world(record))] = record
        self.latest = latest

    @staticmethod
    def world(record: Mapping[str, Any]) -> int:
        return int(finite_number(record.get("simulated_world_size")) or finite_number(record.get("world_size")) or 1)

    @property
    def gpu(self) -> bool:
        return any(r.get("profile") == "gpu" for r in self.records)

    @property
    def profile(self) -> str:
        return "gpu" if self.gpu else "ci"

    @property
    def device(self) -> str:
        names = [r.get("device_name") for r in self.records if r.get("device_name")]
        return names[0] if names else "a CPU"

    @property
    def mem(self) -> str:
        """The measured memory column: the allocator's peak on a GPU, the live tensor bytes on a CPU."""
        return "peak_alloc_gib" if self.gpu else "peak_tensor_gib"

    # -- records

    def record(self, exp: str, world: int | None = None) -> dict[str, Any]:
        worlds = sorted(w for e, w in self.latest if e == exp)
        if not worlds:
            raise Cannot(f"{self.name} did not run `{exp}`")
        from lab_helpers.decision import SIMULATED_WORLD

        chosen = (
            world
            if world in worlds
            else (1 if 1 in worlds else SIMULATED_WORLD if SIMULATED_WORLD in worlds else worlds[0])
        )
        return self.latest[(exp, chosen)]

    def run(self, exp: str, world: int | None = None) -> dict[str, Any]:
        """The latest finished rank-0 record of ``exp``; a skipped or failed one cannot answer."""
        record = self.record(exp, world)
        if record.get("status") != "ok":
            why = record.get("reason") or record.get("error") or ""
            raise Cannot(
                f"{self.name} recorded `{exp}` as {record.get('status')}" + (f" ({short(why)})" if why else "")
            )
        return record

    def label(self, exp: str, world: int | None = None) -> str:
        record = self.record(exp, world)
        simulated = finite_number(record.get("simulated_world_size"))
        return f"`{exp}`" + (f" (simulated rank 0 of {int(simulated)})" if simulated and simulated > 1 else "")

    def plan(self, exp: str, world: int | None = None) -> Plan:
        record = self.record(exp, world)
        if not isinstance(record.get("predicted"), Mapping):
            why = record.get("reason")
            raise Cannot(f"{self.name}'s `{exp}` record has no prediction" + (f" ({short(why)})" if why else ""))
        return Plan(exp, record["predicted"])

    def value(self, exp: str, column: str, world: int | None = None) -> float:
        number = finite_number(self.run(exp, world).get(column))
        if number is None:
            if column in ("gpu_busy_pct", "bound", "peak_reserved_gib", "gpu_used_peak_gib") and not self.gpu:
                raise Cannot(f"a CPU has no `{column}` ({self.name} ran on one)")
            raise Cannot(f"{self.name}'s `{exp}` record has no `{column}`")
        return number

    def peak(self, exp: str, world: int | None = None) -> float:
        return self.value(exp, self.mem, world)

    def text(self, exp: str, column: str, world: int | None = None) -> str:
        value = self.run(exp, world).get(column)
        if not value:
            raise Cannot(f"{self.name}'s `{exp}` record has no `{column}`" + ("" if self.gpu else " (a CPU run)"))
        return str(value)

    def micro(self, exp: str, world: int | None = None) -> int:
        return int(self.record(exp, world)["config"]["train"]["micro_batch_size"])

    def ms_per_sample(self, exp: str, world: int | None = None) -> float:
        """The table's ``ms_per_sample``: the timed loop over the samples it saw (rank 0)."""
        samples = self.value(exp, "iterations", world) * self.micro(exp, world)
        return 1000 * self.value(exp, "train_s", world) / samples

    def steady_ms_per_sample(self, exp: str, world: int | None = None) -> float:
        """The median micro-batch over its samples: what the memory-against-time plot draws."""
        return 1000 * self.value(exp, "iter_median_s", world) / self.micro(exp, world)

    def gpu_memory(self) -> float:
        if not self.gpu:
            raise Cannot(f"a CPU has no GPU memory ({self.name} measures live tensor bytes)")
        sizes = [finite_number((r.get("predicted") or {}).get("gpu_memory_gib")) for r in self.records]
        found = [s for s in sizes if s]
        if not found:
            raise Cannot(f"{self.name}'s records do not say the GPU's memory")
        return found[0]

    def need_gpu(self, what: str) -> None:
        if not self.gpu:
            raise Cannot(f"{what}: a CPU has none ({self.name} ran on one)")

    def states(self, exp: str, **overrides: Any):
        from lab_helpers.arithmetic import model_states

        return model_states(exp, profile=self.profile, overrides=overrides or None)

    def communication(self, exp: str):
        from lab_helpers.arithmetic import communication
        from lab_helpers.decision import SIMULATED_WORLD

        return communication(exp, profile=self.profile, ranks=SIMULATED_WORLD)

    def simulated(self, exp: str) -> bool:
        return bool((finite_number(self.record(exp).get("simulated_world_size")) or 0) > 1)

    # -- answers of several parts

    def answer(self, *parts: str | Callable[[], str]) -> Answer:
        """Each part a sentence or a function of the records; a function that raises ``Cannot`` becomes a
        'not from this reference' reason instead."""
        from lab_helpers.planner.errors import PlanError

        texts, missing, computed = [], [], False
        for part in parts:
            if isinstance(part, str):
                texts.append(part)
                continue
            try:
                texts.append(part())
                computed = True
            except Cannot as exc:
                if str(exc) not in missing:
                    missing.append(str(exc))
            except PlanError as exc:  # the ci stand-ins' configs are not built in this checkout
                reason = (f"the lab's arithmetic cannot count the `{self.profile}` profile's models here ({short(exc)}; "
                          f"`python -m lab_helpers prepare --profile {self.profile}` builds them)")  # fmt: skip
                if reason not in missing:
                    missing.append(reason)
        return Answer(" ".join(t for t in texts if t), missing, computed)


def short(text: Any, limit: int = 100) -> str:
    one = " ".join(str(text).split()).split(". ")[0]
    return one if len(one) <= limit else one[: limit - 3] + "..."


def ratio_words(measured: float, expected: float, tolerance: float = 0.01) -> str:
    """'exactly' / 'close to' / 'not' by how far a ratio is from the one it is compared with."""
    off = abs(measured / expected - 1) if expected else float("inf")
    return "equal to" if off <= tolerance else "within 10 % of" if off <= 0.10 else "not"


# ------------------------------------------------------------------------------------------------ the key

Entry = Callable[[Facts], Answer]
ANSWERS: dict[tuple[str, str, int], Entry] = {}


def answer(notebook: str, section: str, n: int = 1) -> Callable[[Entry], Entry]:
    def register(function: Entry) -> Entry:
        ANSWERS[(notebook, section, n)] = function
        return function

    return register


TECHNIQUE_FOR = {
    "optimizer_states": "8-bit AdamW (`adamw-8bit`), SGD (`full-13b-sgd`), LoRA (states for the adapters only) or "
    "DeepSpeed's optimizer offload",
    "activations": "activation checkpointing (`act-ckpt`) or a smaller micro batch with accumulation (`grad-accum`)",
    "parameters": "LoRA's frozen 16-bit or QLoRA's 4-bit base weights (`qlora-7b`), or FSDP's sharding",
    "gradients": "LoRA (no gradients for the frozen weights) or FSDP's sharding",
    "temporaries": "an optimizer step without the foreach temporaries (a fused optimizer, or foreach=False)",
}


def _real_states(f: Facts, exp: str):
    """The model states of the real model (the gpu profile's) where a question names a GPU's size: a CPU
    reference's stand-ins are tiny, and would fit any GPU."""
    from lab_helpers.arithmetic import model_states

    return model_states(exp, profile="gpu")


# -- 00


@answer("00", "would-the-biggest-experiment-fit-on-this-gpu")
def _node_overview(f: Facts) -> Answer:
    from lab_helpers.arithmetic import model_states
    from lab_helpers.decision import LAB_GPU_GIB

    def sections() -> str:
        counts: dict[str, dict[str, int]] = {}
        for record in f.latest.values():
            section = counts.setdefault(str(record.get("section")), {})
            section[record.get("status")] = section.get(record.get("status"), 0) + 1
        said = "; ".join(
            f"{s}: " + ", ".join(f"{n} {status}" for status, n in sorted(c.items())) for s, c in sorted(counts.items())
        )
        simulated = sum(1 for r in f.latest.values() if (finite_number(r.get("simulated_world_size")) or 0) > 1)
        return (f"{f.name} ran on {f.device} with the `{f.profile}` profile (latest runs per section: {said}"
                + (f"; {simulated} of them simulated ranks, whose memory is real and time has no communication" if simulated else "")
                + "). Run `01` first there: it needs one device, and every section-02 run on one device is rank 0 "
                "alone.")  # fmt: skip

    def biggest() -> str:
        states = model_states("full-13b", profile="gpu")
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"the {gib(LAB_GPU_GIB)} GPU 00 asks about without one"
        return (f"A number worth noticing: `full-13b`'s model states alone are {gib(states.gib)} "
                f"({states.trained.formula()}), {larger(states.gib, memory)} than {where}.")  # fmt: skip

    return f.answer(sections, biggest)


# -- 01


@answer("01", "baseline")
def _baseline(f: Facts) -> Answer:
    def largest() -> str:
        plan = f.plan("baseline")
        part, value = plan.largest()
        return (f"The largest predicted part is {words(part)}: {gib(value)} of the {gib(plan.peak)} predicted peak "
                f"({100 * value / plan.peak:.0f} %); the weights (parameters) are {gib(plan.part('parameters'))}.")  # fmt: skip

    def free_weights() -> str:
        plan, memory = f.plan("baseline"), f.gpu_memory()
        without = plan.used - plan.part("parameters")
        status = f.record("baseline").get("status")
        return (f"With free weights the planner's GPU total ({gib(plan.used)}, allocator and CUDA context included) "
                f"would be {gib(without)}, {larger(without, memory)} than the GPU's {gib(memory)}: "
                f"{'it would still not fit' if without > memory else 'it would fit'}; the run here ended `{status}`.")  # fmt: skip

    return f.answer(largest, free_weights)


@answer("01", "small-batch")
def _small_batch(f: Facts) -> Answer:
    def activations() -> str:
        small, base = f.plan("small-batch"), f.plan("baseline")
        measured, batches = small.part("activations") / base.part("activations"), small.micro / base.micro
        verdict = ratio_words(measured, batches, 0.005)
        return (f"Predicted activations {gib(small.part('activations'))} / {gib(base.part('activations'))} = "
                f"{measured:.3f}; micro batches {small.micro} / {base.micro} = {batches:.3f}: {verdict} the batch ratio, "
                + ("so this prediction has no part that stays when the batch shrinks (per-position tensors such as "
                   "RoPE's cos/sin or a mask would be one)." if verdict == "equal to" else
                   "so a part does not scale with the batch: per-position tensors (RoPE's cos/sin, masks) or "
                   "per-step buffers."))  # fmt: skip

    def reserved() -> str:
        f.need_gpu("`peak_reserved_gib` and `gpu_used_peak_gib`")
        alloc, reserved_, used = (
            f.value("small-batch", c) for c in ("peak_alloc_gib", "peak_reserved_gib", "gpu_used_peak_gib")
        )
        return (f"On {f.device}: `peak_reserved_gib` {gib(reserved_)} - `peak_alloc_gib` {gib(alloc)} = "
                f"{gib(reserved_ - alloc)}, segments the caching allocator holds but had not handed out (freed blocks "
                f"kept for reuse, fragmentation); NVML's `gpu_used_peak_gib` {gib(used)} is {gib(used - reserved_)} "
                "more: the CUDA context and libraries' workspaces, outside PyTorch's allocator.")  # fmt: skip

    return f.answer(activations, reserved)


@answer("01", "grad-accum")
def _grad_accum(f: Facts) -> Answer:
    def compared() -> str:
        from lab_helpers.compare import steps_and_samples

        ga, sb = "grad-accum", "small-batch"
        per = {e: (f.ms_per_sample(e), f.value(e, "tokens_per_s"), f.peak(e), f.value(e, "train_s")) for e in (ga, sb)}
        cost = 100 * (per[ga][0] / per[sb][0] - 1)
        frame = steps_and_samples(_frame(f), [ga, sb]).set_index("experiment")
        samples = {e: int(frame.loc[e, "samples"]) for e in (ga, sb)}
        return (f"`{ga}` {per[ga][0]:.1f} ms/sample, {per[ga][1]:,.0f} tokens/s, {f.mem} {gib(per[ga][2])}; `{sb}` "
                f"{per[sb][0]:.1f} ms/sample, {per[sb][1]:,.0f} tokens/s, {gib(per[sb][2])}. Per sample accumulation "
                f"{'cost' if cost > 0 else 'saved'} {abs(cost):.0f} %, for {gib(per[ga][2] - per[sb][2])} more memory "
                f"(the summed gradients stay alive: predicted gradients {gib(f.plan(ga).part('gradients'))} against "
                f"{gib(f.plan(sb).part('gradients'))}). `train_s` misleads because the two timed different work: "
                f"{per[ga][3]:.2f} s for {samples[ga]} samples against {per[sb][3]:.2f} s for {samples[sb]}.")  # fmt: skip

    return f.answer(compared)


@answer("01", "bf16-true")
def _bf16_true(f: Facts) -> Answer:
    def halved() -> str:
        low, full = "bf16-true", "grad-accum"  # the same batches in fp32
        states = f.states(low).gib / f.states(full).gib
        peak = f.peak(low) / f.peak(full)
        a, b = f.plan(low), f.plan(full)
        above = {p: a.part(p) - b.part(p) * states for p in a.parts}
        part = max(above, key=above.get)
        return (f"Model states {gib(f.states(low).gib)} against `{full}`'s {gib(f.states(full).gib)} (the same batches "
                f"in {f.states(full).precision}): x{states:.2f}. The measured peak went {gib(f.peak(full))} -> "
                f"{gib(f.peak(low))}: x{peak:.2f}, {'about half' if abs(peak - states) < 0.05 else 'not half'}. "
                f"The part furthest above that factor is {words(part)}: {gib(b.part(part))} -> {gib(a.part(part))} "
                f"(x{a.part(part) / b.part(part):.2f}"
                + ("; the norms' and the logits' fp32 tensors stay fp32 whatever the weights' dtype)." if part == "activations" else ")."))  # fmt: skip

    return f.answer(halved)


@answer("01", "bf16-mixed")
def _bf16_mixed(f: Facts) -> Answer:
    def compared() -> str:
        mixed, true = "bf16-mixed", "bf16-true"
        mem = {e: f.peak(e) for e in (mixed, true)}
        tps = {e: f.value(e, "tokens_per_s") for e in (mixed, true)}
        faster = max(tps, key=tps.get)
        bound = {e: f.run(e).get("bound") for e in (mixed, true)}
        bounds = f" (bound: {mixed} {bound[mixed]}, {true} {bound[true]})" if all(bound.values()) else ""
        pick = (
            f"`{mixed}`: here it is also the faster one, and its fp32 master weights keep small updates; "
            f"its {gib(mem[mixed] - mem[true])} more must fit"
            if faster == mixed
            else f"`{true}` where its {(tps[true] / tps[mixed] - 1) * 100:.0f} % more tokens/s matter and the 1-hour "
            f"run tolerates bf16 updates; `{mixed}` where small updates must land (fp32 master weights)"
        )
        return (f"Memory: `{mixed}` {gib(mem[mixed])} against `{true}` {gib(mem[true])} ({gib(mem[mixed] - mem[true])} "
                f"more); tokens/s: {tps[mixed]:,.0f} against {tps[true]:,.0f} (x{tps[mixed] / tps[true]:.2f})"
                f"{bounds}. Pick {pick}.")  # fmt: skip

    return f.answer(compared)


@answer("01", "full-3b")
def _full_3b(f: Facts) -> Answer:
    def grew() -> str:
        big, small = f.plan("full-3b"), f.plan("bf16-true")
        model = big.params / small.params
        parts = sorted(((big.part(p) / small.part(p), p) for p in big.parts if small.part(p) > 0), reverse=True)
        faster = [f"{words(p)} x{r:.2f}" for r, p in parts if r > model * 1.02]
        slower = [f"{words(p)} x{r:.2f}" for r, p in parts if r < model * 0.98]
        same = [words(p) for r, p in parts if model * 0.98 <= r <= model * 1.02]
        precisions = {big.data.get("precision"), small.data.get("precision")}
        return (f"Parameters {big.params / 1e9:.3g}e9 against {small.params / 1e9:.3g}e9: x{model:.2f}; the predicted "
                f"peak {gib(big.peak)} against {gib(small.peak)}: x{big.peak / small.peak:.2f}, "
                f"{'more' if big.peak / small.peak > model else 'less'} than the model. Faster than the model: "
                f"{', '.join(faster) or 'none'}; with it: {', '.join(same) or 'none'}; slower: {', '.join(slower) or 'none'}"
                + (f" (the two ran in different precisions here: {', '.join(sorted(precisions))})." if len(precisions) > 1
                   else " (activations follow width and depth, not the parameter count)."))  # fmt: skip

    return f.answer(grew)


@answer("01", "full-7b")
def _full_7b(f: Facts) -> Answer:
    def left() -> str:
        plan, memory = f.plan("full-7b"), f.gpu_memory()
        return (f"At the predicted peak the planner's GPU total is {gib(plan.used)} of {gib(memory)}: "
                f"{gib(memory - plan.used)} left (activations {gib(plan.part('activations'))} at micro batch {plan.micro}).")  # fmt: skip

    def micro_8() -> str:
        from lab_helpers.predict import predict_experiment

        memory, record = f.gpu_memory(), f.record("full-7b")
        overrides = {**(record.get("overrides") or {}), "train.micro_batch_size": 2 * f.plan("full-7b").micro}
        plan = predict_experiment("full-7b", profile="gpu", overrides=overrides, gpu_memory_gib=memory, device="cuda")
        margin = memory * (1 - _fit_margin())
        verdict = (
            "does not fit"
            if plan.gpu_used_gib > memory
            else "fits only within the planner's error"
            if plan.gpu_used_gib > margin
            else "fits"
        )
        return (f"Micro batch {overrides['train.micro_batch_size']}: the planner predicts {gib(plan.gpu_used_gib)} "
                f"against {gib(memory)}: it {verdict}.")  # fmt: skip

    return f.answer(left, micro_8)


def _fit_margin() -> float:
    from lab_helpers.planner.fit import DEFAULT_MARGIN

    return DEFAULT_MARGIN


@answer("01", "activations-by-hand")
def _by_hand(f: Facts) -> Answer:
    def terms() -> str:
        from lab_helpers.activations_by_hand import block_terms, estimate, experiment_spec

        record = f.record("full-7b")
        spec = experiment_spec("full-7b", f.profile, record.get("overrides") or None)
        config, b = spec.model_config, None
        rows = block_terms(config, spec.precision)
        wide = [t.tensor for t in rows if t.elements_per_token == config.n_embd]
        mlp = [t.tensor for t in rows if t.elements_per_token == config.intermediate_size]
        now = estimate(config, spec.precision, spec.micro_batch_size, spec.seq_len)
        doubled = estimate(config, spec.precision, spec.micro_batch_size, 2 * spec.seq_len)
        b = rows[-1].bytes_per_element
        scores = config.n_head * (2 * spec.seq_len) ** 2 * b * config.n_layer * spec.micro_batch_size
        return (f"For `full-7b`'s {config.name} ({spec.precision}): with `n_embd` ({config.n_embd}) grow "
                f"{len(wide)} terms ({'; '.join(wide)}); with `intermediate_size` ({config.intermediate_size}) "
                f"{len(mlp)} ({'; '.join(mlp)}). Doubling the sequence ({spec.seq_len} -> {2 * spec.seq_len} tokens, "
                f"micro batch {spec.micro_batch_size}) doubles the count: {gib(now.total_bytes / GIB)} -> "
                f"{gib(doubled.total_bytes / GIB)}. An attention that keeps its T x T scores adds n_head x T^2 values "
                f"per layer and sample: {config.n_head} x {2 * spec.seq_len}^2 x {b} B x {config.n_layer} layers x "
                f"{spec.micro_batch_size} = {gib(scores / GIB)} more (its softmax output as much again), growing with "
                "the square of T.")  # fmt: skip

    return f.answer(terms)


@answer("01", "full-13b")
def _full_13b(f: Facts) -> Answer:
    from lab_helpers.arithmetic import OFFLOAD_HOST_BYTES_PER_PARAM, trainable_bytes
    from lab_helpers.decision import LAB_GPU_GIB, SIMULATED_WORLD

    def routes() -> str:
        states = _real_states(f, "full-13b")
        n, precision = states.counts.total, states.precision
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"an 80 GB GPU ({gib(LAB_GPU_GIB)})"
        options = {
            "plain SGD (no optimizer state)": trainable_bytes(precision, "SGD").total,
            "8-bit AdamW": trainable_bytes(precision, "AdamW8bit").total,
            f"FSDP full shard over {SIMULATED_WORLD} GPUs": states.trained.total / SIMULATED_WORLD,
            "DeepSpeed optimizer offload (weights and gradients stay)": states.trained.weights
            + states.trained.gradients,
        }
        listed = "; ".join(f"{name}: {per:.3g} B/param = {gib(n * per / GIB)}" for name, per in options.items())
        fit = [name for name, per in options.items() if n * per / GIB < memory]
        return (f"`full-13b`'s model states are {gib(states.gib)} ({states.trained.formula()}) against {where}. "
                f"Without touching the batch: {listed}. Model states under {where}: {', '.join(fit) or 'none'} "
                f"(the offload moves {OFFLOAD_HOST_BYTES_PER_PARAM} B/param to host RAM; activations and the step's "
                "temporaries still come on top).")  # fmt: skip

    return f.answer(routes)


@answer("01", "full-13b-sgd")
def _sgd(f: Facts) -> Answer:
    from lab_helpers.arithmetic import trainable_bytes

    def saved() -> str:
        adam, sgd = f.states("full-13b"), f.states("full-13b-sgd")
        momentum = trainable_bytes(sgd.precision, "SGD", {"momentum": 0.9})
        return (f"Arithmetic: {gib(adam.gib)} ({adam.trained.formula()}) -> {gib(sgd.gib)} ({sgd.trained.formula()}): "
                f"SGD saves {gib(adam.gib - sgd.gib)}, AdamW's two moments. SGD with momentum keeps one: "
                f"{momentum.formula()}.")  # fmt: skip

    def measured() -> str:
        adam, sgd = f.peak("full-13b"), f.peak("full-13b-sgd")
        return f"Measured ({f.mem}): {gib(adam)} -> {gib(sgd)}, {gib(adam - sgd)} less."

    return f.answer(saved, measured)


@answer("01", "lora-1b")
def _lora_1b(f: Facts) -> Answer:
    def parts() -> str:
        lora, full = f.plan("lora-1b"), f.plan("bf16-true")
        gone = [f"{words(p)} {gib(full.part(p))} -> {gib(lora.part(p))}" for p in full.parts
                if full.part(p) > 0 and lora.part(p) < 0.05 * full.part(p)]  # fmt: skip
        part, value = lora.largest()
        precisions = {lora.data.get("precision"), full.data.get("precision")}
        return (f"Against `bf16-true` (micro batch {full.micro}; `lora-1b` {lora.micro}): nearly gone: "
                f"{', '.join(gone) or 'none'}. Now the largest part is {words(part)}: {gib(value)} of {gib(lora.peak)}."
                + (f" (Here the two ran in different precisions: {', '.join(sorted(precisions))}.)" if len(precisions) > 1 else ""))  # fmt: skip

    return f.answer(parts)


@answer("01", "lora-3b")
def _lora_3b(f: Facts) -> Answer:
    def fraction() -> str:
        lora, full = f.plan("lora-3b"), f.plan("full-3b")
        measured = f.peak("lora-3b") / f.peak("full-3b")
        return (f"`lora-3b` needs {100 * measured:.0f} % of `full-3b`'s measured peak ({gib(f.peak('lora-3b'))} of "
                f"{gib(f.peak('full-3b'))}; predicted {100 * lora.peak / full.peak:.0f} %). Of the difference, activations "
                f"went {gib(full.part('activations'))} -> {gib(lora.part('activations'))} (micro batch {full.micro} -> "
                f"{lora.micro}) and the model states {gib(full.model_states())} -> {gib(lora.model_states())}.")  # fmt: skip

    return f.answer(fraction)


@answer("01", "lora-7b")
def _lora_7b(f: Facts) -> Answer:
    def room() -> str:
        memory, plan = f.gpu_memory(), f.plan("lora-7b")
        used = f.value("lora-7b", "gpu_used_peak_gib")
        left, per_sample = memory - used, plan.part("activations") / plan.micro
        extra = f.states("lora-13b").gib - f.states("lora-7b").gib  # the bigger model's extra model states
        if f.run("lora-7b").get("bound") == "host":
            why = "a larger micro batch is the one that also pays the host's per-micro-batch cost less often."
        elif extra < left:
            why = f"the room holds even the 13B's {gib(extra)} of extra model states: the one choice that buys a better model."
        else:
            why = (
                f"the 13B's {gib(extra)} of extra model states exceed the room: spend it on the batch or the sequence."
            )
        return (f"Room: {gib(memory)} - NVML's {gib(used)} = {gib(left)}. A sample costs {gib(per_sample)} of "
                f"activations ({gib(plan.part('activations'))} / micro batch {plan.micro}): about {int(left // per_sample)} "
                f"more samples per micro-batch, or sequences up to about x{1 + left / plan.part('activations'):.1f} as long "
                f"(activations grow linearly with the tokens under a fused attention). A bigger model: `lora-13b`'s model "
                f"states are {gib(extra)} more than `lora-7b`'s; {why}")  # fmt: skip

    return f.answer(room)


@answer("01", "lora-13b")
def _lora_13b(f: Facts) -> Answer:
    def compared() -> str:
        lora, sgd = "lora-13b", "full-13b-sgd"
        mem = {e: f.peak(e) for e in (lora, sgd)}
        ms = {e: f.ms_per_sample(e) for e in (lora, sgd)}
        trained = f.plan(lora).data.get("trainable_params") / f.plan(lora).params
        smaller, faster = min(mem, key=mem.get), min(ms, key=ms.get)
        return (f"Memory ({f.mem}): `{lora}` {gib(mem[lora])}, `{sgd}` {gib(mem[sgd])}; time: {ms[lora]:.1f} against "
                f"{ms[sgd]:.1f} ms/sample. `{smaller}` is smaller and `{faster}` faster here. `{lora}` trains "
                f"{100 * trained:.2f} % of the weights (adapters) with AdamW; `{sgd}` trains them all but without "
                f"AdamW's per-parameter step sizes, so it learns slowly: "
                f"{f'choose `{lora}`: it wins on both here' if smaller == faster == lora else f'choose `{faster}` for time, `{smaller}` for memory'}.")  # fmt: skip

    def states() -> str:
        return (
            f"Model states (arithmetic): `lora-13b` {gib(f.states('lora-13b').gib)}, "
            f"`full-13b-sgd` {gib(f.states('full-13b-sgd').gib)}."
        )

    return f.answer(states, compared)


@answer("01", "qlora-7b")
def _qlora(f: Facts) -> Answer:
    def compared() -> str:
        q, lora = f.plan("qlora-7b"), f.plan("lora-7b")
        mem = {e: f.peak(e) for e in ("qlora-7b", "lora-7b")}
        tps = {e: f.value(e, "tokens_per_s") for e in ("qlora-7b", "lora-7b")}
        return (f"Measured: `qlora-7b` {gib(mem['qlora-7b'])} against `lora-7b` {gib(mem['lora-7b'])} "
                f"({gib(mem['lora-7b'] - mem['qlora-7b'])} saved; predicted frozen weights {gib(lora.part('parameters'))} "
                f"-> {gib(q.part('parameters'))}). Tokens/s {tps['qlora-7b']:,.0f} against {tps['lora-7b']:,.0f}: "
                f"{abs(100 * (tps['qlora-7b'] / tps['lora-7b'] - 1)):.0f} % "
                + ("slower (each layer's weights are dequantised for its matmul)." if tps["qlora-7b"] < tps["lora-7b"]
                   else "faster here, despite dequantising each layer's weights for its matmul."))  # fmt: skip

    return f.answer(compared)


@answer("01", "act-ckpt", 1)
def _act_ckpt_phases(f: Facts) -> Answer:
    def phases() -> str:
        ck, full = f.plan("act-ckpt"), f.plan("full-7b")
        top = {p: ", ".join(f"{words(k)} {gib(v)}" for k, v in sorted(x.parts.items(), key=lambda kv: -kv[1])[:4])
               for p, x in (("act-ckpt", ck), ("full-7b", full))}  # fmt: skip
        grew = max(ck.parts, key=lambda p: ck.part(p) - full.part(p))
        return (f"`full-7b` peaks in {phase_words(full.data.get('peak_phase'))}: {top['full-7b']}. `act-ckpt` peaks in "
                f"{phase_words(ck.data.get('peak_phase'))}: {top['act-ckpt']}. Activations fell "
                f"{gib(full.part('activations'))} -> {gib(ck.part('activations'))}; their place was taken by "
                f"{words(grew)}, {gib(full.part(grew))} -> {gib(ck.part(grew))} (AdamW's foreach update allocates "
                "parameter-sized temporaries).")  # fmt: skip

    return f.answer(phases)


@answer("01", "act-ckpt", 2)
def _act_ckpt_cost(f: Facts) -> Answer:
    def cost() -> str:
        saved = f.peak("full-7b") - f.peak("act-ckpt")
        ms = {e: f.ms_per_sample(e) for e in ("act-ckpt", "full-7b")}
        steady = {e: f.steady_ms_per_sample(e) for e in ("act-ckpt", "full-7b")}
        from lab_helpers.planner.timing import recompute_flops

        model = f.value("act-ckpt", "flops_per_token")  # model FLOPs: the recompute is not in them
        flops = (model + recompute_flops(model, str(f.run("act-ckpt").get("method")))) / model
        time = steady["act-ckpt"] / steady["full-7b"]
        return (f"Saved {gib(saved)} ({f.mem} {gib(f.peak('full-7b'))} -> {gib(f.peak('act-ckpt'))}). Time per sample "
                f"{ms['full-7b']:.1f} -> {ms['act-ckpt']:.1f} ms (steady median {steady['full-7b']:.1f} -> "
                f"{steady['act-ckpt']:.1f}: x{time:.2f}), against x{flops:.2f} FLOPs with one more forward: the time is "
                f"{'close to' if abs(time - flops) < 0.1 else 'more than' if time > flops else 'less than'} the FLOPs' "
                f"share{' (the run is host-bound: the recompute adds host work, its kernel launches, as well as FLOPs)' if f.run('act-ckpt').get('bound') == 'host' else ''}. "
                f"The saved memory could buy a larger micro batch (activations per sample "
                f"{gib(f.plan('act-ckpt').part('activations') / f.micro('act-ckpt'))} with checkpointing) or longer "
                "sequences.")  # fmt: skip

    return f.answer(cost)


@answer("01", "adamw-8bit")
def _adamw_8bit(f: Facts) -> Answer:
    from lab_helpers.arithmetic import trainable_bytes

    def states() -> str:
        full = f.plan("full-7b")
        precision = f.states("full-7b").precision
        adam, eight = trainable_bytes(precision, "AdamW"), trainable_bytes(precision, "AdamW8bit")
        optimizer = full.part("optimizer_states") * eight.optimizer_states / adam.optimizer_states
        try:
            optimizer = f.plan("adamw-8bit").part("optimizer_states")
            source = "predicted"
        except Cannot:
            source = "by the arithmetic, `adamw-8bit` not predicted here"
        rest = {p: v for p, v in full.parts.items() if p != "optimizer_states"}
        part = max(rest, key=rest.get)
        return (f"Optimizer states: `full-7b` {gib(full.part('optimizer_states'))} ({adam.optimizer_states:g} B/param) "
                f"-> {gib(optimizer)} with 8-bit AdamW ({eight.optimizer_states:.3g} B/param; {source}). The largest "
                f"part is now {words(part)} ({gib(rest[part])}): combine with {TECHNIQUE_FOR.get(part, 'LoRA')}.")  # fmt: skip

    return f.answer(states, lambda: _ran_or_not(f, "adamw-8bit"))


def _ran_or_not(f: Facts, exp: str) -> str:
    record = f.run(exp)
    return f"Measured `{exp}`: {gib(f.peak(exp))} ({f.mem}), {record.get('tokens_per_s') or 0:,.0f} tokens/s."


@answer("01", "fill-gpu", 1)
def _fill_gpu_rate(f: Facts) -> Answer:
    def rate() -> str:
        grew = f.micro("fill-gpu") / f.micro("lora-1b")
        tps = f.value("fill-gpu", "tokens_per_s") / f.value("lora-1b", "tokens_per_s")
        record = f.run("fill-gpu")
        bound = (
            f"`{record.get('bound')}` ({record.get('bound_reason')})" if record.get("bound") else "not recorded here"
        )
        return (f"Micro batch {f.micro('lora-1b')} -> {f.micro('fill-gpu')} (x{grew:.2f}); tokens/s "
                f"{f.value('lora-1b', 'tokens_per_s'):,.0f} -> {f.value('fill-gpu', 'tokens_per_s'):,.0f} (x{tps:.2f}): "
                f"{ratio_words(tps, grew, 0.02)} the factor. The bound now: {bound}.")  # fmt: skip

    return f.answer(rate)


@answer("01", "fill-gpu", 2)
def _fill_gpu_sample(f: Facts) -> Answer:
    def per_sample() -> str:
        ms = {e: f.ms_per_sample(e) for e in ("lora-1b", "fill-gpu")}
        grew = f.micro("fill-gpu") / f.micro("lora-1b")
        fell = ms["lora-1b"] / ms["fill-gpu"]
        busy = {e: f.run(e).get("gpu_busy_pct") for e in ("lora-1b", "fill-gpu")}
        bound = {e: f.run(e).get("bound") for e in ("lora-1b", "fill-gpu")}
        if not all(bound.values()):
            raise Cannot(f"{f.name}'s records of `lora-1b` and `fill-gpu` carry no `bound`")
        return (f"ms/sample {ms['lora-1b']:.1f} -> {ms['fill-gpu']:.1f} (/{fell:.2f}) for a micro batch x{grew:.2f}: "
                f"{'in proportion' if abs(fell / grew - 1) < 0.1 else 'less than in proportion' if fell < grew else 'more than in proportion'}; "
                f"{f.mem} {gib(f.peak('lora-1b'))} -> {gib(f.peak('fill-gpu'))}. `lora-1b` was `{bound['lora-1b']}` bound "
                f"(GPU busy {busy['lora-1b']:.0f} %), `fill-gpu` `{bound['fill-gpu']}` ({busy['fill-gpu']:.0f} %): the "
                "host's cost is paid per micro-batch, so fewer, larger micro-batches pay it less often per sample.")  # fmt: skip

    return f.answer(per_sample)


@answer("01", "length-grouped")
def _length_grouped(f: Facts) -> Answer:
    pair = "small-batch"  # the same samples and batch in the default order (configs/experiments/single.yaml)

    def padding() -> str:
        pad, real, padded = (f.value(pair, c) for c in ("padding_pct", "tokens_per_s", "tokens_per_s_padded"))
        return f"`{pair}` padded {pad:.0f} % of its tokens: {real:,.0f} real against {padded:,.0f} padded tokens/s."

    def grouped() -> str:
        exp = "length-grouped"
        pads = {e: f.value(e, "padding_pct") for e in (exp, pair)}
        real = {e: f.value(e, "tokens_per_s") for e in (exp, pair)}
        gain = 100 * (real[exp] / real[pair] - 1)
        return (
            f"`{exp}` padded {pads[exp]:.0f} % against {pads[pair]:.0f} %, and trained {real[exp]:,.0f} real tokens/s "
            f"against {real[pair]:,.0f} ({gain:+.0f} %): less padding "
            + ("bought real tokens/s, the device's time shrinking with the padded length" if gain > 0 else
               "bought no speed here: the step's time did not shrink with the padded length")
            + f". Memory: {gib(f.peak(exp))} against {gib(f.peak(pair))} (predicted {gib(f.plan(exp).peak)}; the longest "
            "batch is the same one)."
        )  # fmt: skip

    return f.answer(padding, grouped)


# -- 02


def _one_gpu(f: Facts) -> str:
    """`one-gpu`, else 01's `full-7b` (the same 7B, bf16-true and micro batch on one device)."""
    try:
        f.run("one-gpu")
        return "one-gpu"
    except Cannot:
        f.run("full-7b")
        return "full-7b"


@answer("02", "one-gpu")
def _one_gpu_parts(f: Facts) -> Answer:
    def parts() -> str:
        plan = f.plan("one-gpu")
        return (f"`one-gpu` predicted: activations {gib(plan.part('activations'))} (and temporaries "
                f"{gib(plan.part('temporaries'))}) scale with the micro batch: halving {plan.micro} to {plan.micro // 2} "
                f"halves the activations to about {gib(plan.part('activations') / 2)}. Parameters "
                f"{gib(plan.part('parameters'))}, gradients {gib(plan.part('gradients'))} and optimizer states "
                f"{gib(plan.part('optimizer_states'))} ({gib(plan.model_states())} of model states) do not change.")  # fmt: skip

    return f.answer(parts)


@answer("02", "ddp")
def _ddp(f: Facts) -> Answer:
    def memory() -> str:
        base, plan = _one_gpu(f), f.plan("ddp")
        return (f"{f.label('ddp')}: {f.mem} {gib(f.peak('ddp'))} against `{base}`'s {gib(f.peak(base))}; predicted model "
                f"states per rank {gib(plan.model_states())} against {gib(f.plan(base).model_states())}: every rank "
                "holds the whole model, its gradients and optimizer states, so adding GPUs adds copies, not room.")  # fmt: skip

    def efficiency() -> str:
        if f.simulated("ddp"):
            raise Cannot(
                f"scaling efficiency: {f.name}'s `ddp` is a simulated rank, whose tokens/s has no communication in it"
            )
        n, base = f.world(f.run("ddp")), _one_gpu(f)
        eff = f.value("ddp", "tokens_per_s") * n / (n * f.value(base, "tokens_per_s"))
        return f"Scaling efficiency on {n} GPUs: {eff:.2f}; the rest is the all-reduce not hidden behind backward."

    return f.answer(memory, efficiency)


@answer("02", "ddp-course")
def _ddp_course(f: Facts) -> Answer:
    def extra() -> str:
        world = f.world(f.run("ddp-course"))
        more = f.peak("ddp-course", world) - f.peak("ddp", world)
        plan = f.plan("ddp-course", world)
        return (f"{f.label('ddp-course', world)} holds {gib(more)} more than {f.label('ddp', world)} ({f.mem}); per "
                f"parameter {more * GIB / plan.params:.2f} B (predicted communication buffers "
                f"{gib(plan.part('communication_buffers'))}: a second copy of the gradients). With gradients freed "
                "between steps, autograd would allocate new gradient tensors that are no longer views of the buckets, "
                "so the buckets would be a second copy again.")  # fmt: skip

    return f.answer(extra)


@answer("02", "fsdp")
def _fsdp_communication(f: Facts) -> Answer:
    from lab_helpers.planner.communication import communication_per_optimizer_step

    def times() -> str:
        ddp, fsdp = f.communication("ddp"), f.communication("fsdp")
        psi = fsdp.volume.psi_bytes

        def multiple(m: int) -> float:
            volume = communication_per_optimizer_step(strategy="fsdp", parameter_count=psi, bytes_per_parameter=1,
                                                      world_size=fsdp.ranks, micro_batches_per_step=m)  # fmt: skip
            return volume.psi_multiple

        return (f"Per optimizer step on {fsdp.ranks} GPUs: `fsdp` {fsdp.psi_multiple:g}Ψ at {fsdp.micro_batches} "
                f"micro-batch{'es' if fsdp.micro_batches > 1 else ''} against DDP's {ddp.psi_multiple:g}Ψ: x{fsdp.psi_multiple / ddp.psi_multiple:g} "
                f"(Ψ = {gib(fsdp.psi_gib)}). With 4 micro-batches {multiple(4):g}Ψ (x{multiple(4) / ddp.psi_multiple:g}), "
                f"with one {multiple(1):g}Ψ (x{multiple(1) / ddp.psi_multiple:g}): FSDP pays per micro-batch, DDP per "
                "step. In a real N-GPU run the price shows as a longer `train_s` and lower `tokens_per_s` than a "
                "simulated rank's; prefetching the next block's all-gather during the current block's compute hides "
                "it as far as compute per block lasts longer than its gather.")  # fmt: skip

    def simulated() -> str:
        if not f.simulated("fsdp"):
            return f"{f.label('fsdp')} measured {f.value('fsdp', 'tokens_per_s'):,.0f} tokens/s per rank."
        raise Cannot(f"the price itself: {f.name}'s `fsdp` is a simulated rank, which has no communication time")

    return f.answer(times, simulated)


@answer("02", "fsdp-course")
def _fsdp_course(f: Facts) -> Answer:
    from lab_helpers.planner.communication import communication_per_optimizer_step

    def grew() -> str:
        world = f.world(f.run("fsdp-course"))
        course, block = f.plan("fsdp-course", world), f.plan("fsdp", world)
        part = max(course.parts, key=lambda p: course.part(p) - block.part(p))
        psi = f.communication("fsdp").volume.psi_bytes
        one = communication_per_optimizer_step(
            strategy="fsdp",
            sharding="grad-op",
            parameter_count=psi,
            bytes_per_parameter=1,
            world_size=world,
            micro_batches_per_step=1,
        )
        per_block = communication_per_optimizer_step(strategy="fsdp", parameter_count=psi, bytes_per_parameter=1,
                                                     world_size=world, micro_batches_per_step=1)  # fmt: skip
        return (f"{f.label('fsdp-course', world)} against {f.label('fsdp', world)}: {words(part)} grew "
                f"{gib(course.part(part))} against {gib(block.part(part))} (+{gib(course.part(part) - block.part(part))}); "
                f"measured {gib(f.peak('fsdp-course', world))} against {gib(f.peak('fsdp', world))}. The one unit is "
                f"gathered whole (Ψ = {gib(psi / GIB)}, whatever N), so more GPUs do not shrink it. Per-block wrapping "
                f"buys holding one block at a time; it costs {per_block.psi_multiple:g}Ψ per micro-batch (gathered "
                f"again for backward) against the one unit's {one.psi_multiple:g}Ψ.")  # fmt: skip

    return f.answer(grew)


@answer("02", "fsdp-bs8")
def _fsdp_bs8(f: Facts) -> Answer:
    def grew() -> str:
        world = f.world(f.run("fsdp-bs8"))
        more = f.peak("fsdp-bs8", world) - f.peak("fsdp", world)
        samples = f.micro("fsdp-bs8", world) - f.micro("fsdp", world)
        plan, base = f.plan("fsdp-bs8", world), f.plan("fsdp", world)
        return (f"{f.label('fsdp-bs8', world)}: {gib(f.peak('fsdp-bs8', world))} against {gib(f.peak('fsdp', world))}, "
                f"+{gib(more)} for {samples} more samples per micro-batch: {gib(more / samples)} per sample measured "
                f"(predicted activations {gib(base.part('activations'))} -> {gib(plan.part('activations'))}, "
                f"{gib((plan.part('activations') - base.part('activations')) / samples)} per sample): activations grow "
                "linearly with the micro batch, the sharded model states do not move.")  # fmt: skip

    return f.answer(grew)


@answer("02", "fsdp-grad-op")
def _fsdp_grad_op(f: Facts) -> Answer:
    def memory() -> str:
        world = f.world(f.run("fsdp-grad-op"))
        plan, base = f.plan("fsdp-grad-op", world), f.plan("fsdp", world)
        return (f"{f.label('fsdp-grad-op', world)} needs {gib(f.peak('fsdp-grad-op', world) - f.peak('fsdp', world))} "
                f"more than `fsdp` ({gib(f.peak('fsdp-grad-op', world))} against {gib(f.peak('fsdp', world))}; predicted "
                f"communication buffers, the gathered weights, {gib(plan.part('communication_buffers'))} against "
                f"{gib(base.part('communication_buffers'))}).")  # fmt: skip

    def saved() -> str:
        full, grad_op = f.communication("fsdp"), f.communication("fsdp-grad-op")
        return (f"Communication per step and GPU: {gib(full.per_gpu_gib)} ({full.psi_multiple:g}Ψ) against "
                f"{gib(grad_op.per_gpu_gib)} ({grad_op.psi_multiple:g}Ψ) on {full.ranks} GPUs: "
                f"{gib(full.per_gpu_gib - grad_op.per_gpu_gib)} saved. Worth it where those GiB take long: PCIe or "
                "between nodes, far more than over NVLink, and only while the memory is there.")  # fmt: skip

    return f.answer(memory, saved)


@answer("02", "deepspeed-offload")
def _offload(f: Facts) -> Answer:
    from lab_helpers.arithmetic import OFFLOAD_HOST_BYTES_PER_PARAM, offload_host_gib

    def arithmetic() -> str:
        return (f"The offload keeps {OFFLOAD_HOST_BYTES_PER_PARAM} B/param in host RAM (fp32 master weights, both "
                f"moments, fp32 gradient partitions): {gib(offload_host_gib('deepspeed-offload', profile=f.profile))} "
                f"for `deepspeed-offload`'s model, stepped by the CPU; host RAM (and the CPU step's time) limits the "
                "model size.")  # fmt: skip

    def measured() -> str:
        mine = f.value("deepspeed-offload", "host_rss_peak_gib")
        others = [
            rss
            for (e, _), r in f.latest.items()
            if e != "deepspeed-offload" and (rss := finite_number(r.get("host_rss_peak_gib"))) is not None
        ]
        return f"Measured `host_rss_peak_gib` {gib(mine)} against {gib(min(others))}-{gib(max(others))} for the other runs."

    return f.answer(arithmetic, measured)


@answer("02", "deepspeed-zero2-offload")
def _zero2(f: Facts) -> Answer:
    from lab_helpers.arithmetic import trainable_bytes

    def arithmetic() -> str:
        two, three = f.communication("deepspeed-zero2-offload"), f.communication("deepspeed-offload")
        big = _real_states(f, "deepspeed-offload")
        per_param = trainable_bytes(big.precision).weights
        weights = big.counts.total * per_param / GIB
        try:
            memory, where = f.gpu_memory(), f"this GPU's {gib(f.gpu_memory())}"
        except Cannot:
            from lab_helpers.decision import LAB_GPU_GIB

            memory, where = LAB_GPU_GIB, f"an 80 GB GPU's {gib(LAB_GPU_GIB)}"
        return (
            f"ZeRO-2 keeps the whole weights on every GPU and sends {two.psi_multiple:g}Ψ per step "
            f"({gib(two.per_gpu_gib)}) against ZeRO-3's {three.psi_multiple:g}Ψ ({gib(three.per_gpu_gib)}; {three.ranks} "
            f"GPUs, each recipe's model and accumulation): pick it where the weights fit, to send less. It cannot fit "
            f"where the weights alone fill the GPU: {where} holds the {big.precision} weights of about "
            f"{memory * GIB / per_param / 1e9:.3g}e9 parameters ({per_param:g} B each), before activations and gradient "
            f"buckets; the real {big.model}'s are {gib(weights)}, "
            f"{'so ZeRO-2 could hold them here' if weights < memory else 'so only ZeRO-3 fits it here'}."
        )

    def measured() -> str:
        return (f"Measured: per GPU {gib(f.peak('deepspeed-zero2-offload'))} against {gib(f.peak('deepspeed-offload'))}; "
                f"host RSS {gib(f.value('deepspeed-zero2-offload', 'host_rss_peak_gib'))} against "
                f"{gib(f.value('deepspeed-offload', 'host_rss_peak_gib'))}.")  # fmt: skip

    return f.answer(arithmetic, measured)


@answer("02", "timeline-where-the-gpus-wait")
def _offload_idle(f: Facts) -> Answer:
    def idle() -> str:
        record = f.run("deepspeed-offload")
        f.need_gpu("idle GPUs")
        share = _idle_share(record)
        return (
            f"In `deepspeed-offload`'s timed loop every GPU was under {_idle_pct():g} % busy {share:.0f} % of the time."
        )

    return f.answer(
        idle,
        "A larger accumulation makes it smaller: the CPU's optimizer step comes once per step, "
        "the GPU's work once per micro-batch.",
    )


def _idle_pct() -> float:
    """The utilisation under which the timeline shades a GPU as idle (``compare._idle_spans``' default)."""
    import inspect

    from lab_helpers.compare import _idle_spans

    return float(inspect.signature(_idle_spans).parameters["threshold_pct"].default)


def _idle_share(record: Mapping[str, Any]) -> float:
    from lab_helpers.compare import _idle_spans, _timeline_path, read_timeline

    path, _ = _timeline_path(record)
    window = record.get("loop_window_s")
    if path is None or not isinstance(window, list | tuple):
        raise Cannot(f"`{record.get('experiment')}` has no timeline with its loop's window")
    frame = read_timeline(path)
    start, end = window
    spans = _idle_spans(frame[frame["gpu"].notna()])
    idle = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
    return 100 * idle / (end - start)


@answer("02", "multi-node")
def _multi_node(f: Facts) -> Answer:
    def most() -> str:
        from lab_helpers.experiments import load_experiments

        names = [e for e, x in load_experiments("multi").items() if x.strategy != "single" and e != "multi-node"]
        sent = {e: f.communication(e) for e in names}
        worst = max(sent, key=lambda e: sent[e].per_gpu_gib)
        listed = ", ".join(f"`{e}` {gib(c.per_gpu_gib)} ({c.psi_multiple:g}Ψ)" for e, c in sent.items())
        return (f"Bytes each GPU sends per optimizer step on {sent[worst].ranks} GPUs, with each recipe's "
                f"accumulation: {listed}. `{worst}` sends the most, so it suffers most when the all-gathers cross the "
                "network; DDP, one all-reduce per step, least.")  # fmt: skip

    return f.answer(most)


# -- 03


@answer("03", "peak-memory-measured-beside-the-predicted-breakdown")
def _bars(f: Facts) -> Answer:
    def largest() -> str:
        plans = {}
        for (e, w), record in f.latest.items():
            if isinstance(record.get("predicted"), Mapping) and w == 1:
                plans[e] = Plan(e, record["predicted"])
        if not plans:
            raise Cannot(f"{f.name} has no predictions")
        top = max(p.part("optimizer_states") for p in plans.values())
        optimizer = "`, `".join(e for e, p in plans.items() if p.part("optimizer_states") >= 0.995 * top)
        share = {e: p.part("activations") / p.peak for e, p in plans.items()}
        acts = max(share, key=share.get)
        return (f"Largest optimizer states: `{optimizer}`, {gib(top)}: "
                f"{TECHNIQUE_FOR['optimizer_states']}. Activations dominate `{acts}`: {gib(plans[acts].part('activations'))}, "
                f"{100 * share[acts]:.0f} % of its predicted peak: {TECHNIQUE_FOR['activations']}.")  # fmt: skip

    return f.answer(largest)


TIME_PAIRS = (("small-batch", "grad-accum"), ("bf16-true", "bf16-mixed"), ("lora-7b", "qlora-7b"))
"""The pairs 03's time section names."""


@answer("03", "training-time-and-tokens-per-second")
def _one_offs(f: Facts) -> Answer:
    def pairs() -> str:
        said, swapped = [], []
        for a, b in TIME_PAIRS:
            try:
                ra, rb = f.run(a), f.run(b)
            except Cannot:
                continue
            raw = {a: f.value(a, "train_s"), b: f.value(b, "train_s")}
            steady = {e: raw[e] - (one_off_excess_s(r) or 0.0) for e, r in ((a, ra), (b, rb))}
            said.append(f"`{a}` {raw[a]:.2f} s ({steady[a]:.2f} without one-offs) against `{b}` {raw[b]:.2f} s "
                        f"({steady[b]:.2f})")  # fmt: skip
            if (raw[a] < raw[b]) != (steady[a] < steady[b]):
                swapped.append(f"`{a}`/`{b}`")
        if not said:
            raise Cannot(f"{f.name} ran none of the pairs")
        return (f"`train_s`: {'; '.join(said)}. "
                + (f"Changed places: {', '.join(swapped)}." if swapped else "No pair changes places."))  # fmt: skip

    def median() -> str:
        spread = {}
        for (e, w), record in f.latest.items():
            times = [s for _, s in timed_iterations(record)]
            if w == 1 and len(times) >= 2:
                spread[e] = (statistics.mean(times), statistics.median(times), len(times))
        if not spread:
            raise Cannot(f"{f.name}'s records have no timed iterations")
        e = max(spread, key=lambda k: spread[k][0] / spread[k][1])
        mean, median_, n = spread[e]
        return (f"One iteration is one sample of a noisy time (kernel shapes, the allocator, the host); a median of "
                f"several ignores the few slow ones a mean takes in: `{e}`'s {n} timed iterations have a mean of "
                f"{1e3 * mean:.0f} ms and a median of {1e3 * median_:.0f} ms.")  # fmt: skip

    return f.answer(pairs, median)


@answer("03", "where-the-time-goes")
def _host_bound(f: Facts) -> Answer:
    def evidence() -> str:
        for exp, run in (("lora-1b", "fill-gpu"),):
            busy = {e: f.value(e, "gpu_busy_pct") for e in (exp, run)}
            step = {e: f.value(e, "iter_median_s") for e in (exp, run)}
            per = {e: f.steady_ms_per_sample(e) for e in (exp, run)}
            return (f"In {f.name}: `{exp}` (`{f.run(exp).get('bound')}`, GPU {busy[exp]:.0f} % busy) took "
                    f"{1e3 * step[exp]:.0f} ms per micro-batch of {f.micro(exp)}; `{run}` at micro batch {f.micro(run)} "
                    f"{1e3 * step[run]:.0f} ms: per sample {per[exp]:.1f} -> {per[run]:.1f} ms.")  # fmt: skip
        return ""

    return f.answer(
        "Faster per sample, about the same per step: a host-bound step's time is the host's work per "
        "micro-batch (Python, kernel launches), which does not grow with the batch while the GPU has idle "
        "time to absorb the larger kernels.",
        evidence,
    )


MEMORY_TIME_PAIRS = (
    ("bf16", "grad-accum", "bf16-true"),
    ("LoRA", "full-7b", "lora-7b"),
    ("QLoRA's 4-bit weights", "lora-7b", "qlora-7b"),
    ("activation checkpointing", "full-7b", "act-ckpt"),
    ("8-bit AdamW", "full-7b", "adamw-8bit"),
    ("SGD", "full-13b", "full-13b-sgd"),
)
"""(technique, the run without it, the run with it): the moves in 03's memory-against-time plane."""


@answer("03", "memory-against-time")
def _memory_time(f: Facts) -> Answer:
    def moves() -> str:
        moved = {}
        for technique, base, run in MEMORY_TIME_PAIRS:
            try:
                moved[technique] = (
                    f.peak(run) - f.peak(base),
                    f.steady_ms_per_sample(run) - f.steady_ms_per_sample(base),
                    base,
                    run,
                )
            except Cannot:
                continue
        if not moved:
            raise Cannot(f"{f.name} ran none of the technique pairs")
        listed = "; ".join(
            f"{t} (`{b}` -> `{r}`): {gib(dm)}, {dt:+.1f} ms/sample" for t, (dm, dt, b, r) in moved.items()
        )
        down = {t: v for t, v in moved.items() if v[0] < 0 and v[1] <= 0}
        paid = {t: v for t, v in moved.items() if v[0] < 0 and v[1] > 0}
        best = min(down, key=lambda t: down[t][0]) if down else None
        slow = max(paid, key=lambda t: paid[t][1]) if paid else None
        return (f"Moves (memory, steady time per sample): {listed}. "
                + (f"Furthest down without moving right: {best}. " if best else "None moved down without moving right here. ")
                + (f"Paid most time for its saving: {slow}." if slow else "None paid time for a saving here."))  # fmt: skip

    return f.answer(moves)


@answer("03", "the-gpu-timeline-of-one-run")
def _before_training(f: Facts) -> Answer:
    def idle() -> str:
        from lab_helpers.compare import _idle_spans, _timeline_path, read_timeline

        exp = _timeline_experiment()
        record = f.run(exp)
        f.need_gpu("GPU idle time")
        path, _ = _timeline_path(record)
        if path is None:
            raise Cannot(f"{f.name} shipped no timeline of `{exp}`")
        frame = read_timeline(path)
        spans = _idle_spans(frame[frame["gpu"].notna()])
        wall = f.value(exp, "wall_s")
        window = record.get("loop_window_s")
        if isinstance(window, list | tuple):
            before = sum(max(0.0, min(b, window[0]) - a) for a, b in spans if a < window[0])
            where = f"before its timed loop began at {window[0]:.1f} s"
        elif spans and spans[0][0] <= float(frame["t_s"].min()):
            before, where = (
                spans[0][1] - spans[0][0],
                "from launch until its first busy sample (the record has no loop window)",
            )
        else:
            raise Cannot(f"`{exp}`'s timeline does not start idle")
        return (f"`{exp}` (03's `TIMELINE_EXPERIMENT`): every GPU under {_idle_pct():g} % busy for {before:.1f} s {where}: "
                f"{100 * before / wall:.0f} % of its `wall_s` {wall:.1f} s (loading the model, building the step).")  # fmt: skip

    return f.answer(idle)


def _timeline_experiment() -> str:
    """The run 03 draws (its parameters cell's ``TIMELINE_EXPERIMENT``)."""
    path = notebooks_dir() / "03_compare.ipynb"
    found = (
        re.search(r'TIMELINE_EXPERIMENT = \\?"([\w.-]+)', path.read_text(encoding="utf-8")) if path.is_file() else None
    )
    if not found:
        raise Cannot("03 names no TIMELINE_EXPERIMENT")
    return found.group(1)


# -- 04


@answer("04", "things-to-try")
def _cheapest(f: Facts) -> Answer:
    def routes() -> str:
        from lab_helpers.arithmetic import trainable_bytes
        from lab_helpers.decision import LAB_GPU_GIB, SIMULATED_WORLD

        states = _real_states(f, "full-13b")
        n, b = states.counts.total, states.trained
        try:
            memory, where = f.gpu_memory(), f"this GPU ({gib(f.gpu_memory())})"
        except Cannot:
            memory, where = LAB_GPU_GIB, f"an 80 GB GPU ({gib(LAB_GPU_GIB)}; {f.name} has none)"
        options = {
            "nothing (AdamW as is)": b.total,
            "8-bit AdamW": trainable_bytes(states.precision, "AdamW8bit").total,
            "SGD": trainable_bytes(states.precision, "SGD").total,
            f"FSDP over {SIMULATED_WORLD} GPUs": b.total / SIMULATED_WORLD,
            "ZeRO-3 with the optimizer offloaded, one GPU": b.weights + b.gradients,
        }
        fits = [name for name, per in options.items() if n * per / GIB < memory]
        cheapest = fits[0] if fits else None
        listed = "; ".join(f"{name} {gib(n * per / GIB)}" for name, per in options.items())
        return (f"The largest model is {states.model} ({n / 1e9:.3g}e9 parameters, {states.precision}). Its model "
                f"states by route: {listed}, against {where}. "
                + ("No single route fits the model states here." if not cheapest else
                   "The model states fit as they are: no change needed for them" if cheapest == next(iter(options)) else
                   f"The first in that order (least changed, least slowed) whose states fit: {cheapest}")
                + ("; activations and the optimizer step's temporaries come on top, so `plan --fit` must confirm it."
                   if cheapest else "."))  # fmt: skip

    return f.answer(routes)


# ------------------------------------------------------------------------------------------------ the report


def load_facts(name: str) -> Facts:
    from lab_helpers.compare import reference_stem, shipped_references
    from lab_helpers.experiments import LabConfigError
    from lab_helpers.paths import reference_dir
    from lab_helpers.records import conformed, read_records

    stem = reference_stem(name)
    shipped = shipped_references()
    if stem not in shipped:
        raise LabConfigError(f"--reference {name}: no such reference in {reference_dir()}; shipped: "
                             + (", ".join(shipped) or "none"))  # fmt: skip
    return Facts(stem, [conformed(r) for r in read_records(reference_dir() / f"{stem}.jsonl")])


def _frame(f: Facts):
    import pandas as pd

    return pd.DataFrame(f.records)


@dataclass
class Keyed:
    question: Question
    answer: Answer | None  # None: no entry answers it


def answer_all(f: Facts, questions: list[Question]) -> list[Keyed]:
    """Each question with its answer; a section's entries beyond its last question answer that question too."""
    asked: dict[tuple[str, str], int] = {}
    for q in questions:
        asked[(q.notebook, q.section)] = max(asked.get((q.notebook, q.section), 0), q.n)
    out = []
    for q in questions:
        keys = [q.key]
        if q.n == asked[(q.notebook, q.section)]:
            keys += sorted(k for k in ANSWERS if k[:2] == q.key[:2] and k[2] > q.n)
        found = [ANSWERS[k](f) for k in keys if k in ANSWERS]
        if not found:
            out.append(Keyed(q, None))
            continue
        out.append(Keyed(q, Answer(" ".join(a.text for a in found if a.text),
                                   list(dict.fromkeys(m for a in found for m in a.missing)),
                                   any(a.computed for a in found))))  # fmt: skip
    return out


def unanswered(questions: list[Question]) -> list[Question]:
    """Questions without an entry in ``ANSWERS`` (a new question: write its answer function)."""
    return [q for q in questions if q.key not in ANSWERS]


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def report(name: str, *, notebook: str | None = None, markdown: bool = False) -> str:
    from lab_helpers.compare import load_reference, reference_label

    f = load_facts(name)
    questions = [q for q in notebook_questions() if notebook is None or q.notebook == notebook or q.file == notebook]
    keyed = answer_all(f, questions)
    lines = [
        f"Answer key for the notebooks' questions, computed from {f.name}.jsonl",
        _wrap(reference_label(load_reference(f.name))),
        "",
    ]
    file = section = None
    cannot, partly, missing = [], [], []
    for item in keyed:
        q, a = item.question, item.answer
        if q.file != file:
            file, section = q.file, None
            lines += [f"## {file}" if markdown else f"===== {file} =====", ""]
        if q.section != section:
            section = q.section
            lines += [f"### {section}" if markdown else f"--- {section} ---", ""]
        lines.append(_wrap(q.text if markdown else q.text.replace(MARK, f"Q{q.n}.")))
        head = f"**Answer ({f.name}).**" if markdown else f"Answer ({f.name}):"
        where = f"{q.notebook} {q.section} Q{q.n}"
        if a is None:
            lines.append(_wrap(f"{head} no answer entry for this question yet (lab_helpers/answers.py: "
                               f"answer({q.notebook!r}, {q.section!r}, {q.n}))."))  # fmt: skip
            missing.append(where)
        else:
            text = a.text
            if a.missing:
                text += (" " if text else "") + f"Not from {f.name}: " + "; ".join(a.missing) + "."
                (partly if a.computed else cannot).append(f"{where} ({'; '.join(a.missing)})")
            lines.append(_wrap(f"{head} {text}"))
        lines.append("")
    lines.append(f"{f.name} cannot answer {len(cannot)} of {len(keyed)} questions" + (":" if cannot else "."))
    lines += [_wrap(c, "    ").replace("    ", "  - ", 1) for c in cannot]
    lines.append(f"{f.name} answers {len(partly)} in part" + (":" if partly else "."))
    lines += [_wrap(c, "    ").replace("    ", "  - ", 1) for c in partly]
    if missing:
        lines.append(f"no answer entry: {', '.join(missing)}")
    return "\n".join(lines)
