"""``prepare``: a profile's checkpoints and data, before the first (paid-for) run. ci builds everything offline; gpu
downloads what is missing, or with ``random_weights`` builds the real architectures for a node without hub access.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lab_helpers.config.experiments import LabConfigError, check_profile
from lab_helpers.config.paths import checkpoints_dir, data_dir, lab_home

GPU_RANDOM_DATA = "gpu/alpaca2k_like.json"  # relative to data_dir(); experiments.GENERATED_ALPACA2K reads it


def prepare(
    profile: str,
    *,
    random_weights: bool = False,
    force: bool = False,
    models: Sequence[str] | None = None,
    progress: Callable = print,
) -> None:
    """``models`` (gpu profile): only these model keys (``1b``, ``3b``, ``7b``, ``13b``), e.g. to fit one model's
    random weights at a time on a small disk (all four are ~49 GB); default: every model of the profile."""
    check_profile(profile)
    if profile == "ci":
        from lab_helpers.assets import prepare_ci

        prepare_ci(force=force, progress=progress)
    elif random_weights:
        _prepare_gpu_random(force=force, progress=progress, models=models)
    else:
        _prepare_gpu_download(progress=progress, models=models)


def gpu_downloads(models: Sequence[str] | None) -> dict[str, str]:
    repo_ids = dict(check_profile("gpu")["downloads"])
    if not models:
        return repo_ids
    unknown = [key for key in models if key not in repo_ids]
    if unknown:
        raise LabConfigError(f"unknown model {', '.join(unknown)}: choose from {', '.join(repo_ids)} (e.g. --models 1b,3b)")
    return {key: repo_ids[key] for key in models}


def _prepare_gpu_random(*, force: bool, progress: Callable, models: Sequence[str] | None = None) -> None:
    from lab_helpers.assets import make_alpaca_json, prepare_random_weights

    repo_ids = gpu_downloads(models)
    config_names = [_config_name_for(repo_id) for repo_id in repo_ids.values()]
    progress(f"building random-weight checkpoints for {', '.join(config_names)} under {checkpoints_dir()}")
    prepare_random_weights(config_names, root=checkpoints_dir())
    path = make_alpaca_json(data_dir() / GPU_RANDOM_DATA, n_samples=2000, lengths="alpaca2k", force=force)
    progress(f"generated Alpaca2k-like data at {path}")


def _config_name_for(repo_id: str) -> str:
    """The litgpt config name whose hub repo is ``repo_id`` (e.g. open_llama_7b)."""
    from litgpt.config import configs

    org, name = repo_id.split("/", 1)
    for config in configs:
        hf = config.get("hf_config") or {}
        if hf.get("org") == org and hf.get("name") == name:
            return config["name"]
    raise ValueError(f"no litgpt config for {repo_id}")


def _prepare_gpu_download(*, progress: Callable, models: Sequence[str] | None = None) -> None:
    repo_ids = gpu_downloads(models)
    for key, repo_id in repo_ids.items():
        target = checkpoints_dir() / repo_id
        if downloaded(target):
            progress(f"{key}: {repo_id} already in {target}")
            continue
        if (target / "lit_model.pth").exists():
            progress(f"{key}: {target / 'lit_model.pth'} is cut off (an interrupted conversion): fetching it again")
        progress(f"{key}: downloading {repo_id} (resumable; re-run prepare if it stops)")
        # litgpt reads $HF_TOKEN itself: never put the token on a command line, where `ps` shows it
        command = [_litgpt_executable(), "download", repo_id, "--checkpoint_dir", str(checkpoints_dir())]
        subprocess.run(command, check=True, cwd=lab_home())
    progress("Alpaca2k: fetching the data set into data/alpaca2k")
    from litgpt.data import Alpaca2k

    Alpaca2k(download_dir=data_dir() / "alpaca2k").prepare_data()


def downloaded(target: Path) -> bool:
    """litgpt writes ``model_config.yaml`` before it converts; a conversion cut off leaves part of ``lit_model.pth``,
    a zip whose directory is at its end, so a file cut short is no zip file."""
    import zipfile

    weights = target / "lit_model.pth"
    return (target / "model_config.yaml").is_file() and weights.is_file() and zipfile.is_zipfile(weights)


def _litgpt_executable() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "litgpt")
    return beside if os.path.exists(beside) else (shutil.which("litgpt") or "litgpt")
