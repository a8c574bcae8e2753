"""``python -m lab_helpers doctor``: what this node has and which lab sections it can run, before a lease burns.

A student who finds out after an hour that the node has one V100 and no bitsandbytes has lost money and the hour.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from lab_helpers.hardware.node import CheckedNodeFacts, describe_node
from lab_helpers.planning.sections import sections_runnable

OK, NOT_OK = "✔", "✘"
CI_ONLY = "◐"  # runs on this machine, on the ci profile only (tiny stand-ins on the CPU)


def check_node() -> CheckedNodeFacts:
    """What needs torch imported and nvcc found: the records skip it (seconds per run); the doctor, asked once, can."""
    from lab_helpers.hardware.cuda_compat import deepspeed_build_problem, nvcc_version, torch_facts

    node: CheckedNodeFacts = {**describe_node(), **torch_facts()}
    if node.get("gpus"):
        node["nvcc"], node["nvcc_release"] = nvcc_version()
        node["deepspeed_build_problem"] = deepspeed_build_problem(node.get("torch_cuda"), node["nvcc_release"])
    return node


def format_report(node: dict[str, Any]) -> str:
    """A readable report: environment, a table of GPUs, then each lab section with ✔/✘ and what to do."""
    packages = node.get("packages") or {}
    host = node.get("host") or {}
    lines = [f"Lab node check: {node.get('hostname') or '?'}", ""]
    problem = sections_runnable(node)["single"][1] if node.get("gpus") else None
    if problem and not sections_runnable(node)["single"][0]:
        lines += [f"{NOT_OK} PROBLEM: {problem}", ""]

    lines.append("Software")
    lines.append(f"  python {node.get('python') or '?'}")
    for name, version in packages.items():
        lines.append(f"  {name:<13} {version or 'not installed'}")
    lines.append(f"  NVIDIA driver {_or_dash(node.get('driver_version'))}")
    lines.append(
        f"  CUDA          driver supports {_or_dash(node.get('cuda_driver_version'))}, "
        f"torch built with {_or_dash(node.get('torch_cuda'))}"
        + ("" if "torch_cuda_available" not in node else f", torch sees CUDA: {node['torch_cuda_available']}")
    )
    if node.get("gpus"):
        lines.append(f"  nvcc          {_or_dash(node.get('nvcc_release'))} ({node.get('nvcc') or 'not found'})")
    lines.append("")

    lines.append("Host")
    lines.append(
        f"  RAM {_gib(host.get('ram_total_gib'))} total, {_gib(host.get('ram_available_gib'))} available; "
        f"{host.get('cpu_count') or '?'} CPUs; {_gib(node.get('disk_free_gib'))} free disk at {node.get('lab_home')}"
    )
    lines.append("")

    gpus = node.get("gpus") or []
    lines.append(f"GPUs ({len(gpus)})")
    if gpus:
        lines.extend("  " + row for row in _gpu_table(gpus))
        lines.append(f"  interconnect: {node.get('interconnect') or 'unknown'}")
        if node.get("topology"):
            lines.append("  nvidia-smi topo -m:")
            lines.extend("    " + row for row in str(node["topology"]).splitlines())
    else:
        why = node.get("nvml_error")
        lines.append("  none found" + (f" ({why})" if why else ""))
        lines.append("  no GPU: use LAB_PROFILE=ci (every experiment runs small on the CPU), or load the reference")
        lines.append("  results shipped with the lab (lab_helpers.present.tables.load_reference()) to compare real GPU runs")
    lines.append("")

    lines.extend(_launch_cost_lines(gpus))
    lines.append("")

    lines.append("Lab sections on this node")
    on_ci, skipped = [], []
    for section, (ok, reason) in sections_runnable(node).items():
        mark = OK if ok else ("i" if section == "multi-node" else NOT_OK)
        if not gpus and not ok and "ci profile" in reason:  # runs, small, on the CPU: not a failure
            mark = CI_ONLY
            on_ci.append(section)
        elif mark == NOT_OK:
            skipped.append(section)
        lines.append(f"  {mark} {section:<18} {reason}")
    if not gpus:
        lines.append("")
        lines.append(
            f"Verdict: no GPU, so the ci profile ({CI_ONLY} above): {', '.join(on_ci)} run on tiny random-weight "
            "stand-ins on the CPU, in minutes: the code path and the planner's CPU predictions, never GPU figures"
            + (f"; {', '.join(skipped)} recorded skipped (needs CUDA)." if skipped else ".")
        )
    return "\n".join(lines)


def _launch_cost_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """What bounds a host-bound run, which the lab's GPU records all are."""
    from lab_helpers.planning.launch_cost import NOT_MEASURED, measured_launch_cost

    device = gpus[0].get("name") if gpus else "cpu"
    cost, source = measured_launch_cost(device)
    if cost is None:
        return ["Host cost per kernel launch", f"  {device}: {NOT_MEASURED}"]
    return ["Host cost per kernel launch", f"  {device}: {cost * 1e6:.1f} us, {source}"]


def _gpu_table(gpus: list[dict[str, Any]]) -> list[str]:
    header = ("#", "name", "memory", "capability", "bf16", "NVLink links")
    rows = [
        (
            str(gpu.get("index")),
            str(gpu.get("name")),
            _gib(gpu.get("memory_total_gib")),
            _or_dash(gpu.get("compute_capability")),
            {True: "native", False: "no"}.get(gpu.get("bf16_native"), "-"),
            _or_dash(gpu.get("nvlink_links_active")),
        )
        for gpu in gpus
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _gib(value: Any) -> str:
    return f"{value:.1f} GiB" if isinstance(value, (int, float)) else "?"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


# ------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw facts as JSON instead of the report")


def run(args: argparse.Namespace) -> int:
    """Print the report (or JSON). Returns 0: a node that cannot run a section is a finding, not a failure."""
    node = check_node()
    if getattr(args, "json", False):
        payload = {
            **node,
            "sections": {k: {"ok": ok, "reason": why} for k, (ok, why) in sections_runnable(node).items()},
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(format_report(node))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_helpers doctor", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
