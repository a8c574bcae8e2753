"""The experiment matrix (configs/experiments/*.yaml) resolved into the exact recipe a run gets, checked the way
litgpt would check it so that a typo or an impossible batch costs one clear line, not a process start and a traceback.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import math
import reprlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab_helpers.config.config_error import LabConfigError, did_you_mean
from lab_helpers.config.paths import checkpoints_dir, configs_dir, data_dir, lab_home
from lab_helpers.config.recipe_defaults import BATCH_ORDERS, CHILD_LEVERS, launch_options, lever_problem
from lab_helpers.config.record_schema import LAUNCHERS, LEGACY_KIND_TO_LAUNCHER
from lab_helpers.config.secrets import mask_secret_keys
from lab_helpers.config.yaml_values import load_yaml, shown

PROFILES = ("ci", "gpu")
SECTIONS = ("single", "multi")
METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class Experiment:
    """One row of LAB.md's matrix, as stored in configs/experiments/<section>.yaml."""

    id: str
    section: str
    model: str
    method: str
    teaches: str = ""
    expect: str = ""
    # What the run adds, for a student on a short lease: a non-empty line makes it optional (LAB_PATH=core skips
    # it); "" is the core path, which every student runs
    optional: str = ""
    set: Mapping[str, Any] = field(default_factory=dict)
    set_by_profile: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    # How its training process starts (record_schema.LAUNCHERS): litgpt's CLI, one process ("litgpt-cli"), or
    # the Lightning Trainer with a strategy ("lightning-strategy", lab_helpers.training.distributed). The YAML's old
    # ``kind: litgpt | lightning`` is still read.
    launcher: str = "litgpt-cli"
    strategy: str = "single"  # single | ddp | fsdp | deepspeed-zero3 (lightning-strategy experiments)
    devices: int | str = 1  # an int, or "all" for every GPU on the node (2 processes on a CPU)
    num_nodes: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)  # launch settings, e.g. offload (recipe_defaults)
    # Micro-batches per optimizer step on each rank, whatever the world: the global batch is then micro batch x
    # this x ranks wherever it runs (the course's rows: batch 4 per GPU, no accumulation). None: the recipe's
    # global batch, divided among the ranks. A run's own train.global_batch_size override still wins.
    accumulation: int | None = None
    # The experiment of the same section this one is compared with (its cell puts the two side by side; its
    # ``expect`` names it): on a node where both run on one model, the decision runs them at the same micro
    # batch, or the step says why they cannot compare (decision.decide). None: compared with none.
    pair: str | None = None

    @property
    def distributed(self) -> bool:
        """Started as ranks of the Lightning Trainer (one record per rank), not as one litgpt CLI process."""
        return self.launcher == "lightning-strategy"


@dataclass(frozen=True)
class ResolvedRun:
    """An experiment made concrete for one profile. The numbers later steps need (world size, accumulation,
    iterations, launch options) are properties of it, so the planner, command, progress bar and record share one rule."""

    experiment: Experiment
    profile: str
    recipe_path: Path
    recipe: dict[str, Any]
    overrides: dict[str, Any]
    devices: int  # processes (GPUs) per node
    # rank 0 of this world played alone on one device with torch's fake process group (lab_helpers.training.distributed.
    # simulated): ``devices`` is then the world it plays, and one process runs (``ranks_run``)
    simulated_world_size: int | None = None

    @property
    def world_size(self) -> int:
        return self.devices * self.experiment.num_nodes

    @property
    def litgpt_command(self) -> str:
        return litgpt_command_for(self.experiment.method)

    @property
    def ranks_run(self) -> int:
        return 1 if self.simulated_world_size else self.world_size

    @property
    def gradient_accumulation(self) -> int:
        return gradient_accumulation_steps(self.recipe, world_size=self.world_size)

    @property
    def total_iterations(self) -> int | None:
        """Micro-batches rank 0 runs; None when litgpt trains by epochs. The Lightning script runs ``max_steps or 1``."""
        max_steps = (self.recipe.get("train") or {}).get("max_steps")
        if not max_steps and self.experiment.distributed:
            max_steps = 1
        return int(max_steps) * self.gradient_accumulation if max_steps else None

    def train_with(self, more: Mapping[str, Any]) -> dict[str, Any]:
        """The ``train`` section with ``more`` on top: the launcher settles a run's last overrides before resolving once."""
        recipe = apply_overrides(self.recipe, {k: v for k, v in more.items() if k.startswith("train.")})
        return _batch_for_world(self.experiment, recipe, {**self.overrides, **more}, self.devices)["train"]

    @property
    def options(self) -> dict[str, Any]:
        return launch_options(self.experiment.strategy, self.experiment.options)


