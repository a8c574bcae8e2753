"""The answer key's machinery: the notebooks' questions, one reference's facts, the registry the answers register in,
and the report's formatting. The answers themselves are the notebook modules beside this one."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab_helpers.config.iteration_times import finite_number
from lab_helpers.config.record_schema import BREAKDOWN_PARTS
from lab_helpers.present.speed_pairs import STEP_OVERRIDES as STEP_OVERRIDES  # single_levers names them here
from lab_helpers.present.speed_pairs import step_variant

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
    from lab_helpers.config.paths import lab_home

    return lab_home() / "notebooks"


def section_key(heading: str) -> str:
    """``## 3 · `grad-accum`: ...`` -> ``grad-accum``: the number is left out, so renumbering keeps the key."""
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

    # -- the names of the planner's MemoryPlan, so that ``arithmetic``'s words take a stored prediction too

    @property
    def breakdown_gib(self) -> dict[str, float]:
        return dict(self.data.get("breakdown_gib") or {})

    @property
    def peak_alloc_gib(self) -> float:
        return self.peak

    @property
    def peak_phase(self) -> str | None:
        return self.data.get("peak_phase")

    @property
    def optimizer_step(self) -> str | None:
        return self.data.get("optimizer_step")


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
        ordered = sorted(  # an experiment's latest run as defined; its latest step variant only where it has none
            enumerate(records), key=lambda ir: (not step_variant(ir[1]), str(ir[1].get("started_at") or ""), ir[0])
        )
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
        from lab_helpers.planning.decision import SIMULATED_WORLD

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

    def verdict(self, exp: str, against: str):
        """``exp`` against ``against`` by the lab's one speed rule (``speed_pairs.compare``), or Cannot."""
        from lab_helpers.present.speed_pairs import compare

        found = compare(self.records, exp, against)
        if isinstance(found, str):
            raise Cannot(f"{self.name}: {found}")
        return found

    def speed(self, exp: str, against: str) -> str:
        """The rule's one line: both times per sample, the change with its 95 % interval, the verdict."""
        return self.verdict(exp, against).words()

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
        from lab_helpers.planning.arithmetic import model_states

        return model_states(exp, profile=self.profile, overrides=overrides or None)

    def communication(self, exp: str):
        from lab_helpers.planning.arithmetic import communication
        from lab_helpers.planning.decision import SIMULATED_WORLD

        return communication(exp, profile=self.profile, ranks=SIMULATED_WORLD)

    def simulated(self, exp: str) -> bool:
        return bool((finite_number(self.record(exp).get("simulated_world_size")) or 0) > 1)

    # -- answers of several parts

    def answer(self, *parts: str | Callable[[], str]) -> Answer:
        """Each part a sentence or a function of the records; a function that raises ``Cannot`` becomes a
        'not from this reference' reason instead."""
        from lab_helpers.planning.planner.errors import PlanError

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


def real_states(f: Facts, exp: str):
    """The model states of the real model (the gpu profile's) where a question names a GPU's size: a CPU
    reference's stand-ins are tiny, and would fit any GPU."""
    from lab_helpers.planning.arithmetic import model_states

    return model_states(exp, profile="gpu")


def idle_pct() -> float:
    """The utilisation under which the timeline shades a GPU as idle (``compare._idle_spans``' default)."""
    import inspect

    from lab_helpers.present.figures import _idle_spans

    return float(inspect.signature(_idle_spans).parameters["threshold_pct"].default)


# ------------------------------------------------------------------------------------------------ the report


def load_facts(name: str) -> Facts:
    from lab_helpers.config.experiments import LabConfigError
    from lab_helpers.config.paths import reference_dir
    from lab_helpers.present.tables import reference_stem, shipped_references
    from lab_helpers.record.records import conformed_records, read_records

    stem = reference_stem(name)
    shipped = shipped_references()
    if stem not in shipped:
        raise LabConfigError(f"--reference {name}: no such reference in {reference_dir()}; shipped: "
                             + (", ".join(shipped) or "none"))  # fmt: skip
    return Facts(stem, conformed_records(read_records(reference_dir() / f"{stem}.jsonl")))  # as the tables read them


def records_frame(f: Facts):
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


def format_report(f: Facts, keyed: list[Keyed], *, markdown: bool = False) -> str:
    """The key as printed: each notebook's questions with their answers, then what this reference cannot answer."""
    from lab_helpers.present.tables import load_reference, reference_label

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
            lines.append(_wrap(f"{head} no answer entry for this question yet (lab_helpers/present/answers/: "
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
