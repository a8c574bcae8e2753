"""The one check of a recipe before anything starts, each bad value one line with an example to copy. Keys and
types come from litgpt's own annotations, then its CLI parser and ``validate_args`` run, so the check follows litgpt.

The annotations are walked first because jsonargparse (4.41) accepts ``train=5`` and ``checkpoint_dir=''`` (each
fails later, in the run) and its messages run to ten lines. The lab's own rules come last: values litgpt accepts
but cannot train with (``epochs=0``) and the batch arithmetic litgpt checks late or as an assertion.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import math
import re
import reprlib
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab_helpers.config.config_error import LabConfigError, did_you_mean, setup_function
from lab_helpers.config.record_schema import PRECISIONS
from lab_helpers.config.yaml_values import shown

COMMANDS: tuple[str, ...] = ("finetune_full", "finetune_lora")


def recipe_command(recipe: Mapping[str, Any]) -> str:
    """The litgpt command a recipe file is for: ``finetune_lora`` when it sets any ``lora_*`` key."""
    return "finetune_lora" if any(str(key).startswith("lora_") for key in recipe) else "finetune_full"


def check_recipe(
    recipe: Mapping[str, Any],
    command: str,
    *,
    devices: int,
    num_nodes: int = 1,
    examples: Mapping[str, Any] | None = None,
    litgpt_script: bool = True,
) -> None:
    """``examples``: the recipe before overrides, whose values the messages offer. ``litgpt_script``: litgpt's
    finetune script runs it, so its ``validate_args`` applies; the lab's Lightning runs read the recipe themselves."""
    if command not in COMMANDS:
        raise LabConfigError(f"unknown litgpt command {command!r}: expected one of {', '.join(COMMANDS)}")
    _check_types(recipe, command, recipe if examples is None else examples)
    _check_keys(recipe, command)
    _check_ranges(recipe)
    _check_devices_value(recipe.get("devices", 1))
    _check_optimizer(recipe.get("optimizer"))
    _check_batch_and_precision(recipe, command, devices=devices, num_nodes=num_nodes)
    _parse_with_litgpt(recipe, command)
    if litgpt_script:
        _litgpt_validate_args(recipe, command)


# --------------------------------------------------------------------------------------------------- types


def _check_types(recipe: Mapping[str, Any], command: str, examples: Mapping[str, Any]) -> None:
    hints = typing.get_type_hints(setup_function(command))
    for key, value in recipe.items():
        if key in hints:
            _check_type(key, value, hints[key], _lookup(examples, key))


def _check_type(key: str, value: Any, annotation: Any, example: Any) -> None:
    if annotation is Any:
        return
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):  # train, eval, log
        if not isinstance(value, Mapping):
            _fail(key, value, f"a mapping of {key} settings", _dotted_example(key, annotation, example))
        hints = typing.get_type_hints(annotation)
        for sub, sub_value in value.items():
            if sub in hints:
                _check_type(f"{key}.{sub}", sub_value, hints[sub], _lookup(example, sub))
        return
    if _is_data_module(annotation):
        _check_data(key, value, example)
        return
    if not _matches(value, annotation):
        _fail(key, value, _describe(annotation), _example(key, annotation, example))


def _check_data(key: str, value: Any, example: Any) -> None:
    from litgpt.data import DataModule

    if value is None:
        return
    wanted = "a data module: class_path and init_args"
    if not isinstance(value, Mapping) or not isinstance(value.get("class_path"), str) or not value["class_path"]:
        _fail(key, value, wanted, f"{key}.class_path=litgpt.data.JSON")
    class_path = value["class_path"]
    cls = _import_class(class_path)
    if cls is None:
        _fail(f"{key}.class_path", class_path, "an importable litgpt data module", f"{key}.class_path=litgpt.data.JSON")
    if not (isinstance(cls, type) and issubclass(cls, DataModule)):
        _fail(f"{key}.class_path", class_path, "a litgpt data module class", f"{key}.class_path=litgpt.data.JSON")
    init_args = value.get("init_args")
    if init_args is None:
        return
    if not isinstance(init_args, Mapping):
        _fail(f"{key}.init_args", init_args, f"a mapping of {cls.__name__}'s settings", f"{key}.num_workers=0")
    hints = typing.get_type_hints(cls)
    for sub, sub_value in init_args.items():
        if sub in hints:
            _check_type(f"{key}.{sub}", sub_value, hints[sub], _lookup(_lookup(example, "init_args"), sub))


def _import_class(class_path: str) -> Any:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _is_data_module(annotation: Any) -> bool:
    from litgpt.data import DataModule

    return any(isinstance(arg, type) and issubclass(arg, DataModule) for arg in _union_args(annotation))


