#!/usr/bin/env python3
"""Step 4 of issue 44's relayout: ``planning/decision.py`` split where its parts are separate decisions.

profile_choice: which profile this node runs and why a profile or its GPUs cannot (``$LAB_MODELS`` too).
node_limits: what the node offers a run (bf16, its GPUs in words, ranks, RAM) and host RAM against an offload
run. sections: which sections of the course this node can run. decision keeps the gate (``blocked``) and
``decide``, and whatever main adds to it unless named below. ``_torch_problem`` and ``_smaller_model_checkpoint``
get public names (they are used across modules now). Run at the root of a checkout (``--check``: only report).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from splitlib import Edit, Part, Split, run  # noqa: E402

PROFILE_CHOICE = ["MODELS_ENV", "models_here", "default_profile_here", "profile_problem", "gpu_problem",
                  "_torch_problem"]  # fmt: skip
NODE_LIMITS = ["bf16_native", "gpu_words", "reference_hint", "ram_gib", "node_ranks", "OffloadFit", "offload_host_gib",
               "offload_fit", "_model_of", "_with_overrides", "_smaller_model_checkpoint"]  # fmt: skip
SECTIONS = ["sections_runnable", "_offload_section"]

PROFILE_DOC = """\
Which profile this node runs, and why a profile or its GPUs cannot run here: the first of ``decision``'s
questions, asked by ``lab.default_profile``, the doctor and ``decision.decide``.

``gpu`` where torch drives the GPUs, ``ci`` where there are none, and a stop with the fix where NVML sees GPUs that
torch cannot use (a driver older than torch's CUDA build, a CPU-only torch, a V100 with a build without Volta
kernels). ``$LAB_MODELS`` narrows the model sizes a node prepared.
"""

NODE_DOC = """\
What this node offers a run, in the words and numbers ``decision`` weighs: native bf16, its GPUs in words,
the ranks a run starts here, and host RAM against an optimizer-offload run (``offload_fit``: the planner's one
formula, and the profile's largest model that fits where the run's own does not).
"""

SECTIONS_DOC = """\
Which sections of the course this node can run, each with the reason in one line: what the doctor and
``00_check_node`` print and what ``run-all`` acts on (``decision.decide`` then decides each experiment).
"""

DECISION = "lab_helpers/planning/decision.py"

SPEC = Split(
    source="lab_helpers.planning.decision",
    parts=[
        Part("lab_helpers.planning.profile_choice", PROFILE_CHOICE, PROFILE_DOC),
        Part("lab_helpers.planning.node_limits", NODE_LIMITS, NODE_DOC),
        Part("lab_helpers.planning.sections", SECTIONS, SECTIONS_DOC),
    ],
    renames={"_torch_problem": "torch_problem", "_smaller_model_checkpoint": "smaller_model_checkpoint"},
    edits=[
        Edit(DECISION, "(:func:`default_profile_here`, :func:`profile_problem`);", "(``profile_choice``);"),
        Edit(
            DECISION,
            "the node's cgroup-aware RAM: the largest model",
            "the node's cgroup-aware RAM (``node_limits``): the largest model",
        ),
        Edit(DECISION, "# " + "-" * 95 + " per section\n\n\n", ""),  # sections.py is that section
        Edit(
            DECISION,
            "    torch_problem = _torch_problem(node)\n    if cuda and torch_problem:\n"
            '        result["single"] = (False, torch_problem)\n',
            "    problem = _torch_problem(node)\n    if cuda and problem:\n"
            '        result["single"] = (False, problem)\n',
        ),  # the local would shadow the function's new name
        Edit("tests/test_node_plan.py", "node_plan._smaller_model_checkpoint(", "node_plan.smaller_model_checkpoint("),
    ],
)

if __name__ == "__main__":
    sys.exit(run(SPEC))
