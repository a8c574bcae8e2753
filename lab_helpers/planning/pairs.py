"""What an experiment and its pair (``pair:`` in configs/experiments) compare on this node, and the one sentence that
says what moved or what to compare instead; ``decision._paired`` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lab_helpers.planning.node_limits import smaller_model_checkpoint

if TYPE_CHECKING:  # annotations only: no import at run time
    from lab_helpers.planning.decision_types import Decision


# ----------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class PairSettings:
    runs: bool
    ok: bool  # runs expecting no OOM (an OOM demonstration's batch is its lesson: never moved)
    model: str  # the model key (1b, 3b, ...) it trains here
    checkpoint_dir: str
    micro: int
    global_batch: int
    shrinks_global: bool  # defined without accumulation (small-batch): its global batch follows its micro batch
    per_rank: bool  # ``accumulation: 1``: the global batch follows micro batch x ranks
    fills: bool  # ``fill_gpu``: its micro batch is chosen when it starts, the largest that fits -- its lesson
    all_gpus: bool  # ``devices: all``: its ranks are the node's GPUs
    defined_micro: int
    defined_checkpoint_dir: str


def pair_settings(step: Decision) -> PairSettings:
    from lab_helpers.config.experiments import resolve

    run = resolve(step.exp_id, step.profile, step.overrides, check_files=False)
    defined_run = resolve(step.exp_id, step.profile, check_files=False)
    defined = defined_run.recipe["train"]
    train = run.recipe["train"]
    per_rank = run.experiment.accumulation == 1
    return PairSettings(
        runs=step.runs,
        ok=step.expected_status == "ok",
        model=model_key(run, defined_run),
        checkpoint_dir=str(run.recipe["checkpoint_dir"]),
        micro=int(train["micro_batch_size"]),
        global_batch=int(train.get("global_batch_size") or train["micro_batch_size"]),
        shrinks_global=not per_rank and int(defined.get("global_batch_size") or 0) == int(defined["micro_batch_size"]),
        per_rank=per_rank,
        fills=bool(run.options.get("fill_gpu")),
        all_gpus=run.experiment.devices == "all",
        defined_micro=int(defined["micro_batch_size"]),
        defined_checkpoint_dir=str(defined_run.recipe["checkpoint_dir"]),
    )


def model_key(run: Any, defined: Any) -> str:
    """A substitute's is the profile's model whose checkpoint its ``checkpoint_dir`` names."""
    from lab_helpers.config.experiments import check_profile

    checkpoint_dir = str(run.recipe["checkpoint_dir"])
    if checkpoint_dir == str(defined.recipe["checkpoint_dir"]):
        return run.experiment.model
    models = check_profile(run.profile)["models"]
    return next((k for k in models if smaller_model_checkpoint(run.profile, k) == checkpoint_dir), checkpoint_dir)


def can_run_at(s: PairSettings, micro: int, step: Decision, node: Mapping[str, Any]) -> bool:
    """``micro`` fits, no larger than what the step fits alone; it must divide the global batch over the ranks."""
    if micro >= s.micro or s.shrinks_global or s.per_rank:
        return True
    ranks = step.simulate_world or (len(node.get("gpus") or []) if s.all_gpus else 1) or 1
    return s.global_batch % (micro * ranks) == 0


def at_micro(overrides: Mapping[str, Any], s: PairSettings, micro: int) -> dict[str, Any]:
    """No override where ``micro`` is the recipe's own."""
    out = dict(overrides)
    if micro == s.micro:
        return out
    out.pop("train.micro_batch_size", None)
    if micro != s.defined_micro:
        out["train.micro_batch_size"] = micro
    if s.shrinks_global:
        out.pop("train.global_batch_size", None)
        if micro != s.defined_micro:
            out["train.global_batch_size"] = micro
    return out


def moved_words(s: PairSettings, target: int, others: list[str], setter: str) -> str:
    what = "micro and global batch" if s.shrinks_global else "micro batch per GPU" if s.per_rank else "micro batch"
    said = s.micro != s.defined_micro  # the step's sentence already says the global batch stays
    kept = "" if s.shrinks_global or s.per_rank or said else f"; the global batch stays {s.global_batch}"
    return (
        f"{what} {s.micro} -> {target} so that it compares with {' and '.join(others)} at the same micro batch "
        f"({target} is the largest {setter} fits here{kept})"
    )


def pair_clause(
    exp_id: str, pair: str, alone: Mapping[str, Decision], settings: Mapping[str, PairSettings], micro: Mapping[str, int]
) -> str | None:
    """None where they compare at the same settings."""
    mine, theirs = settings[exp_id], settings[pair]
    if theirs.runs and theirs.model == mine.model:
        if mine.fills:
            return (
                f"its pair {pair} runs at micro batch {micro[pair]}; this run takes the largest that fits when it "
                "starts, the one difference between them"
            )
        if micro[pair] == micro[exp_id]:
            return None
    if not theirs.runs:
        state = "does not run here"
    elif theirs.model != mine.model:
        state = f"runs the {theirs.model.upper()} model here and this run the {mine.model.upper()}"
    else:
        state = f"runs at micro batch {micro[pair]} here and this run at {micro[exp_id]}"
    ask = prediction_overrides(alone[pair], theirs, mine, micro[exp_id])
    given = f", overrides={ask!r}" if ask else ""
    call = f"lab.predict_experiment({pair!r}, profile={alone[pair].profile!r}{given})"
    return (
        f"its pair {pair} {state}, so compare with the planner's prediction for {pair} on the "
        f"{mine.model.upper()} model at micro batch {micro[exp_id]}: {call}"
    )


def prediction_overrides(pair_step: Decision, theirs: PairSettings, mine: PairSettings, micro: int) -> dict[str, Any]:
    """The pair's own precision route kept."""
    batch = ("train.micro_batch_size", "train.global_batch_size", "checkpoint_dir")
    out = {k: v for k, v in pair_step.overrides.items() if k not in batch}
    if mine.checkpoint_dir != theirs.defined_checkpoint_dir:
        out["checkpoint_dir"] = mine.checkpoint_dir
    if micro != theirs.defined_micro:
        out["train.micro_batch_size"] = micro
        if theirs.shrinks_global:
            out["train.global_batch_size"] = micro
    return out
