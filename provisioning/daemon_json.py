#!/usr/bin/env python3
"""Check and merge Docker's daemon.json for provision-node.sh.

Usage:
    daemon_json.py has-nvidia-runtime FILE   exit 0 if the "nvidia" runtime is configured, else 1
    daemon_json.py has-cgroupfs FILE         exit 0 if Docker is told to use the cgroupfs driver, else 1
    daemon_json.py set-cgroupfs FILE         add "native.cgroupdriver=cgroupfs" to exec-opts, keep everything else

Why cgroupfs: with the systemd cgroup driver, a `systemctl daemon-reload` on the host (which package upgrades do)
can make running GPU containers fail with "Failed to initialize NVML: Unknown Error". NVIDIA's documented Docker
workaround is `"exec-opts": ["native.cgroupdriver=cgroupfs"]` in daemon.json.

Only the standard library, because it runs on a bare Ubuntu node. Exit code 2 means the file could not be read as
JSON: we never overwrite a file we could not parse.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

CGROUPFS = "native.cgroupdriver=cgroupfs"
_DRIVER_PREFIX = "native.cgroupdriver="


class DaemonJsonError(Exception):
    """daemon.json exists but is not a JSON object."""


def load(path: Path) -> dict:
    """The file's settings; a missing or empty file is an empty configuration."""
    if not path.exists() or not path.read_text().strip():
        return {}
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DaemonJsonError(f"{path} is not valid JSON ({exc}); fix or move it, then run again") from exc
    if not isinstance(config, dict):
        raise DaemonJsonError(f"{path} should hold a JSON object; fix or move it, then run again")
    return config


def has_nvidia_runtime(config: dict) -> bool:
    return "nvidia" in (config.get("runtimes") or {})


def has_cgroupfs(config: dict) -> bool:
    """True when cgroupfs is the one cgroup driver named (a second, conflicting one would also count as wrong)."""
    drivers = [opt for opt in config.get("exec-opts") or [] if opt.startswith(_DRIVER_PREFIX)]
    return drivers == [CGROUPFS]


def with_cgroupfs(config: dict) -> dict:
    """A copy of config whose exec-opts name cgroupfs as the only cgroup driver; other options are kept."""
    merged = dict(config)
    others = [opt for opt in config.get("exec-opts") or [] if not opt.startswith(_DRIVER_PREFIX)]
    merged["exec-opts"] = [*others, CGROUPFS]
    return merged


def save(path: Path, config: dict) -> None:
    """Write atomically (a half-written daemon.json would stop Docker from starting)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".daemon.json.")
    with os.fdopen(fd, "w") as handle:
        json.dump(config, handle, indent=4)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in {"has-nvidia-runtime", "has-cgroupfs", "set-cgroupfs"}:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    action, path = argv[0], Path(argv[1])
    try:
        config = load(path)
    except DaemonJsonError as exc:
        print(f"daemon_json.py: error: {exc}", file=sys.stderr)
        return 2
    if action == "has-nvidia-runtime":
        return 0 if has_nvidia_runtime(config) else 1
    if action == "has-cgroupfs":
        return 0 if has_cgroupfs(config) else 1
    save(path, with_cgroupfs(config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