def litgpt_command_for(method: str) -> str:
    return "finetune_lora" if method in ("lora", "qlora") else "finetune_full"


def gradient_accumulation_steps(recipe: Mapping[str, Any], *, world_size: int) -> int:
    """litgpt's ``TrainArgs.gradient_accumulation_iters``, restated because importing litgpt costs the launcher
    seconds; tests/test_settings_drift.py checks that the two agree."""
    train = recipe.get("train") or {}
    micro, global_ = int(train["micro_batch_size"]), int(train["global_batch_size"])
    return max(1, global_ // (micro * world_size))


# ----------------------------------------------------------------------------------------------- loading


def load_profiles() -> dict[str, dict[str, Any]]:
    return _read_yaml(configs_dir() / "profiles.yaml")


def load_experiments(section: str | None = None) -> dict[str, Experiment]:
    """All experiments (of one section), in the order the notebooks run them."""
    if section is not None and section not in SECTIONS:
        raise LabConfigError(f"unknown section {section!r}: choose one of {', '.join(SECTIONS)}")
    experiments: dict[str, Experiment] = {}
    for name in SECTIONS if section is None else (section,):
        path = configs_dir() / "experiments" / f"{name}.yaml"
        if not path.exists():
            continue
        for exp_id, spec in (_read_yaml(path) or {}).items():
            spec = dict(spec)
            spec["needs"] = tuple(spec.get("needs", ()))
            if "kind" in spec:  # the old name of `launcher`
                kind = spec.pop("kind")
                if kind not in LEGACY_KIND_TO_LAUNCHER:
                    raise LabConfigError(f"experiment {exp_id!r}: kind {kind!r} is not litgpt or lightning")
                spec.setdefault("launcher", LEGACY_KIND_TO_LAUNCHER[kind])
            if spec.get("launcher", "litgpt-cli") not in LAUNCHERS:
                raise LabConfigError(
                    f"experiment {exp_id!r}: launcher {spec['launcher']!r} is not one of {', '.join(LAUNCHERS)}"
                )
            experiments[exp_id] = Experiment(id=exp_id, section=name, **spec)
        check_pairs({e: x for e, x in experiments.items() if x.section == name}, path)
    return experiments


def check_pairs(section: Mapping[str, Experiment], path: Path) -> None:
    """A pair compares one change on one model, and an unknown id would silently compare nothing."""
    for exp_id, experiment in section.items():
        pair = experiment.pair
        if pair is None:
            continue
        if not isinstance(pair, str) or pair not in section or pair == exp_id:
            known = {e: x for e, x in section.items() if e != exp_id}
            hint = did_you_mean(str(pair), known) if isinstance(pair, str) else f"; known: {', '.join(known)}"
            raise LabConfigError(f"experiment {exp_id!r} in {path.name}: pair {pair!r} is not another experiment "
                                 f"of {path.name}{hint}")  # fmt: skip
        if section[pair].model != experiment.model:
            raise LabConfigError(
                f"experiment {exp_id!r} in {path.name}: its pair {pair!r} trains the {section[pair].model} model, "
                f"not the {experiment.model}: a pair compares one change on one model"
            )


def pair_group(exp_id: str) -> tuple[str, ...]:
    """The experiments ``decision.decide`` decides together: all linked by ``pair``, through others too."""
    section = load_experiments(get_experiment(exp_id).section)
    group = linked(exp_id, [(e, x.pair) for e, x in section.items() if x.pair])
    return tuple(e for e in section if e in group)


def linked(start: str, links: list[tuple[str, str]]) -> set[str]:
    group = {start}
    while not (more := {a for a, b in links if b in group} | {b for a, b in links if a in group}) <= group:
        group |= more
    return group


def get_experiment(exp_id: str) -> Experiment:
    if not isinstance(exp_id, str):  # difflib's TypeError from inside did_you_mean, for a notebook's None or 5
        raise LabConfigError(f"experiment: expected an experiment's name (text), e.g. 'grad-accum'; got {exp_id!r}")
    experiments = load_experiments()
    if exp_id not in experiments:
        raise LabConfigError(f"unknown experiment {exp_id!r}{did_you_mean(exp_id, experiments)}")
    return experiments[exp_id]


def check_profile(profile: str) -> dict[str, Any]:
    profiles = load_profiles()
    if not isinstance(profile, str):  # a dict would be "unhashable type" from the lookup below
        raise LabConfigError(
            f"profile: expected a profile's name (text), one of {', '.join(profiles)}; got {shown(repr(profile))}"
        )
    if profile not in profiles:
        raise LabConfigError(f"unknown profile {profile!r}: choose one of {', '.join(profiles)}")
    return profiles[profile]


def _read_yaml(path: Path) -> Any:
    """Parsed once per content (keyed by a digest: inode, size and mtime miss a file rewritten in place) and copied
    per caller, so resolving takes ~2 ms instead of 10; every run reads all experiment files."""
    data = path.read_bytes()
    key = (str(path), hashlib.blake2b(data, digest_size=16).digest())
    with _PARSED_LOCK:
        parsed = _PARSED.pop(key, _MISSING)
    if parsed is _MISSING:
        parsed = load_yaml(data.decode(), what=str(path))
    with _PARSED_LOCK:  # the newest last; the oldest go beyond 128 files' versions
        _PARSED[key] = parsed
        while len(_PARSED) > 128:
            _PARSED.pop(next(iter(_PARSED)))
    return _copied(parsed)


_PARSED: dict[tuple[str, bytes], Any] = {}  # never handed out: _read_yaml copies what it holds
_PARSED_LOCK = threading.Lock()
_MISSING = object()


def _copied(value: Any) -> Any:
    """Under half ``copy.deepcopy``'s time: no memo is needed, as ``yaml_values`` refuses aliases."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


# ----------------------------------------------------------------------------------------------- overrides


def parse_set_args(pairs: list[str] | None) -> dict[str, Any]:
    """``["train.micro_batch_size=4"]`` -> a dict of YAML scalars. A record stores only JSON, so a date stays the
    typed text and any other non-JSON value (``!!binary``, ``.nan``) is refused before anything starts."""
    overrides: dict[str, Any] = {}
    for pair in pairs or []:
        if not isinstance(pair, str):  # a notebook's overrides=[1, 2]: "'int' object has no attribute 'partition'"
            raise LabConfigError(
                f"--set {shown(repr(pair))}: expected KEY=VALUE text, e.g. 'train.micro_batch_size=4'"
            )
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise LabConfigError(f"--set '{shown(pair)}' is not key=value (e.g. --set train.micro_batch_size=4)")
        key = key.strip()
        overrides[key] = _read_set_value(key, raw) if raw.strip() else None
    return overrides


def _read_set_value(key: str, raw: str) -> Any:
    try:
        value = load_yaml(raw, what=f"--set {shown(key)}")
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or "not a YAML value").split())
        raise LabConfigError(
            f"--set {shown(f'{key}={raw}')}: cannot read the value ({problem}); expected a number, true/false, "
            "null, text, [a, list] or {a: mapping}, e.g. --set train.micro_batch_size=4"
        ) from None
    if isinstance(value, dt.date):  # YAML reads 2024-01-01 as a date; the student typed text (a folder name)
        return raw.strip()
    return _json_value(key, raw, value)


def _json_value(key: str, raw: str, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, float):
        raise LabConfigError(f"--set {shown(f'{key}={raw}')}: expected a finite number, e.g. --set {shown(key)}=1")
    if isinstance(value, dt.date):  # inside a list or mapping
        return value.isoformat()
    if isinstance(value, list):
        return [_json_value(key, raw, item) for item in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(key, raw, v) for k, v in value.items()}
    raise LabConfigError(
        f"--set {shown(f'{key}={raw}')}: expected a number, true/false, null, text, a list or a mapping "
        f"(got a {type(value).__name__}), e.g. --set {shown(key)}=some-text"
    )


def apply_overrides(recipe: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``recipe`` with dotted-key overrides applied; ``data.X`` means ``data.init_args.X`` as in litgpt."""
    out = copy.deepcopy(recipe)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if parts[0] in ("data", "optimizer") and len(parts) == 2 and parts[1] not in ("class_path", "init_args"):
            if parts[0] == "optimizer" and isinstance(out.get("optimizer"), str):
                out["optimizer"] = {"class_path": _optimizer_class_path(out["optimizer"]), "init_args": {}}
            parts = [parts[0], "init_args", parts[1]]
        node = out
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


def _optimizer_class_path(name: str) -> str:
    return name if "." in name else f"torch.optim.{name}"


# ----------------------------------------------------------------------------------------------- files


def model_block_size(checkpoint_dir: Path) -> int:
    from litgpt import Config

    return Config.from_file(checkpoint_dir / "model_config.yaml").block_size


def check_seq_length(recipe: Mapping[str, Any], checkpoint_dir: Path) -> None:
    max_len = (recipe.get("train") or {}).get("max_seq_length")
    if max_len is None:
        return
    block = model_block_size(checkpoint_dir)
    if max_len > block:
        raise LabConfigError(
            f"train.max_seq_length ({max_len}) exceeds the model's block size ({block}): "
            f"set train.max_seq_length to at most {block}"
        )


def resolve_path(value: str | Path) -> Path:
    """Recipe paths are relative to the lab's folder (the checkout), wherever the notebook runs from."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    if path.parts and path.parts[0] == "checkpoints":
        return checkpoints_dir().joinpath(*path.parts[1:])
    if path.parts and path.parts[0] == "data":
        return data_dir().joinpath(*path.parts[1:])
    return lab_home() / path


def runnable_recipe(recipe: Mapping[str, Any], *, out_dir: Path | None = None) -> dict[str, Any]:
    """Paths made absolute (``LAB_CHECKPOINTS``/``LAB_DATA`` may move the folders) and secret-named keys masked;
    only keys, since a path that merely looks like a token is what the run must use."""
    resolved = dict(recipe)
    resolved["checkpoint_dir"] = str(resolve_path(recipe["checkpoint_dir"]))
    if out_dir is not None:
        resolved["out_dir"] = str(out_dir)
    data = recipe.get("data")
    if isinstance(data, Mapping):
        init_args = dict(data.get("init_args") or {})
        if init_args.get("json_path"):
            init_args["json_path"] = str(resolve_path(init_args["json_path"]))
        if data.get("class_path") == "litgpt.data.Alpaca2k":  # where `prepare --profile gpu` put it
            init_args["download_dir"] = str(resolve_path(init_args.get("download_dir") or "data/alpaca2k"))
        resolved["data"] = {**data, "init_args": init_args}
    return mask_secret_keys(resolved)


def check_checkpoint(checkpoint_dir: Path, profile: str, model_key: str) -> None:
    if (checkpoint_dir / "model_config.yaml").is_file() and (checkpoint_dir / "lit_model.pth").is_file():
        return
    if profile == "ci":
        fix = "python -m lab_helpers prepare --profile ci"
    else:
        repo_id = (check_profile(profile).get("downloads") or {}).get(model_key, "<org>/<model>")
        fix = f"litgpt download {repo_id} --checkpoint_dir {checkpoints_dir()} (or: python -m lab_helpers prepare --profile gpu)"
    raise LabConfigError(f"no checkpoint at {checkpoint_dir}: run `{fix}`")


# ----------------------------------------------------------------------------------------------- resolving


def recipe_path_for(experiment: Experiment, profile: str) -> Path:
    models = check_profile(profile)["models"]
    if experiment.model not in models:
        raise LabConfigError(f"experiment {experiment.id!r}: model {experiment.model!r} is not in profile {profile!r}")
    return configs_dir() / profile / models[experiment.model] / f"{experiment.method}.yaml"


def count_devices(devices: int | str) -> int:
    """'all' means every GPU here, or 2 gloo processes on a CPU (enough to show what distribution does)."""
    if devices != "all":
        return int(devices)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def resolve(
    exp_id: str,
    profile: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    check_files: bool = True,
    simulate_world: int | None = None,
) -> ResolvedRun:
    """``simulate_world=N``: the run is rank 0 of a world of N, played alone on this machine's one device."""
    check_overrides(overrides)
    experiment = get_experiment(exp_id)
    check_simulated_world(experiment, simulate_world)
    check_batch_order(experiment)
    check_levers(experiment)
    check_profile(profile)
    recipe_path = recipe_path_for(experiment, profile)
    merged = {**experiment.set, **(experiment.set_by_profile.get(profile) or {}), **(overrides or {})}
    base_recipe = _read_yaml(recipe_path)
    recipe = apply_overrides(base_recipe, merged)
    devices = simulate_world or count_devices(experiment.devices)
    recipe = _batch_for_world(experiment, recipe, overrides or {}, devices)
    from lab_helpers.config.recipe_check import check_devices, check_recipe  # litgpt's signatures: only here

    check_recipe(
        recipe,
        litgpt_command_for(experiment.method),
        devices=devices,
        num_nodes=experiment.num_nodes,
        examples=base_recipe,
        litgpt_script=not experiment.distributed,
    )
    check_devices(recipe, experiment=exp_id, distributed=experiment.distributed, devices=devices,
                  num_nodes=experiment.num_nodes, given=merged, devices_as_written=experiment.devices)  # fmt: skip
    recipe = _generated_data_for_random_weights(recipe)
    run = ResolvedRun(experiment, profile, recipe_path, recipe, dict(overrides or {}), devices, simulate_world)
    if (
        check_files
    ):  # what this node cannot run at all is the decision's (lab_helpers.planning.decision.blocked), not here
        check_run_files(run)
    return run


def check_overrides(overrides: Any) -> None:
    if overrides is None:
        return
    if not isinstance(overrides, Mapping):
        raise LabConfigError(
            "overrides: expected a mapping ({'train.micro_batch_size': 4}) or a list of KEY=VALUE texts "
            f"(['train.micro_batch_size=4']); got {shown(_REPR.repr(overrides))}"
        )
    for key in overrides:
        if not isinstance(key, str) or not key.strip():
            raise LabConfigError(
                f"overrides: each key is a recipe key as text (e.g. 'train.micro_batch_size'); got {shown(repr(key))}"
            )


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother = 60, 60


def _batch_for_world(
    experiment: Experiment, recipe: dict[str, Any], overrides: Mapping[str, Any], devices: int
) -> dict[str, Any]:
    if not experiment.accumulation or "train.global_batch_size" in overrides:
        return recipe
    train = dict(recipe.get("train") or {})
    ranks = devices * experiment.num_nodes
    train["global_batch_size"] = int(train["micro_batch_size"]) * experiment.accumulation * ranks
    return {**recipe, "train": train}


def check_simulated_world(experiment: Experiment, world_size: int | None) -> None:
    if world_size is None:
        return
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise LabConfigError(f"--simulate-world must be a whole number of ranks >= 2, got {world_size!r}")
    if not experiment.distributed or experiment.strategy == "single":
        raise LabConfigError(f"{experiment.id!r} runs on one device: only multi-GPU experiments have ranks to simulate")
    if experiment.num_nodes > 1:
        raise LabConfigError(f"{experiment.id!r} spans nodes: simulated ranks play one node's GPUs, not a network")


def check_batch_order(experiment: Experiment) -> None:
    order = (experiment.options or {}).get("batch_order", "shuffle")
    if order not in BATCH_ORDERS:
        raise LabConfigError(
            f"experiment {experiment.id!r}: batch_order {order!r} is not one of {', '.join(BATCH_ORDERS)}"
        )
    if order != "shuffle" and experiment.distributed:
        raise LabConfigError(
            f"experiment {experiment.id!r}: batch_order {order!r} runs on one device (launcher litgpt-cli) only; "
            "the Lightning path deals one shuffle to its ranks in rounds and does not group samples by length"
        )


def check_levers(experiment: Experiment) -> None:
    options = experiment.options or {}
    if (problem := lever_problem(options)) is not None:
        raise LabConfigError(f"experiment {experiment.id!r}: {problem}")
    asked = [key for key in CHILD_LEVERS if options.get(key) is not None]
    if asked and experiment.distributed:
        raise LabConfigError(
            f"experiment {experiment.id!r}: {', '.join(asked)} runs on one device (launcher litgpt-cli) only; "
            "the litgpt child applies it, the Lightning path does not"
        )


def check_run_files(run: ResolvedRun) -> None:
    """Separate from resolving so the lab can first say what no download would fix (an offload run the node's RAM
    cannot hold) before asking for a 26 GB checkpoint."""
    recipe, profile = run.recipe, run.profile
    checkpoint_dir = resolve_path(recipe["checkpoint_dir"])
    check_checkpoint(checkpoint_dir, profile, run.experiment.model)
    check_seq_length(recipe, checkpoint_dir)
    data_args = (recipe.get("data") or {}).get("init_args") or {}
    if data_args.get("json_path") and not resolve_path(data_args["json_path"]).exists():
        raise LabConfigError(
            f"no data set at {resolve_path(data_args['json_path'])}: run `python -m lab_helpers prepare --profile {profile}`"
        )


GENERATED_ALPACA2K = "data/gpu/alpaca2k_like.json"  # `prepare --profile gpu --random-weights` writes it


def _generated_data_for_random_weights(recipe: dict[str, Any]) -> dict[str, Any]:
    """Random weights mean no hub access: generated Alpaca2k-like data keeps the lengths, which set time and memory."""
    data = recipe.get("data") or {}
    checkpoint = recipe.get("checkpoint_dir")
    if data.get("class_path") != "litgpt.data.Alpaca2k" or not checkpoint:
        return recipe
    if not (resolve_path(checkpoint) / "RANDOM_WEIGHTS").exists():
        return recipe
    init_args = {k: v for k, v in (data.get("init_args") or {}).items() if k != "download_dir"}
    return {
        **recipe,
        "data": {"class_path": "litgpt.data.JSON", "init_args": {**init_args, "json_path": GENERATED_ALPACA2K}},
    }


def bitsandbytes_use(method: str, recipe: Mapping[str, Any]) -> str | None:
    """What the run needs bitsandbytes for ("QLoRA", "8-bit AdamW"), or None: its kernels need CUDA."""
    if method == "qlora":
        return "QLoRA"
    optimizer = recipe.get("optimizer")
    path = optimizer.get("class_path", "") if isinstance(optimizer, Mapping) else str(optimizer or "")
    if path.startswith(("bitsandbytes.", "bnb.")):
        return "8-bit AdamW" if "8bit" in path else path.rsplit(".", 1)[-1]
    return None