def _union_args(annotation: Any) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    if annotation is Path:
        return isinstance(value, str | Path) and str(value).strip() != ""
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        return isinstance(value, Mapping)
    if origin in (list, tuple) or annotation in (list, tuple):
        return isinstance(value, list | tuple)
    return True  # a class this walk cannot check: litgpt's parser does (_parse_with_litgpt)


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(arg) for arg in typing.get_args(annotation)]
        return " or ".join(dict.fromkeys(parts))
    if origin is typing.Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(annotation))
    return {
        type(None): "null",
        bool: "true or false",
        int: "a whole number",
        float: "a finite number",
        str: "text",
        Path: "a path",
        dict: "a mapping",
    }.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _example(key: str, annotation: Any, example: Any) -> str:
    if example is not None and not isinstance(example, Mapping | list) and _matches(example, annotation):
        return f"{key}={_yaml_scalar(example)}"
    for arg in _union_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return f"{key}={typing.get_args(arg)[0]}"
        sample = {bool: "true", int: "4", float: "0.5", str: "text", Path: "some/path", dict: "{a: 1}"}.get(arg)
        if sample is not None:
            return f"{key}={sample}"
    return f"{key}=..."


def _dotted_example(key: str, cls: type, example: Any) -> str:
    hints = typing.get_type_hints(cls)
    for sub, value in example.items() if isinstance(example, Mapping) else ():
        if sub in hints and value is not None and not isinstance(value, Mapping | list):
            return f"{key}.{sub}={_yaml_scalar(value)}"
    return f"{key}.{next(iter(hints))}=..."


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _lookup(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, Mapping) else None


def _fail(key: str, value: Any, expected: str, example: str) -> typing.NoReturn:
    raise LabConfigError(f"{key}: expected {expected}, e.g. --set {example}; got {_shown(value)}")


def _shown(value: Any) -> str:
    """Bounded: a value may hold 100,000 items (``yaml_values``' bound)."""
    return "null" if value is None else shown(_REPR.repr(value))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


# ---------------------------------------------------------------------------------------------------- keys


def _check_keys(recipe: Mapping[str, Any], command: str) -> None:
    from litgpt.args import EvalArgs, LogArgs, TrainArgs

    params = inspect.signature(setup_function(command)).parameters
    groups = {"train": TrainArgs, "eval": EvalArgs, "log": LogArgs}
    # every key as --set spells it, so that a suggestion is one to copy: 'train.micro_batch_size', and a
    # nested key given without its group ('micro_batch_size') finds it too
    dotted = [f"{group}.{f.name}" for group, cls in groups.items() for f in dataclasses.fields(cls)]
    for key, value in recipe.items():
        if key not in params:
            hint = did_you_mean(key, [*params, *dotted], tight=True) or did_you_mean(key, params)
            raise LabConfigError(f"unknown recipe key {key!r} for litgpt {command}{hint}")
        nested = groups.get(key)
        if nested is not None and isinstance(value, Mapping):
            names = [f"{key}.{f.name}" for f in dataclasses.fields(nested)]
            for sub in value:
                if f"{key}.{sub}" not in names:
                    raise LabConfigError(f"unknown recipe key '{key}.{sub}'{did_you_mean(f'{key}.{sub}', names)}")
    data = recipe.get("data")
    if isinstance(data, Mapping) and data.get("class_path"):
        names = [f"data.{f.name}" for f in dataclasses.fields(_import_class(data["class_path"])) if f.init]
        for sub in data.get("init_args") or {}:
            if f"data.{sub}" not in names:
                raise LabConfigError(
                    f"unknown recipe key 'data.{sub}' for {data['class_path']}{did_you_mean(f'data.{sub}', names)}"
                )


# -------------------------------------------------------------------------------------------------- ranges

# (dotted key, smallest allowed, strictly above the smallest?, None allowed?); train.max_steps and
# train.lr_warmup_steps are checked together in _check_batch_and_precision (max_steps > warmup >= 1)
_RANGES: tuple[tuple[str, float, bool, bool], ...] = (
    ("train.epochs", 1, False, True),
    ("train.max_tokens", 1, False, True),
    ("train.max_seq_length", 1, False, True),
    ("train.log_interval", 1, False, False),
    ("train.save_interval", 1, False, True),
    ("train.max_norm", 0, True, True),
    ("train.min_lr", 0, False, True),
    ("eval.interval", 1, False, True),
    ("eval.max_iters", 0, False, True),
    ("eval.max_new_tokens", 0, False, True),
    ("data.init_args.num_workers", 0, False, True),
    ("optimizer.init_args.lr", 0, True, True),
    ("optimizer.init_args.weight_decay", 0, False, True),
    ("lora_r", 1, False, True),
    ("lora_alpha", 0, True, True),
    ("num_nodes", 1, False, False),
)
_RANGE_EXAMPLES = {"optimizer.init_args.lr": "0.0002", "train.max_norm": "1.0", "lora_alpha": "16"}


