"""What a prediction needs, and how to read it from a litgpt fine-tuning recipe.

``TrainingSpec`` does not depend on recipe files, so the Lightning-Trainer experiments (which have no litgpt recipe)
describe a run directly. ``spec_from_recipe`` reads a recipe without checking it: ``recipe_check.check_recipe``
does, wherever a recipe comes from a person.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.version import InvalidVersion, Version

from lab_helpers.config.config_error import LabConfigError
from lab_helpers.config.recipe_check import recipe_command
from lab_helpers.config.recipe_defaults import lora_settings
from lab_helpers.config.record_schema import PLANNED_PRECISIONS as PRECISIONS
from lab_helpers.config.yaml_values import load_yaml

from .errors import PlanError, UnknownModel

_DTYPE_BYTES = {"32": 4, "bf16": 2, "16": 2}


def precision_bytes(precision: str) -> int:
    """Bytes of the stored weights for a Lightning precision: mixed precision stores fp32 weights."""
    text = str(precision)
    if text.endswith("-mixed") or text.startswith("32"):
        return 4
    head = text.split("-")[0]
    if head not in _DTYPE_BYTES:
        raise ValueError(f"precision {precision!r}: expected 32-true, bf16-true, bf16-mixed, 16-true or 16-mixed")
    return _DTYPE_BYTES[head]


Method = Literal["full", "lora", "qlora"]
Strategy = Literal["single", "ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3"]

STRATEGIES: tuple[str, ...] = ("single", "ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3")
DEEPSPEED_STRATEGIES: tuple[str, ...] = ("deepspeed-zero2", "deepspeed-zero3")
# bitsandbytes' 8-bit AdamW (``bitsandbytes.optim.AdamW8bit`` / ``PagedAdamW8bit``): both moments in 8 bits.
EIGHT_BIT_OPTIMIZERS: tuple[str, ...] = ("AdamW8bit", "PagedAdamW8bit")
OPTIMIZERS: tuple[str, ...] = ("AdamW", "Adam", "SGD", "DeepSpeedCPUAdam", *EIGHT_BIT_OPTIMIZERS)
TORCH_OPTIMIZERS: tuple[str, ...] = ("AdamW", "Adam", "SGD")
STEP_IMPLEMENTATIONS: tuple[str, ...] = ("foreach", "for-loop", "fused")
"""``foreach``: one ``_foreach_*`` op over every parameter, so an update's temporary is the size of all parameters
(AdamW's ``exp_avg_sq.sqrt()``); ``for-loop``: temporaries the size of the largest parameter; ``fused``: one
in-place kernel per parameter group, no parameter-sized temporaries."""


def step_implementation(foreach: object, fused: object, device: str) -> str:
    """As ``torch.optim.adam.adam`` (and SGD) decides it: both None (litgpt's recipes) is torch's
    ``_default_to_fused_or_foreach``, foreach on CUDA tensors and the for-loop on a CPU."""
    if fused:
        return "fused"
    if foreach:
        return "foreach"
    if foreach is None and fused is None:
        return "foreach" if device == "cuda" else "for-loop"
    return "for-loop"


BNB_FIRST_DROPPING_MATMUL_INPUT = "0.43.2"
"""bitsandbytes PR #1270 ("fix QLoRA mem bug: delete useless buffered activation", first in 0.43.2): ``MatMul4Bit``
sets ``ctx.tensors = (None, B)`` where earlier releases set ``(A, B)``."""
LITGPT_FIRST_STABLE_EMBEDDING = "0.5.0"
"""litgpt PR #1770 (first in 0.5.0): ``finetune/lora.py`` swaps a trainable ``bnb.nn.StableEmbedding`` in for the
token embedding of a quantized model and keeps the old one referenced."""
OLDEST_MODELLED = {"bitsandbytes": "0.42.0", "litgpt": "0.4.0"}  # the finetune loop and MatMul4Bit as modelled


def _release(package: str, version: str) -> Version:
    try:
        release = Version(version)
    except InvalidVersion:
        raise PlanError(
            f"{package} version {version!r} is not a version number (e.g. {OLDEST_MODELLED[package]})"
        ) from None
    if release < Version(OLDEST_MODELLED[package]):
        raise PlanError(f"{package} {version} is older than the planner models ({OLDEST_MODELLED[package]} or later)")
    return release


@dataclass(frozen=True)
class Software:
    """Release differences that change a run's memory.

    * ``bnb_keeps_matmul_input``: bitsandbytes < 0.43.2 kept each 4-bit layer's input on its autograd node, which
      autograd never frees after the node's backward: every input lives through the next forward (litgpt keeps
      ``logits``).
    * ``qlora_stable_embedding``: litgpt >= 0.5.0 trains QLoRA with a trainable ``bnb.nn.StableEmbedding`` copy, its
      gradient and the old embedding all alive.
    """

    bnb_keeps_matmul_input: bool = False
    qlora_stable_embedding: bool = True

    @classmethod
    def of(cls, bitsandbytes_version: str | None, litgpt_version: str | None) -> Software:
        keeps = bitsandbytes_version is not None and _release("bitsandbytes", bitsandbytes_version) < Version(
            BNB_FIRST_DROPPING_MATMUL_INPUT
        )
        stable = litgpt_version is None or _release("litgpt", litgpt_version) >= Version(LITGPT_FIRST_STABLE_EMBEDDING)
        return cls(bnb_keeps_matmul_input=keeps, qlora_stable_embedding=stable)


@dataclass
class TrainingSpec:
    """``seq_len`` is the worst-case padded length: litgpt pads each batch to its longest sample. Defaults match litgpt
    0.5.13's finetune scripts."""

    model_config: Any  # litgpt.Config
    method: Method
    precision: str
    micro_batch_size: int
    seq_len: int
    optimizer: str = "AdamW"
    lora: dict = field(default_factory=dict)
    quantize: str | None = None
    devices: int = 1
    strategy: Strategy = "single"
    fsdp_wrap_blocks: bool = True
    offload_optimizer: bool = False
    activation_checkpointing: bool = False
    gpu_memory_gib: float | None = None
    # --- extras ---
    gradient_accumulation_iters: int = 1
    optimizer_kwargs: dict = field(default_factory=dict)
    # The releases the run uses, where they change what it holds (None: what the lab installs, pyproject's pins:
    # bitsandbytes >=0.45.2,<0.50 and litgpt 0.5.13). Set them only to predict a run made with older software,
    # e.g. a published table (``Software`` below says what differs).
    bitsandbytes_version: str | None = None
    litgpt_version: str | None = None
    # FSDP FULL_SHARD (ZeRO-3) frees each unit's gathered weights after its forward and gathers them again for
    # backward; SHARD_GRAD_OP (ZeRO-2; FSDP2's reshard_after_forward=False) keeps them until backward.
    fsdp_reshard_after_forward: bool = True
    # Which FSDP runs it: "fsdp1" (FSDPStrategy, flat parameters) or "fsdp2" (fully_shard, per-parameter DTensors);
    # None where unknown. Both gather the same units and keep the same shards: modelled alike, said in a note.
    fsdp_impl: str | None = None
    # FSDP1's no_sync keeps *unsharded* gradients while accumulating: Fabric's no_backward_sync (litgpt full.py)
    # calls it, and so does Lightning's Trainer under FSDPStrategy (``ParallelStrategy.block_backward_sync`` tests
    # the model against a runtime-checkable protocol that any module with a ``no_sync`` method satisfies).
    # FSDP2 (ModelParallelStrategy + fully_shard) has no no_sync there: it reduce-scatters every micro-batch.
    fsdp_unsharded_grad_accumulation: bool = True
    # Run one validation forward (no grad, unchunked loss) as litgpt does every eval.interval steps.
    include_validation: bool = True
    # Whether a validation happens once training has begun (eval.interval <= max_steps, or final_validation), with
    # optimizer states and the last logits alive. litgpt always runs a short sanity validation before the first
    # step; when that is the only one, it sees the parameters alone.
    validation_during_training: bool = True
    # DDP with gradient_as_bucket_view=True (the lab's DDPStrategy): gradients live in the reducer's buckets
    # for the whole run instead of beside a second, flat copy of them. False is torch's default.
    ddp_gradient_as_bucket_view: bool = True
    # Which training loop: litgpt's finetune scripts (Fabric: logits converted to fp32, the previous logits alive
    # during the next forward) or the lab's Lightning-Trainer module (loss inside training_step, bf16 logits).
    loop: Literal["litgpt", "lightning"] = "litgpt"
    # Where the step runs: "cuda" adds the CUDA context and cuBLAS workspaces; "cpu" (the ci profile) predicts the
    # live tensor bytes alone, the quantity the lab measures there as peak_tensor_gib.
    device: Literal["cuda", "cpu"] = "cuda"
    # litgpt's generate_example (a KV cache for batch 1) runs every eval.interval steps and when the epochs end, on
    # rank 0, and only when the prompt plus eval.max_new_tokens fit the training sequence length.
    generate_example: bool = False
    max_new_tokens: int = 100

    @property
    def optimizer_step(self) -> str | None:
        """None where the step is not a torch optimizer's (QLoRA's paged AdamW, 8-bit AdamW, DeepSpeed's)."""
        if (
            self.optimizer not in TORCH_OPTIMIZERS
            or self.method == "qlora"
            or self.strategy in DEEPSPEED_STRATEGIES
            or self.offload_optimizer
        ):
            return None
        kwargs = self.optimizer_kwargs
        return step_implementation(kwargs.get("foreach"), kwargs.get("fused"), self.device)

    @property
    def software(self) -> Software:
        return Software.of(self.bitsandbytes_version, self.litgpt_version)

    def validate(self) -> None:
        self.software  # noqa: B018 -- a version the planner cannot read or does not model raises here
        if self.device not in ("cuda", "cpu"):
            raise PlanError(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        if self.method not in ("full", "lora", "qlora"):
            raise PlanError(f"unknown method {self.method!r}: expected full, lora or qlora")
        if self.precision not in PRECISIONS:
            raise PlanError(f"precision {self.precision!r} is not supported; use one of {', '.join(PRECISIONS)}")
        if not isinstance(self.devices, int) or self.devices < 1:
            raise PlanError(f"devices must be a positive integer, got {self.devices!r}")
        if self.strategy not in STRATEGIES:
            raise PlanError(f"unknown strategy {self.strategy!r}: expected one of {', '.join(STRATEGIES)}")
        if self.strategy == "single" and self.devices != 1:
            raise PlanError(f"strategy 'single' runs on one device, but devices={self.devices}")
        if self.strategy != "single" and self.devices < 2:
            raise PlanError(f"strategy {self.strategy!r} needs at least 2 devices, but devices={self.devices}")
        if self.micro_batch_size < 1:
            raise PlanError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.seq_len < 2:
            raise PlanError(f"sequence length must be >= 2, got {self.seq_len}")
        if self.seq_len > self.model_config.block_size:
            raise PlanError(
                f"sequence length {self.seq_len} exceeds the model's block size {self.model_config.block_size}"
            )
        if self.gradient_accumulation_iters < 1:
            raise PlanError(f"gradient_accumulation_iters must be >= 1, got {self.gradient_accumulation_iters}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer {self.optimizer!r} is not modelled; use one of {', '.join(OPTIMIZERS)}")
        if self.offload_optimizer and self.strategy not in DEEPSPEED_STRATEGIES:
            raise PlanError("optimizer offload is modelled for --strategy deepspeed-zero2 / deepspeed-zero3 only")
        if self.optimizer == "DeepSpeedCPUAdam" and not self.offload_optimizer:
            raise PlanError(
                "DeepSpeedCPUAdam steps on the CPU: it needs --strategy deepspeed-zero3 --offload-optimizer"
            )
        if self.optimizer_kwargs.get("fused") and self.optimizer_kwargs.get("foreach"):
            raise PlanError(  # torch.optim refuses it when the run builds the optimizer
                "optimizer.init_args: fused and foreach cannot both be true (torch refuses it); "
                "set one, e.g. --set optimizer.foreach=false"
            )
        if self.optimizer in EIGHT_BIT_OPTIMIZERS and self.strategy in DEEPSPEED_STRATEGIES:
            raise PlanError(f"{self.optimizer} is modelled on one GPU, DDP or FSDP, not under DeepSpeed")
        if self.fsdp_impl is not None and (self.fsdp_impl not in ("fsdp1", "fsdp2") or self.strategy != "fsdp"):
            raise PlanError(f"fsdp_impl {self.fsdp_impl!r}: fsdp1 or fsdp2, with --strategy fsdp")
        if not self.fsdp_reshard_after_forward and self.strategy != "fsdp":
            raise PlanError("reshard_after_forward=False (SHARD_GRAD_OP) is an FSDP setting: use --strategy fsdp")
        if self.method == "qlora":
            if not (self.quantize or "").startswith(("bnb.nf4", "bnb.fp4")):
                raise PlanError(f"QLoRA needs quantize bnb.nf4 / bnb.nf4-dq, got {self.quantize!r}")
            if "mixed" in self.precision:
                raise PlanError("litgpt rejects quantization with mixed precision (use bf16-true)")
            if self.devices > 1:
                raise PlanError("litgpt does not support quantization on more than one device")
            if self.optimizer != "AdamW":
                raise PlanError("litgpt's QLoRA (bitsandbytes) supports only the AdamW optimizer")
        elif self.quantize:
            raise PlanError(f"quantize={self.quantize!r} only applies to LoRA recipes (QLoRA)")
        if self.loop not in ("litgpt", "lightning"):
            raise PlanError(f"unknown training loop {self.loop!r}: expected litgpt or lightning")
        if self.method != "full" and self.lora.get("lora_r", 1) < 1:
            raise PlanError(f"lora_r must be >= 1, got {self.lora.get('lora_r')}")


def _set_dotted(tree: dict, dotted: str, value: object) -> None:
    """``data.X`` and ``optimizer.X`` mean their ``init_args.X``, as ``--set`` has them, so that
    ``overrides={"optimizer.foreach": False}`` reaches the optimizer here too."""
    node = tree
    parts = dotted.split(".")
    if parts[0] in ("data", "optimizer") and len(parts) == 2 and parts[1] not in ("class_path", "init_args"):
        if parts[0] == "optimizer" and isinstance(tree.get("optimizer"), str):
            name = tree["optimizer"]
            tree["optimizer"] = {"class_path": name if "." in name else f"torch.optim.{name}", "init_args": {}}
        parts = [parts[0], "init_args", parts[1]]
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise PlanError(f"cannot set {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def load_recipe(recipe: dict | str | Path) -> dict:
    if isinstance(recipe, dict):
        return yaml.safe_load(yaml.safe_dump(recipe))  # deep copy of plain data
    path = Path(recipe)
    if not path.is_file():
        raise PlanError(f"recipe file not found: {path}")
    try:
        data = load_yaml(path.read_text(), what=f"recipe {path}")  # bounded: no aliases, depth, size (yaml_values)
    except yaml.YAMLError as err:
        raise PlanError(f"recipe {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    except LabConfigError as err:
        raise PlanError(str(err)) from None
    if not isinstance(data, dict):
        raise PlanError(f"recipe {path} must be a YAML mapping")
    return data


def resolve_model_config(checkpoint_dir: str | Path, lora: dict | None = None):
    """A ``model_config.yaml`` in the directory wins (litgpt reads it); else the directory's name must be one of
    litgpt's config names (``checkpoints/meta-llama/Llama-3.2-1B`` -> ``Llama-3.2-1B``)."""
    from litgpt import Config

    kwargs = dict(lora or {})
    path = Path(checkpoint_dir)
    config_file = path / "model_config.yaml"
    if config_file.is_file():
        cls = Config
        if kwargs:
            from litgpt.lora import Config as LoRAConfig

            cls = LoRAConfig
        try:
            return cls.from_file(config_file, **kwargs)
        except Exception as err:  # noqa: BLE001 - any failure here is bad input
            raise PlanError(f"cannot read {config_file}: {err}") from None
    name = path.name
    if not name:
        raise PlanError("recipe has no checkpoint_dir to name the model")
    try:
        if kwargs:
            from litgpt.lora import Config as LoRAConfig

            return LoRAConfig.from_name(name, **kwargs)
        return Config.from_name(name)
    except ValueError:
        raise UnknownModel(
            f"unknown model {name!r}: not a litgpt config name and no model_config.yaml in {path}"
        ) from None


def _optimizer_from_recipe(value: object) -> tuple[str, dict]:
    if value is None:
        return "AdamW", {}
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1], {}
    if isinstance(value, dict) and "class_path" in value:
        return str(value["class_path"]).rsplit(".", 1)[-1], dict(value.get("init_args") or {})
    raise PlanError(f"optimizer must be a name or a class_path/init_args mapping, got {value!r}")


def _int(value: object, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PlanError(f"{what} must be an integer, got {value!r}") from None


def _generates_example(train_cfg: dict, eval_cfg: dict, seq_len: int) -> bool:
    """litgpt's fit calls ``generate_example`` every ``eval.interval`` optimizer steps and when the epochs run out;
    it skips the generation when the prompt plus ``eval.max_new_tokens`` do not fit ``model.max_seq_length``."""
    max_new = int(eval_cfg.get("max_new_tokens", 100) or 100)
    if seq_len <= max_new + 1:
        return False
    max_steps = train_cfg.get("max_steps")
    return max_steps is None or int(eval_cfg.get("interval", 600) or 600) <= int(max_steps)


def _validates_during_training(train_cfg: dict, eval_cfg: dict) -> bool:
    """litgpt validates every ``eval.interval`` optimizer steps and, with ``final_validation``, after training."""
    if eval_cfg.get("final_validation", True):
        return True
    max_steps = train_cfg.get("max_steps")
    return max_steps is None or int(eval_cfg.get("interval", 600) or 600) <= int(max_steps)


def spec_from_recipe(
    recipe: dict | str | Path,
    *,
    overrides: dict[str, object] | None = None,
    devices: int | None = 1,
    strategy: str | None = "single",
    offload_optimizer: bool = False,
    gpu_memory_gib: float | None = None,
    data_max_len: int | None = None,
    fsdp_wrap_blocks: bool = True,
    activation_checkpointing: bool | None = None,
    device: str = "cuda",
    fsdp_reshard_after_forward: bool = True,
    fsdp_impl: str | None = None,
    ddp_gradient_as_bucket_view: bool = True,
) -> TrainingSpec:
    """``devices=None`` / ``strategy=None`` take the recipe's devices and litgpt's own choice: on several devices
    ``finetune_full`` runs FSDP with every Block wrapped and checkpointed, gradients unsharded while accumulating. An
    explicit strategy means the lab's Lightning-Trainer module: no checkpointing unless asked; FSDP1 accumulates
    unsharded (under ``no_sync``), FSDP2 sharded. ``device="cpu"`` predicts live tensor bytes (no CUDA context, no
    cuBLAS workspace), what a CPU run measures as ``peak_tensor_gib``."""
    from litgpt.args import TrainArgs

    tree = load_recipe(recipe)
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)

    has_lora = recipe_command(tree) == "finetune_lora"
    quantize = tree.get("quantize")
    if quantize is not None and not has_lora:
        raise PlanError("'quantize' is accepted by litgpt finetune_lora only; this recipe has no LoRA keys")
    if "checkpoint_dir" not in tree or not tree["checkpoint_dir"]:
        raise PlanError("recipe has no checkpoint_dir (it names the model)")
    train_cfg = tree.get("train") or {}
    if not isinstance(train_cfg, dict):
        raise PlanError("recipe 'train' must be a mapping")
    micro = _int(train_cfg.get("micro_batch_size", 1) or 1, "train.micro_batch_size")
    global_bs = _int(train_cfg.get("global_batch_size", 16) or 16, "train.global_batch_size")

    if devices is None:
        raw = tree.get("devices", 1)
        if raw in (-1, "auto"):
            raise PlanError("recipe says devices: auto; pass --devices N so the plan knows how many GPUs")
        devices = _int(raw, "devices")
    devices = _int(devices, "devices")
    if devices < 1:
        raise PlanError(f"--devices must be at least 1, got {devices}")
    num_nodes = _int(tree.get("num_nodes", 1) or 1, "num_nodes")
    litgpt_loop = strategy is None or strategy == "single"
    if strategy is None:
        strategy = "single" if devices * num_nodes == 1 else "fsdp"
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    # litgpt's own arithmetic (the run's, whichever script trains): the lab never restates it
    batch = TrainArgs(micro_batch_size=micro, global_batch_size=global_bs)
    accumulation = batch.gradient_accumulation_iters(devices, num_nodes)

    lora: dict = {}
    if has_lora:
        lora = lora_settings(tree)
        lora["lora_r"] = _int(lora["lora_r"], "lora_r")
    model_config = resolve_model_config(tree["checkpoint_dir"], lora if has_lora else None)

    seq_len = _seq_len(train_cfg, model_config, data_max_len)

    precision = tree.get("precision") or "bf16-mixed"  # litgpt's default on a bf16-capable GPU
    method = _method(has_lora, quantize)
    optimizer, optimizer_kwargs = _optimizer_from_recipe(tree.get("optimizer"))
    if offload_optimizer:
        optimizer = "DeepSpeedCPUAdam"

    spec = TrainingSpec(
        model_config=model_config,
        method=method,
        precision=str(precision),
        micro_batch_size=micro,
        seq_len=int(seq_len),
        optimizer=optimizer,
        lora=lora,
        quantize=quantize,
        devices=devices * num_nodes,
        strategy=strategy,  # type: ignore[arg-type]
        offload_optimizer=offload_optimizer,
        fsdp_wrap_blocks=fsdp_wrap_blocks,
        fsdp_reshard_after_forward=fsdp_reshard_after_forward,
        fsdp_impl=fsdp_impl,
        ddp_gradient_as_bucket_view=ddp_gradient_as_bucket_view,
        # litgpt finetune_full wraps each Block with FSDP *and* activation checkpointing on several devices.
        activation_checkpointing=(
            activation_checkpointing
            if activation_checkpointing is not None
            else (litgpt_loop and method == "full" and strategy == "fsdp")
        ),
        gpu_memory_gib=gpu_memory_gib,
        gradient_accumulation_iters=accumulation,
        optimizer_kwargs=optimizer_kwargs,
        fsdp_unsharded_grad_accumulation=litgpt_loop or (strategy == "fsdp" and fsdp_impl == "fsdp1"),
        include_validation=litgpt_loop,
        validation_during_training=_validates_during_training(train_cfg, tree.get("eval") or {}),
        loop="litgpt" if litgpt_loop else "lightning",
        device=device,  # type: ignore[arg-type]
        generate_example=litgpt_loop and _generates_example(train_cfg, tree.get("eval") or {}, int(seq_len)),
        max_new_tokens=int((tree.get("eval") or {}).get("max_new_tokens", 100) or 100),
    )
    spec.validate()
    return spec


def _seq_len(train_cfg: dict, model_config: Any, data_max_len: int | None) -> int:
    max_seq = train_cfg.get("max_seq_length")
    seq_len = (
        model_config.block_size
        if max_seq is None
        else min(_int(max_seq, "train.max_seq_length"), model_config.block_size)
    )
    if data_max_len is not None:
        seq_len = min(seq_len, int(data_max_len))
    return seq_len


def _method(has_lora: bool, quantize: Any) -> Method:
    method: Method = "full"
    if has_lora:
        method = "lora"
        if quantize is not None:
            if str(quantize).startswith(("bnb.nf4", "bnb.fp4")):
                method = "qlora"
            else:
                raise PlanError(f"quantize={quantize!r} is not modelled (supported: bnb.nf4, bnb.nf4-dq)")
    return method
