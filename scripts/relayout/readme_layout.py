#!/usr/bin/env python3
"""Step 7 of issue 44's relayout: the README's ``## Layout`` section, replaced as a whole.

The tree (one line per layer package), the path of one run through it, and the home-made parts with their one-line
reasons, each named by its path in the new layout. The section is found by its heading and runs to the next
``## `` heading (or the end); the step stops if there is not exactly one, or if a module the text names is not in
the package. Run at the root of a checkout (``--check``: only report).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = "README.md"
HEADING = "## Layout\n"

# package -> the modules the tree names in it (each must exist); the tree's lines are below
NAMED = {
    "": ["cli", "lab", "node_plan"],
    "present": ["tables", "figures", "what_if", "step_memory", "plan_command", "commands", "doctor", "guesses",
                "multi_gpu"],
    "record": ["run_record", "records", "fallback", "recovery", "reference", "results_folder"],
    "launch": ["runner", "warm_start", "warm_server", "sampler", "interrupts", "time_limit", "litgpt_cli",
               "lightning_strategy"],
    "training": ["child_litgpt", "child_report", "quick_mode", "tensor_peak", "distributed"],
    "assets": ["prepare", "wheelhouse", "wheel_plan", "_atomic"],
    "planning": ["planner", "predict", "decision", "profile_choice", "node_limits", "sections"],
    "hardware": ["node", "cuda_compat", "cpu_speed", "gpu_peaks", "bandwidth"],
    "config": ["experiments", "recipe_check", "record_schema", "paths", "secrets"],
}  # fmt: skip

SECTION = """\
## Layout

```text
lab_helpers/   one package per layer, top to bottom; each imports only those below it (.importlinter)
  cli  lab  node_plan    what the CLI and the notebooks call (lab: the notebooks' one namespace), the node's plan
  present/     tables, figures, what_if, step_memory, plan_command, commands, doctor, guesses, multi_gpu
  record/      run_record (reports to a record), records (runs.jsonl), fallback, recovery, reference, results_folder
  launch/      launcher_for (litgpt_cli, lightning_strategy), runner, warm_start (+ warm_server), sampler, time_limit
  training/    inside the training process: child_litgpt, child_report, quick_mode, tensor_peak, distributed/
  assets/      offline tokenizer, checkpoints and data; prepare, wheelhouse (+ wheel_plan: what it collects)
  planning/    planner/ (memory, time, what fits), predict, decision (+ profile_choice, node_limits, sections)
  hardware/    node (the hardware, described once), cuda_compat, cpu_speed, gpu_peaks, bandwidth
  config/      experiments (the matrix, the frozen ResolvedRun), recipe_check, record_schema, paths, secrets
configs/ notebooks/ provisioning/ benchmarks/ reference_results/ scripts/ docs/
```
One experiment: `lab.run_experiment` → `config/experiments.resolve` (`recipe_check`: the recipe's one check) →
`planning/decision` (run, change or skip) → `planning/predict` → `launch` (the command) → `launch/runner` (own
process group; `warm_start` forks it) → `training/child_litgpt` inside litgpt's `finetune_*` →
`training/child_report` → `record/run_record` → `record/records` (one line in `runs.jsonl`) → `present/tables`
and `present/figures`. `scripts/relayout/` made this layout from the flat one (issue 44); its `apply.sh` runs
every step again on a checkout of main.

Home-made parts, and why each stays:
- `launch/warm_start`: multiprocessing's forkserver forks a preloaded Python too, but runs a function, not `python -m
  MODULE` with its own command line, session and output; its staleness check stats every file the server imported.
  CI-only (the `ci` profile) until a GPU session shows warm and cold runs measure the same.
- `assets/wheelhouse`: a front end to pip's own resolver (`pip install --dry-run --report`, `pip download`,
  `pip wheel`); it adds a metadata-only stand-in for the node's CUDA torch, litgpt's caps checked, bitsandbytes cut
  to one CUDA.
- `assets/_atomic`: the standard library has `os.replace` for a file, nothing for a folder built then renamed.
- `config/recipe_check`: litgpt's own CLI parser (jsonargparse) and `validate_args` check every recipe; a walk over
  litgpt's annotations goes first, as the parser lets `train=5` and `checkpoint_dir=''` through and answers in
  ten-line messages.
- `hardware/cuda_compat`, `hardware/gpu_peaks`: no maintained library maps a driver and GPU to the torch build
  that runs, or gives dense (not 2:4 sparse) tensor peaks per precision; each fact cites PyTorch's release matrix
  or a datasheet.
"""


def missing_modules(root: Path) -> list[str]:
    out = []
    for package, modules in NAMED.items():
        folder = root / "lab_helpers" / package
        for module in modules:
            if not ((folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file()):
                out.append(f"lab_helpers/{package + '/' if package else ''}{module}")
    return out


def main(argv: list[str]) -> int:
    root = Path.cwd()
    text = (root / README).read_text()
    starts = [m.start() for m in re.finditer(rf"^{re.escape(HEADING)}", text, re.M)]
    if len(starts) != 1:
        raise SystemExit(f"relayout: {README} has {len(starts)} '{HEADING.strip()}' headings, not one")
    start = starts[0]
    following = re.search(r"^## ", text[start + len(HEADING) :], re.M)
    end = start + len(HEADING) + following.start() if following else len(text)
    if missing := missing_modules(root):
        raise SystemExit(f"relayout: the Layout names modules that are not there: {', '.join(missing)}")
    tree = SECTION.split("```text\n")[1].split("```")[0].splitlines()
    if len(tree) > 15 or max(len(line) for line in SECTION.splitlines()) > 120:
        raise SystemExit("relayout: the Layout's tree must fit 15 lines of 120 columns")
    new = text[:start] + SECTION + ("\n" if following else "") + text[end:]
    if "--check" in argv:
        print(f"  {README}: Layout at line {text[:start].count(chr(10)) + 1}, {text[start:end].count(chr(10))} lines "
              f"-> {SECTION.count(chr(10))} lines")  # fmt: skip
        return 0
    (root / README).write_text(new)
    print(f"relayout: {README}: Layout replaced ({len(tree)} lines of tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