def _check_ranges(recipe: Mapping[str, Any]) -> None:
    """Well-typed but impossible: ``train.epochs=0`` trains nothing and records ``ok``; a negative learning rate or
    ``num_workers=-1`` fails only after the model load."""
    for key, low, strict, nullable in _RANGES:
        present, value = _dotted(recipe, key)
        if not present or (value is None and nullable):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # not a number: the type walk or litgpt's parser says so
        if not (math.isfinite(value) and (value > low if strict else value >= low)):
            allowed = f"> {low}" if strict else f">= {low}"
            example = _RANGE_EXAMPLES.get(key, str(int(low) or 1))
            raise LabConfigError(f"{key} must be {allowed}; got {value!r} (e.g. --set {key}={example})")
    dropout = _dotted(recipe, "lora_dropout")[1]
    if isinstance(dropout, int | float) and not isinstance(dropout, bool) and not 0 <= dropout < 1:
        raise LabConfigError(f"lora_dropout must be in [0, 1); got {dropout!r} (e.g. --set lora_dropout=0.05)")


def _check_devices_value(devices: Any) -> None:
    """As litgpt's ``parse_devices`` takes them, which fails only after the process start."""
    if devices in (-1, "auto") or (isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1):
        return
    raise LabConfigError(
        f"devices must be a whole number >= 1 or auto (every GPU here); got {_shown(devices)} (e.g. --set devices=1)"
    )


def _litgpt_devices(devices: Any) -> int:
    if devices in (-1, "auto"):
        import torch

        return torch.cuda.device_count() or 1
    return int(devices)


def check_devices(
    recipe: Mapping[str, Any],
    *,
    experiment: str,
    distributed: bool,
    devices: int,
    num_nodes: int,
    given: Mapping[str, Any],
    devices_as_written: Any = None,
) -> None:
    """On more than one device litgpt's script shards the model with FSDP, which a CPU cannot run and the lab's
    one-device record and prediction do not follow. A multi-GPU experiment's launcher writes its own ``devices`` over
    the recipe's, so another ``--set devices`` (in ``given``) would be silently ignored."""
    if distributed:
        written = devices if devices_as_written is None else devices_as_written
        for key, own, as_written in (("devices", devices, written), ("num_nodes", num_nodes, num_nodes)):
            if key in given and given[key] not in (own, as_written):
                here = f"{as_written}: {own} here" if as_written != own else f"{own}"
                raise LabConfigError(
                    f"{key}={_shown(given[key])}: {experiment} runs on the experiment's own {key} ({here}; "
                    f"configs/experiments/), which its launcher writes over the recipe's; leave --set {key} out"
                )
        return
    asked, nodes = recipe.get("devices", 1), recipe.get("num_nodes", 1)
    per_node = _litgpt_devices(asked)
    ranks = per_node * nodes
    if ranks <= 1:
        return
    key, value = ("devices", asked) if per_node > 1 else ("num_nodes", nodes)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        why = "FSDP, which runs on GPUs only, and this machine has none"
    elif per_node > gpus:
        why = f"FSDP, and this node has {gpus} GPU{'s' * (gpus != 1)}"
    else:
        why = "FSDP, which the lab's record, prediction and batch arithmetic of this experiment do not follow"
    raise LabConfigError(
        f"{key}={_shown(value)}: {experiment} trains on one device (litgpt's finetune script); on {ranks} devices "
        f"litgpt would shard it with {why}: --set {key}=1 (the multi-GPU experiments, e.g. `run fsdp`, train on several)"
    )


def _check_optimizer(optimizer: Any) -> None:
    """litgpt's ``getattr(torch.optim, name)`` fails only after the model load. Other modules' optimizers
    (bitsandbytes', maybe not installed here) are not imported."""
    import torch.optim

    class_path = optimizer.get("class_path") if isinstance(optimizer, Mapping) else optimizer
    if not isinstance(class_path, str):
        return  # litgpt's parser says what is wrong with it
    module, _, name = class_path.rpartition(".")
    known = [n for n, c in vars(torch.optim).items()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer]
    if module in ("", "torch.optim") and name not in known:
        same = [n for n in known if n.lower() == name.lower()]  # adamw: AdamW, where difflib offers Adam
        hint = f" (did you mean {same[0]!r}?)" if same else did_you_mean(name, known)
        key = "optimizer.class_path" if isinstance(optimizer, Mapping) else "optimizer"
        raise LabConfigError(f"{key}: torch.optim has no optimizer {name!r}{hint}")


