#!/usr/bin/env python3
"""Step 6 of issue 44's relayout: no function over 120 lines, by the smallest honest extractions.

Each extraction moves one clearly delimited block of a long function, unchanged, into a helper right below it
(``extractlib``: the block is found by its first line, checked against a digest of its text, and its names are
checked: every local it reads is a parameter, every local it sets that the function reads later is returned).
Where main has edited inside a block since, the step stops and prints the block: look at it, and update the
block's digest (``--digest`` prints the current ones) or the extraction. Run at the root of a checkout
(``--check``: only report; ``--digest``: print each block's current digest).

- ``cli.build_parser``: the ``run`` command's arguments -> ``_add_run_command``.
- ``launch/runner.run_command``: the training process's environment -> ``_child_env``.
- ``planning/planner/spec.spec_from_recipe``: the sequence length and the method -> ``_seq_len``, ``_method``.
- ``planning/planner/timing.predict_time``: the device's peak, the FLOPs model's efficiency, communication, the
  offload's host step and transfers, the traced model's fields -> ``_peak_flops``, ``_efficiency``,
  ``_communication``, ``_offload_s``, ``_traced_fields``.
- ``planning/planner/tracer.trace_training``: the copy with fewer blocks, QLoRA's quantization, the marking of the
  optimizer's states and what the trace measured -> ``_with_layers``, ``_quantize_for_qlora``,
  ``_mark_optimizer_states``, ``_trace_result``.
- ``training/distributed/train.run``: the 60-line callback class defined inside it -> ``_watch_children_callback``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extractlib import Extract, Stop, apply, block_text, check_names, digest, find, function_lengths  # noqa: E402

LIMIT = 120
TIMING = "lab_helpers/planning/planner/timing.py"
TRACER = "lab_helpers/planning/planner/tracer.py"
SPEC = "lab_helpers/planning/planner/spec.py"

EXTRACTS = [
    Extract(
        "lab_helpers/cli.py",
        "build_parser",
        "run = sub.add_parser(",
        until="run_all = sub.add_parser(",
        helper="_add_run_command",
        params=["sub"],
        returns_type="None",
        doc="The ``run`` command: one experiment, its overrides, and how it runs (quick, simulated, limited, "
        "profiled).",
        digest="025cc0f343b8",
    ),
    Extract(
        "lab_helpers/launch/runner.py",
        "run_command",
        "child_env = {",
        count=1,
        helper="_child_env",
        params=["env: Mapping[str, str] | None", "report_dir: Path"],
        returns_type="dict[str, str]",
        returns=["child_env"],
        doc="The training process's environment: the launcher's and the run's, where the process reports, and whose "
        "it is (orphan_guard checks that its launcher is still there).",
        digest="e029b43c6b78",
    ),
    Extract(
        SPEC,
        "spec_from_recipe",
        'max_seq = train_cfg.get("max_seq_length")',
        until='precision = tree.get("precision")',
        helper="_seq_len",
        params=["train_cfg: dict", "model_config: Any", "data_max_len: int | None"],
        returns_type="int",
        returns=["seq_len"],
        doc="``train.max_seq_length`` capped by the model's block size and by the data's longest sample.",
        digest="42d9fbb7d2e9",
    ),
    Extract(
        SPEC,
        "spec_from_recipe",
        'method: Method = "full"',
        until="optimizer, optimizer_kwargs = _optimizer_from_recipe(",
        helper="_method",
        params=["has_lora: bool", "quantize: Any"],
        returns_type="Method",
        returns=["method"],
        doc="``full``, ``lora`` or ``qlora`` (LoRA with a 4-bit base), from the recipe's LoRA keys and ``quantize``.",
        digest="cc2b01b52e4c",
    ),
    Extract(
        TIMING,
        "predict_time",
        "if device == CPU:",
        count=1,
        helper="_peak_flops",
        params=["spec: TrainingSpec", "device: str", "cpu_rates: CpuRates | None"],
        returns_type="float",
        returns=["peak"],
        doc="The device's peak FLOP/s: a CPU's measured matmul rate, a GPU's dense peak at the spec's precision.",
        digest="27ef1669b1b1",
    ),
    Extract(
        TIMING,
        "predict_time",
        "if mfu is not None:",
        count=1,
        helper="_efficiency",
        params=[
            "spec: TrainingSpec",
            "device: str",
            "mfu: float | None",
            "records: list",
            "cpu_rates: CpuRates | None",
        ],  # fmt: skip
        returns_type="Efficiency",
        returns=["efficiency"],
        doc="The FLOPs model's MFU and overhead: the one given, else ``mfu_for`` (the records, else the table).",
        digest="532c14ce66da",
    ),
    Extract(
        TIMING,
        "predict_time",
        "volume = step_communication(spec)",
        count=3,
        helper="_communication",
        params=["spec: TrainingSpec", "link_gbs: float | None", "notes: list[str]"],
        returns_type="tuple[CommunicationVolume, float]",
        returns=["volume", "communication_s"],
        doc="The bytes each device sends per optimizer step and their time over the link (none without a link "
        "    bandwidth: a note says so).",
        digest="4b6b83867951",
    ),
    Extract(
        TIMING,
        "predict_time",
        "host_s = transfer_s = 0.0",
        count=2,
        helper="_offload_s",
        params=[
            "spec: TrainingSpec",
            "device: str",
            "cpu_rates: CpuRates | None",
            "accumulation: int",
            "host_link_gbs: float",
            "notes: list[str]",
        ],  # fmt: skip
        returns_type="tuple[float, float]",
        returns=["host_s", "transfer_s"],
        doc="Optimizer offload's host step (the host's Adam rate) and its host-device transfers; 0, 0 without it.",
        digest="18417736d7cd",
    ),
    Extract(
        TIMING,
        "predict_time",
        "split = {}",
        count=2,
        helper="_traced_fields",
        params=["traced: dict[str, Any] | None", "optimizer_s: float"],
        returns_type="dict[str, Any]",
        returns=["split"],
        doc="The traced model's own fields of the TimePlan (host and device per micro-batch, kernels, the fits).",
        digest="aa72beae27b6",
    ),
    Extract(
        TRACER,
        "trace_training",
        'if spec.method == "qlora":',
        count=1,
        helper="_quantize_for_qlora",
        params=["spec: TrainingSpec", "model: torch.nn.Module", "pdtype: torch.dtype", "keep_alive: list"],
        returns_type="None",
        doc="QLoRA as litgpt's lora.py does it: 4-bit base weights and, where bitsandbytes does, a stable embedding "
        "    (the old one stays referenced in ``keep_alive``).",
        digest="d6be4a195511",
    ),
    Extract(
        TRACER,
        "trace_training",
        "if n_layer is not None:",
        count=1,
        helper="_with_layers",
        params=["spec: TrainingSpec", "n_layer: int | None"],
        returns_type="TrainingSpec",
        returns=["spec"],
        doc="``spec`` with only ``n_layer`` blocks (a copy), or ``spec`` itself where None.",
        digest="ca1b3af49abd",
    ),
    Extract(
        TRACER,
        "trace_training",
        "for state in optimizer.state.values():",
        count=1,
        helper="_mark_optimizer_states",
        params=["acct: StorageAccountant", "optimizer: torch.optim.Optimizer"],
        returns_type="None",
        doc="The optimizer's states (every tensor of more than one element) marked as such.",
        digest="6d8ddaaac5e5",
    ),
    Extract(
        TRACER,
        "trace_training",
        "acct.summarize()",
        count=8,
        helper="_trace_result",
        params=[
            "spec: TrainingSpec",
            "acct: StorageAccountant",
            "model: torch.nn.Module",
            "params: list",
            "trainable: list",
            "optimizer: torch.optim.Optimizer",
            "keep_alive: list",
            "op_log: list",
            "started: float",
            "total_numel: int",
            "largest_weight: int",
            "largest_param: int",
        ],  # fmt: skip
        returns_type="TraceResult",
        returns=["result"],
        doc="What the trace measured: the phases and their storages, parameter and optimizer-state sizes, the "
        "timeline, the op costs of the steady window.",
        digest="9eb8d1a1dfe8",
    ),
    Extract(
        "lab_helpers/training/distributed/train.py",
        "run",
        "class WatchChildren(L.Callback):",
        count=1,
        helper="_watch_children_callback",
        params=["args: argparse.Namespace", "report"],
        returns_type="type",
        returns=["WatchChildren"],
        prelude=[
            "import lightning as L",
            "",
            "from lab_helpers.training import child_report",
            "from lab_helpers.training.distributed import peers",
        ],  # fmt: skip
        doc="The callback with which rank 0 watches the local ranks Lightning started (``peers``); every rank "
        "    keeps the lab's SIGTERM handling and reports a dead or interrupted peer.",
        digest="0830c0a9e59e",
    ),
]


def main(argv: list[str]) -> int:
    root = Path.cwd()
    if "--digest" in argv or "--check" in argv:
        ok = True
        for spec in EXTRACTS:
            text = (root / spec.path).read_text()
            try:
                function, block, _ = find(text, spec)
                now = digest(block_text(text, block))
                check_names(text, spec, function, block)
                state = "ok" if now == spec.digest else f"CHANGED (digest {now})"
            except Stop as exc:
                state, now = f"STOP: {exc}", "-"
            ok = ok and state == "ok"
            lines = "" if now == "-" else f", {len(block_text(text, block).splitlines())} lines"
            print(f"  {spec.path}: {spec.function}() -> {spec.helper}(){lines}: {state}")
        return 0 if ok or "--digest" in argv else 1
    for spec in EXTRACTS:  # every block checked before any file changes
        text = (root / spec.path).read_text()
        function, block, _ = find(text, spec)
        if (now := digest(block_text(text, block))) != spec.digest:
            raise Stop(f"{spec.path}: {spec.function}(): the block from {spec.first!r} changed on main (digest {now}, "
                       f"expected {spec.digest}); its text now:\n{block_text(text, block)}")  # fmt: skip
        check_names(text, spec, function, block)
    placed: dict[tuple[str, str], str] = {}
    for spec in EXTRACTS:
        apply(root, spec, placed)
    files = sorted({spec.path for spec in EXTRACTS})
    subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I,F401", "--fix", *files])
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", *files], capture_output=True, text=True)
    if found.returncode:
        raise Stop("ruff finds problems in what the step wrote:\n" + found.stdout[-3000:])
    long = []
    for path in sorted(root.glob("lab_helpers/**/*.py")):
        for name, n in function_lengths(path.read_text()).items():
            if n > LIMIT:
                long.append(f"{path.relative_to(root)} {name} {n}")
    for spec in EXTRACTS:
        n = function_lengths((root / spec.path).read_text())[spec.function]
        print(f"relayout: {spec.path}: {spec.function}() {n} lines, {spec.helper}() taken out")
    if long:
        raise Stop("functions still over 120 lines: " + "; ".join(long))
    big = [f"{p.relative_to(root)} ({n})" for p in sorted(root.glob("lab_helpers/**/*.py"))
           if (n := len(p.read_text().splitlines())) > 600]  # fmt: skip
    if big:
        raise Stop(f"modules over 600 lines once the helpers are in: {', '.join(big)} (split_large.py splits them)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
