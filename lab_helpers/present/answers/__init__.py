"""The answer key: every question the notebooks ask, answered from one reference's records. Generated, as a typed key
drifts from the notebooks and the data: the questions are read from the notebooks, and each answer is a short
function of the records and the lab's arithmetic. A section is the experiment id of the nearest heading, so
rewording a question keeps its answer; one without an entry fails tests/test_answers.py. The answers register
when their modules are imported here: ``single`` and ``single_levers`` (01), ``multi`` (02), ``others`` (00, 03, 04).
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
    """``notebook``: "01" or its file's stem."""
    f = load_facts(name)
    asked = notebook_questions(notebooks_dir())
    questions = [q for q in asked if notebook is None or q.notebook == notebook or q.file == notebook]
    if not questions and notebook is not None:  # a typo ("1", "99") would print an empty key and exit 0
        from lab_helpers.config.experiments import LabConfigError

        numbers = ", ".join(sorted({q.notebook for q in asked})) or "none"
        raise LabConfigError(f"--notebook {notebook}: no notebook of that number asks questions; those that do: "
                             f"{numbers} (or a file's name without .ipynb, e.g. 01_single_gpu)")  # fmt: skip
    return format_report(f, answer_all(f, questions), markdown=markdown)