def _dotted(recipe: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = recipe
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


# --------------------------------------------------------------------------------------- batch, precision


def _check_batch_and_precision(recipe: Mapping[str, Any], command: str, *, devices: int, num_nodes: int) -> None:
    """What litgpt checks late or as an assertion, made early; an unset train key is litgpt's default, as in the run."""
    precision = recipe.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise LabConfigError(
            f"precision {precision!r} is not one of {', '.join(PRECISIONS)}, e.g. --set precision=bf16-true"
        )
    litgpt_train = inspect.signature(setup_function(command)).parameters["train"].default
    train = {**dataclasses.asdict(litgpt_train), **(recipe.get("train") or {})}
    micro, global_ = train.get("micro_batch_size"), train.get("global_batch_size")
    for name, value in (("micro_batch_size", micro), ("global_batch_size", global_)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LabConfigError(f"train.{name} must be a whole number >= 1; got {value!r}")
    if micro > global_:
        raise LabConfigError(
            f"train.micro_batch_size ({micro}) is larger than train.global_batch_size ({global_}): "
            f"lower the micro batch or raise the global batch to a multiple of {micro}"
        )
    max_steps, warmup = train.get("max_steps"), train.get("lr_warmup_steps")
    if not isinstance(warmup, int) or warmup < 1:  # litgpt's warmup divides by it
        raise LabConfigError(
            f"train.lr_warmup_steps must be a whole number >= 1 (litgpt divides by it); got {warmup!r}"
        )
    if max_steps is not None and max_steps <= warmup:
        raise LabConfigError(  # litgpt's cosine schedule divides by (max_steps - warmup) and crashes mid-run
            f"train.max_steps ({max_steps}) must be larger than train.lr_warmup_steps ({warmup}): "
            + _warmup_advice(max_steps, warmup)
        )
    ranks = devices * num_nodes
    if global_ % (micro * ranks):
        raise LabConfigError(
            f"train.global_batch_size ({global_}) is not divisible by micro_batch_size x devices "
            f"({micro} x {ranks} = {micro * ranks}): use a global batch that is a multiple of {micro * ranks}"
        )


def _warmup_advice(max_steps: int, warmup: int) -> str:
    raise_to = f"set train.max_steps={warmup + 1} or more"
    if max_steps >= 2:
        return f"{raise_to}, or set train.lr_warmup_steps={max_steps - 1}"
    return raise_to


# ------------------------------------------------------------------------------------------ litgpt's own


@functools.cache
def _litgpt_parser(command: str):
    """Cached: 25 ms to build."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(setup_function(command), as_positional=False)
    return parser


def _parse_with_litgpt(recipe: Mapping[str, Any], command: str) -> None:
    _parse_once(command, json.dumps(recipe, sort_keys=True, default=str))


@functools.lru_cache(maxsize=256)
def _parse_once(command: str, recipe_json: str) -> None:
    """Cached: 15 ms a parse, and a run resolves its recipe two or three times."""
    from jsonargparse import ArgumentError

    try:
        _litgpt_parser(command).parse_object(json.loads(recipe_json))
    except ArgumentError as err:
        raise LabConfigError(_parser_message(str(err))) from None


def _parser_message(text: str) -> str:
    """jsonargparse's nested report as one line: the key as ``--set`` spells it, the value, the innermost reasons."""
    keys = re.findall(r'Parser key "([^"]+)"', text)
    given = re.search(r"Given value: (.*)", text)
    reasons = [
        line.strip()[2:]
        for line in text.splitlines()
        if line.strip().startswith("- ")
        and not line.strip().startswith(("- Expected a <class 'NoneType'>", "- Problem with given", "- a "))
    ]
    if not keys:
        return "litgpt's parser refuses the recipe: " + " ".join(text.split())[:200]
    why = "; ".join(reasons) or " ".join(text.splitlines()[1:2]).strip()
    shown = given.group(1).strip() if given else "?"
    return f"{'.'.join(keys)}: litgpt's parser refuses {shown[:80]} ({why})"


def _litgpt_validate_args(recipe: Mapping[str, Any], command: str) -> None:
    module = sys.modules[setup_function(command).__module__]
    defaults = inspect.signature(module.setup).parameters
    train = dataclasses.replace(defaults["train"].default, **(recipe.get("train") or {}))
    evals = dataclasses.replace(defaults["eval"].default, **(recipe.get("eval") or {}))
    try:
        module.validate_args(train, evals)
    except ValueError as err:
        first = str(err).splitlines()[0].split(". This is set in")[0]
        verb = "doesn't " if " doesn't " in first else "requires "
        reason = first.split(" doesn't ", 1)[-1] if " doesn't " in first else first.split(" requires ", 1)[-1]
        raise LabConfigError(f"litgpt {command} rejects this recipe: it {verb}{reason}") from None
