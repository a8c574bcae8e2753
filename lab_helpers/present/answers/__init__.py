"""The answer key (issue 43): every question the notebooks ask, answered from one reference's records.

Why generated: a typed key drifts from the notebooks and from the data, and the shipped references differ (an
H100's quick runs, an H200's speed chunk and simulated ranks, the ci profile on a CPU). So the questions are read
from the notebooks themselves (``**Question.**`` paragraphs, keyed by notebook, section and order), and each answer
is a short function of that reference's records (measured columns and the planner's stored prediction) and of the
lab's arithmetic (``lab_helpers.planning.arithmetic``, ``planner.communication``, ``activations_by_hand``): no figure is
typed here. Where a question is open, the answer gives the figures and one sentence whose wording is chosen by
comparing them. What a reference cannot answer (an experiment it did not run, a CPU's missing GPU memory, a
simulated rank's missing communication) is said, with why. ``python -m lab_helpers answers --reference NAME``.

A section is the backticked experiment id of the nearest ``##``/``###`` heading above the question (else a slug of
the heading), so rewording a question keeps its answer; a question without an entry here is printed as such and
fails tests/test_answers.py. Where a section asks fewer questions than it has entries, its last question gets the
rest too (a section that merges two questions keeps both answers).

The package (issue 44): ``key`` holds the questions, a reference's ``Facts``, ``Cannot``, the registry
(``@answer(notebook, section, n)``) and the report's formatting; the answers are one module per notebook group,
each registering its entries when imported here: ``single`` and ``single_levers`` (01), ``multi`` (02),
``others`` (00, 03, 04).
"""

from __future__ import annotations

from lab_helpers.present.answers import multi, others, single, single_levers  # noqa: F401  (each registers its answers)
from lab_helpers.present.answers.key import (
    ANSWERS,
    MARK,
    WIDTH,
    Answer,
    Cannot,
    Facts,
    Question,
    answer,
    answer_all,
    format_report,
    load_facts,
    notebook_questions,
    notebooks_dir,
    section_key,
    unanswered,
)

__all__ = [
    "ANSWERS",
    "MARK",
    "WIDTH",
    "Answer",
    "Cannot",
    "Facts",
    "Question",
    "answer",
    "answer_all",
    "load_facts",
    "notebook_questions",
    "notebooks_dir",
    "report",
    "section_key",
    "unanswered",
]


def report(name: str, *, notebook: str | None = None, markdown: bool = False) -> str:
    """The key for reference ``name`` (``--reference``), of every notebook or only ``notebook`` ("01" or its
    file's stem), as ``python -m lab_helpers answers`` prints it."""
    f = load_facts(name)
    asked = notebook_questions(notebooks_dir())
    questions = [q for q in asked if notebook is None or q.notebook == notebook or q.file == notebook]
    if not questions and notebook is not None:  # a typo ("1", "99") would print an empty key and exit 0
        from lab_helpers.config.experiments import LabConfigError

        numbers = ", ".join(sorted({q.notebook for q in asked})) or "none"
        raise LabConfigError(f"--notebook {notebook}: no notebook of that number asks questions; those that do: "
                             f"{numbers} (or a file's name without .ipynb, e.g. 01_single_gpu)")  # fmt: skip
    return format_report(f, answer_all(f, questions), markdown=markdown)
