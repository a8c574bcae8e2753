"""Play several nodes on one machine, rendezvous over loopback: the lab cannot reach a second node from the notebook,
and this runs the same command and code path as real nodes do (docs/multi_node.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_env(node_rank: int, *, port: int, gpus_per_node: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node_rank), "LAB_WATCH_PARENT": "1"}
    )
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):  # set per process by Lightning / torchrun, not here
        env.pop(key, None)
    if gpus_per_node:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus(node_rank, gpus_per_node, os.environ.get("CUDA_VISIBLE_DEVICES")))
    return env


def node_gpus(node_rank: int, gpus_per_node: int, visible: str | None) -> list[str]:
    """A slice of ``CUDA_VISIBLE_DEVICES``: given ``4,5,6,7``, node 1 of 2 gets ``6,7``, never someone else's ``2,3``."""
    first = node_rank * gpus_per_node
    if visible is None:
        return [str(i) for i in range(first, first + gpus_per_node)]
    entries = [part.strip() for part in visible.split(",") if part.strip()]
    if first + gpus_per_node > len(entries):
        raise ValueError(
            f"node {node_rank} needs GPUs {first}..{first + gpus_per_node - 1} of CUDA_VISIBLE_DEVICES={visible!r}, "
            f"which lists {len(entries)}"
        )
    return entries[first : first + gpus_per_node]


def torchrun_command(command: list[str], *, node_rank: int, nodes: int, port: int) -> list[str]:
    if len(command) < 3 or command[1] != "-m":
        raise ValueError("--launcher torchrun needs a `python -m module ...` command")
    devices = _flag(command, "--devices", "1")
    return [
        command[0], "-m", "torch.distributed.run",
        f"--nnodes={nodes}", f"--node_rank={node_rank}", f"--nproc_per_node={devices}",
        "--master_addr=127.0.0.1", f"--master_port={port}",
        "-m", *command[2:],
    ]  # fmt: skip


def _flag(command: list[str], name: str, default: str) -> str:
    return command[command.index(name) + 1] if name in command else default


def supervise(procs: list[subprocess.Popen], *, grace_s: float = GRACE_S) -> int:
    """After a failure the others get ``grace_s`` to write their reports: none may be left waiting in a collective."""
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return next((c for c in codes if c), 0)
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
            print("[lab] a node failed; stopping the others", flush=True)
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for proc in procs:
                if proc.poll() is None:
                    _kill_tree(proc)
        time.sleep(POLL_S)


def _kill_tree(proc: subprocess.Popen) -> None:
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        for child in parent.children(recursive=True):
            child.kill()
        parent.kill()
    except psutil.NoSuchProcess:
        pass


def main(argv: list[str] | None = None) -> int:
    from lab_helpers.training.orphan_guard import start_orphan_guard

    start_orphan_guard()  # first (before torch is imported): the runner died (kernel restart): end every node
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m lab_helpers.training.distributed.nodes --nodes N [--launcher lightning|torchrun] -- COMMAND"
        )
    split = argv.index("--")
    parser = argparse.ArgumentParser(description="one training command per node, on loopback")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--launcher", choices=("lightning", "torchrun"), default="lightning")
    parser.add_argument("--master-port", type=int, default=0, help="0: pick a free port")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    port = args.master_port or free_port()
    gpus_per_node = int(_flag(command, "--devices", "1")) if _has_cuda() else None
    if gpus_per_node and gpus_per_node * args.nodes > _gpu_count():
        raise SystemExit(
            f"[lab] playing {args.nodes} nodes x {gpus_per_node} GPUs on this machine needs "
            f"{gpus_per_node * args.nodes} GPUs; it has {_gpu_count()} (on real nodes, see docs/multi_node.md)"
        )

    procs: list[subprocess.Popen] = []

    def stop(signum, frame):  # noqa: ARG001 -- pass an interrupt on to every node, then let supervise reap
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for node_rank in range(args.nodes):
        cmd = command
        if args.launcher == "torchrun":
            cmd = torchrun_command(command, node_rank=node_rank, nodes=args.nodes, port=port)
        print(
            f"[lab] node {node_rank}/{args.nodes}: MASTER_ADDR=127.0.0.1 MASTER_PORT={port} NODE_RANK={node_rank}",
            flush=True,
        )
        procs.append(subprocess.Popen(cmd, env=node_env(node_rank, port=port, gpus_per_node=gpus_per_node)))
    return supervise(procs)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    sys.exit(main())
