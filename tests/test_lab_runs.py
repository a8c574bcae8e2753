"""Real litgpt fine-tuning runs on tiny random-weight models through the runner: statuses, records, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import cli, sigint_as_in_a_terminal

from lab_helpers.lab import run_experiment
from lab_helpers.launch import warm_start
from lab_helpers.record.records import append_record, read_records

pytestmark = pytest.mark.slow
SHORT = {"train.max_steps": 2}
FAKE_TOKEN = "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1234"


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def grad_accum_cold_then_warm(ci_assets, tmp_path_factory) -> tuple[dict, dict, Path]:
    """One launcher's two runs of grad-accum, the first started cold and the second forked from its warm Python
    (warm_start), in one results folder, with a token in the environment and in the recipe: (cold, warm, folder).
    Shared by the tests below: each run costs seconds of CPU, and one pair answers both questions."""
    folder = tmp_path_factory.mktemp("cold-then-warm") / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAB_RESULTS", str(folder))
        patch.delenv("LAB_PROFILE", raising=False)
        patch.setenv("HF_TOKEN", FAKE_TOKEN)  # and in the recipe: neither may reach a stored log or record
        patch.delenv(warm_start.WARM_START_ENV, raising=False)
        patch.setattr(warm_start, "_starter", warm_start.WarmStarter())  # its own launcher: the first run is cold
        overrides = {**SHORT, "access_token": FAKE_TOKEN}
        try:
            [cold] = run_experiment("grad-accum", profile="ci", overrides=overrides, echo=False)
            [warm] = run_experiment("grad-accum", profile="ci", overrides=overrides, echo=False)
        finally:
            warm_start._starter.close()
    return cold, warm, folder


def test_a_run_records_every_field_the_cpu_provides_and_never_a_token(grad_accum_cold_then_warm):
    record, warm, results = grad_accum_cold_then_warm
    assert record["status"] == "ok" and record["rank"] is None
    assert record["experiment"] == "grad-accum" and record["profile"] == "ci"
    for gpu_field in ("peak_alloc_gib", "peak_reserved_gib", "gpu_used_peak_gib", "mfu"):
        assert record[gpu_field] is None  # a CPU has none: null, never 0
    assert record["train_s"] > 0 and record["wall_s"] > record["train_s"]
    assert record["tokens_padded"] >= record["tokens"] > 0
    assert record["tokens_per_s_padded"] >= record["tokens_per_s"] > 0
    assert record["host_rss_peak_gib"] > 0.05
    # 2 steps x 32/8 accumulation: the first step is warm-up, timed apart; train_s and tokens cover the second
    assert len(record["per_iteration"]) == 8 and record["warmup_iterations"] == 4 and record["iterations"] == 4
    assert record["warmup_s"] > 0 and record["mode"] == "full"
    # steady timing from the 4 timed iterations; on a CPU no GPU figures, each with its reason (time_bound)
    assert record["iter_count"] == 4 and record["iter_median_s"] > 0 and record["iter_iqr_s"] >= 0
    # each micro-batch's padded length, warm-up included, and the steady time apart from first-seen lengths
    assert len(record["seq_lens"]) == 8 and all(isinstance(n, int) and n > 0 for n in record["seq_lens"])
    assert max(record["seq_lens"]) <= record["config"]["train"]["max_seq_length"]
    assert record["first_seen_count"] + record["steady_iter_count"] == 4 and record["steady_basis"]
    assert record["gpu_busy_pct"] is None and record["gpu_busy_reason"].startswith("no GPU")
    assert record["bound"] is None and record["bound_reason"] and record["host_core_pct"] > 0
    assert record["torch_profile_steps"] is None  # profiling is never on by default
    assert record["device_name"].startswith("cpu (")  # named as the Lightning ranks name it (one report contract)
    # the CPU counterpart of max_memory_allocated, and the planner's prediction of the same quantity
    assert record["peak_tensor_gib"] == pytest.approx(record["predicted_peak_alloc_gib"], rel=0.10)
    # the whole process's peak (checkpoint load included) is recorded too, and predicted
    assert record["peak_tensor_whole_run_gib"] >= record["peak_tensor_gib"]
    assert record["peak_alloc_whole_run_gib"] is None  # no CUDA
    assert record["peak_tensor_whole_run_gib"] == pytest.approx(record["predicted_peak_alloc_whole_run_gib"], rel=0.10)
    assert record["predicted"]["breakdown_gib"]["cuda_context"] == 0.0
    assert record["config"]["train"]["micro_batch_size"] == 8
    assert record["environment"]["litgpt"] == "0.5.13"
    run_dir = results / "runs" / record["run_id"]
    assert (run_dir / "output.log").read_text().count("iter ") >= 4
    assert (results / record["timeline_path"]).read_text().startswith("t_s,gpu,util_pct")
    assert read_records(results / "runs.jsonl") == [record, warm]
    stored = [p for p in results.rglob("*") if p.is_file()]
    assert any(p.name == "recipe.yaml" for p in stored)
    for path in stored:
        assert FAKE_TOKEN not in path.read_text(errors="replace"), path


def test_a_warm_started_run_measures_what_a_cold_one_does(grad_accum_cold_then_warm):
    """A launcher's second run is forked from its warm Python (warm_start): the same measurements, the same
    training (same losses: same seed, same data order), seconds sooner."""
    cold, warm, _ = grad_accum_cold_then_warm
    assert (cold["process_start"], warm["process_start"]) == ("cold", "warm")
    assert cold["status"] == warm["status"] == "ok"
    same = ("peak_tensor_gib", "peak_tensor_whole_run_gib", "tokens", "tokens_padded", "iterations", "device_name")
    assert {k: warm[k] for k in same} == {k: cold[k] for k in same}
    assert [row["loss"] for row in warm["per_iteration"]] == [row["loss"] for row in cold["per_iteration"]]


def test_skipped_experiment_is_recorded_with_its_reason(results):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    [record] = run_experiment("qlora-7b", profile="ci", echo=False)
    assert record["status"] == "skipped" and "needs CUDA" in record["reason"]
    assert read_records(results / "runs.jsonl")[0]["status"] == "skipped"


def test_cuda_oom_in_the_child_is_recorded_as_oom_with_the_allocator_message(ci_assets, results, tmp_path, monkeypatch):
    """A CUDA OOM cannot happen on a CPU: this fixture makes the model's forward raise the allocator's real
    error type with a recorded message, inside the real training process."""
    message = (
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
        "1.25 GiB is free. Including non-PyTorch memory, this process has 77.84 GiB memory in use."
    )
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import torch, litgpt.model
            def forward(self, *args, **kwargs):
                raise torch.OutOfMemoryError({message!r})
            litgpt.model.GPT.forward = forward
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    earlier = {"run_id": "earlier", "experiment": "small-batch", "status": "ok", "rank": None}
    append_record(earlier)  # an earlier run's record ...
    [record] = run_experiment("baseline", profile="ci", overrides=SHORT, echo=False)
    assert record["status"] == "oom"
    assert message in record["error"] and "Tried to allocate 20.00 GiB" in record["reason"]
    assert record["returncode"] == 3
    assert read_records(results / "runs.jsonl") == [earlier, record]  # ... stays intact beside the new one
    assert not _processes_mentioning(record["run_id"])  # the child (and its GPU memory) is gone


def _start_cli_run(results: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        cli("run", "grad-accum", "--profile", "ci", "--set", "train.max_steps=10000", *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )


def _wait_for_training(results: Path, timeout_s: float = 60) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in results.glob("runs/*/output.log"):
            if "iter 2 " in log.read_text():
                return log.parent
        time.sleep(0.2)
    raise AssertionError("training did not start")


def test_ctrl_c_ends_the_whole_process_tree_and_records_interrupted(ci_assets, results):
    """Also, while it runs: a second run from another terminal or notebook is refused in one line naming this one,
    before it starts anything (lab_helpers.launch.run_lock: two runs at once would share the node's GPUs and
    cores, each record's time and memory the pair's); once this one has ended, the node is free again."""
    from lab_helpers.launch.run_lock import one_run_at_a_time

    proc = _start_cli_run(results, "--set", "train.epochs=1000")  # in flight until interrupted
    run_dir = _wait_for_training(results)
    assert _processes_mentioning(run_dir.name)  # the training process is running
    second = subprocess.run(cli("run", "small-batch", "--profile", "ci"), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    err = second.stderr.strip()
    assert err.startswith("error: another lab run is in progress on this node (grad-accum, pid ") and "\n" not in err
    assert f"in {results}" in err
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal or "interrupt kernel" in Jupyter sends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()[-2000:]
    [record] = read_records(results / "runs.jsonl")  # the refused run left no record and no run folder
    assert record["status"] == "interrupted" and record["run_id"] == run_dir.name
    assert [p.name for p in (results / "runs").iterdir()] == [run_dir.name]
    assert not _processes_mentioning(run_dir.name)  # no stray process survives
    with one_run_at_a_time("small-batch", results):  # let go of as the run ended
        pass
    # `results` shows the record (the CLI's `run` printing "EXP: ok" is checked by test_gpu_measure's run)
    as_json = subprocess.run(cli("results", "--format", "json"), capture_output=True, text=True, check=True).stdout
    assert '"experiment": "grad-accum"' in as_json and '"status": "interrupted"' in as_json
    as_csv = subprocess.run(cli("results", "--format", "csv"), capture_output=True, text=True, check=True).stdout
    assert as_csv.splitlines()[0].count(",") > 10 and "grad-accum" in as_csv


def test_killed_launcher_leaves_no_training_process_behind(ci_assets, results):
    """A kernel restart kills the launcher with SIGKILL: the training process notices and ends itself."""
    proc = _start_cli_run(results)
    run_dir = _wait_for_training(results)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while _processes_mentioning(run_dir.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_mentioning(run_dir.name)


def test_quick_mode_times_after_the_warm_up_step_puts_the_longest_batch_second_and_saves_no_lora(
    ci_assets, results, monkeypatch
):
    """A real LoRA run in quick mode: 16/4 = 4 micro-batches per step, up to the rule's cap of steps (18 of the 20
    asked for), 2 of warm-up (the second opened by the longest batch). The stopping rule ends litgpt's own loop at
    the first step end where it holds: told that halves within 1000 % agree (a loaded 2-core CPU cannot promise
    10 %; tests/test_quick_mode.py tests the rule itself), it stops at its minimum, 8 timed micro-batches."""
    from lab_helpers.training.quick_mode import RULE_MIN_ITERATIONS, STABLE_PCT_ENV, quick_max_steps

    monkeypatch.setenv(STABLE_PCT_ENV, "1000")
    [record] = run_experiment("lora-1b", profile="ci", overrides={"train.max_steps": 20}, echo=False, quick=True)
    assert record["status"] == "ok" and record["mode"] == "quick"
    assert record["config"]["train"]["max_steps"] == quick_max_steps(4, stopping_rule=True) == 18
    assert record["quick_stop"] == "stable" and record["quick_stop_halves_pct"] <= 1000
    assert record["warmup_iterations"] == 8 and record["iterations"] == RULE_MIN_ITERATIONS == 8
    assert len(record["per_iteration"]) == 16  # litgpt trained no batch after the rule stopped it
    assert record["warmup_s"] > 0 and record["train_s"] > 0
    steady = sum(row["iter_time_s"] for row in record["per_iteration"][8:])
    assert record["train_s"] == pytest.approx(steady, rel=0.5)  # the timed span is the 8 iterations after warm-up
    assert 0 < record["tokens"] <= record["tokens_padded"]
    assert record["peak_tensor_gib"] == pytest.approx(record["predicted_peak_alloc_gib"], rel=0.10)
    run_dir = results / "runs" / record["run_id"]
    log = (run_dir / "output.log").read_text()
    assert "longest samples" in log and "form micro-batch 5" in log
    assert "timing ends (stable) after 8 timed micro-batches" in log
    assert "not saving" in log and "merged model" in log
    weights = [p for p in run_dir.rglob("*") if p.suffix in (".pth", ".lora", ".bin", ".safetensors")]
    assert weights == []  # no adapter file, no merged copy of the model


def test_the_oom_demonstrations_batch_is_raised_only_where_the_course_batch_would_fit(
    ci_assets, results, monkeypatch
):
    """A GPU's size cannot be had on a CPU, so the lab is told one. Where the baseline's course batch is predicted
    only 10 % over the GPU it runs as defined (the margin never decides whether); where it would fit with 10 %
    to spare, the batch is raised until the prediction is at least 20 % over."""
    from lab_helpers import lab
    from lab_helpers.hardware import node
    from lab_helpers.planning import predict

    plan = lab.predict_experiment("baseline", profile="ci", gpu_memory_gib=100.0)
    monkeypatch.setattr(node, "this_gpu_memory_gib", lambda: plan.gpu_used_gib / 1.1)
    overrides, why = predict.oom_demo_overrides("baseline", profile="ci")
    assert overrides == {} and "runs as the course defines it" in why
    gpu_gib = plan.gpu_used_gib * 1.1
    monkeypatch.setattr(node, "this_gpu_memory_gib", lambda: gpu_gib)
    overrides, why = predict.oom_demo_overrides("baseline", profile="ci")
    assert overrides["train.micro_batch_size"] > 32 and "at least 20% over" in why
    raised = lab.predict_experiment("baseline", profile="ci", overrides=overrides, gpu_memory_gib=gpu_gib)
    assert raised.gpu_used_gib >= gpu_gib * (1 + lab.OOM_DEMO_MARGIN)
    # run_all takes these overrides from the one decision, as the notebooks do: tests/test_node_plan.py's
    # test_run_all_and_the_notebooks_make_the_same_decision_for_every_experiment checks it on the node fixtures
