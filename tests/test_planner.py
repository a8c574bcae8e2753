"""Planner invariants on tiny real litgpt models (fake tensors, so each prediction takes about a second)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest
import torch
from litgpt import Config
from litgpt.utils import save_config

from lab_helpers.config.record_schema import BREAKDOWN_PARTS
from lab_helpers.planning.planner import MemoryPlan, PlanError, TrainingSpec, plan_recipe, predict, spec_from_recipe
from lab_helpers.planning.planner.tracer import trace, trace_training
from lab_helpers.present import plan_command as planner_cli

LORA_ALL = dict(
    lora_r=8,
    lora_alpha=16,
    lora_dropout=0.05,
    lora_query=True,
    lora_key=True,
    lora_value=True,
    lora_projection=True,
    lora_mlp=True,
    lora_head=False,
)


def tiny_config(n_layer: int = 2, n_embd: int = 64, **kw) -> Config:
    base = dict(
        name="tiny-llama-test",
        block_size=256,
        vocab_size=512,
        padded_vocab_size=512,
        n_layer=n_layer,
        n_head=4,
        n_query_groups=2,
        n_embd=n_embd,
        intermediate_size=4 * n_embd,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        rotary_percentage=1.0,
    )
    base.update(kw)
    return Config(**base)


@pytest.fixture()
def checkpoint_dir(tmp_path):
    path = tmp_path / "checkpoints" / "tiny-llama-test"
    path.mkdir(parents=True)
    save_config(tiny_config(), path)
    return path


def recipe(ckpt, **extra) -> dict:
    out = {
        "checkpoint_dir": str(ckpt),
        "precision": "bf16-true",
        "train": {"global_batch_size": 4, "micro_batch_size": 2, "max_seq_length": 64},
    }
    out.update(extra)
    return out


def spec(method="full", precision="bf16-true", mb=2, seq=64, **kw) -> TrainingSpec:
    cfg = kw.pop("config", None) or tiny_config()
    lora = LORA_ALL if method != "full" else {}
    quantize = "bnb.nf4" if method == "qlora" else None
    return TrainingSpec(cfg, method, precision, mb, seq, lora=lora, quantize=quantize, **kw)


def peak(s: TrainingSpec) -> float:
    return predict(s).peak_alloc_gib


@pytest.mark.slow
def test_bf16_true_below_32_true():
    assert peak(spec(precision="bf16-true")) < peak(spec(precision="32-true"))


def test_bf16_mixed_above_bf16_true():
    assert peak(spec(precision="bf16-mixed")) > peak(spec(precision="bf16-true"))


def test_lora_below_full():
    assert peak(spec("lora")) < peak(spec("full"))


@pytest.mark.slow
def test_qlora_below_lora_on_a_larger_model():
    big = tiny_config(n_embd=512, n_head=8, n_query_groups=8)
    lora, qlora = predict(spec("lora", config=big, mb=1, seq=32)), predict(spec("qlora", config=big, mb=1, seq=32))
    assert qlora.peak_alloc_gib < lora.peak_alloc_gib
    assert qlora.breakdown_gib["parameters"] < 0.5 * lora.breakdown_gib["parameters"]


def test_nf4_double_quant_smaller():
    big = tiny_config(n_embd=512, n_head=8, n_query_groups=8)
    plain = predict(dataclasses.replace(spec("qlora", config=big, mb=1, seq=32), quantize="bnb.nf4"))
    dq = predict(dataclasses.replace(spec("qlora", config=big, mb=1, seq=32), quantize="bnb.nf4-dq"))
    assert dq.breakdown_gib["parameters"] < plain.breakdown_gib["parameters"]


@pytest.mark.slow
def test_fsdp_per_gpu_below_ddp():
    cfg = tiny_config(n_layer=4, n_embd=256)
    ddp = predict(spec(config=cfg, devices=4, strategy="ddp", mb=1, seq=32))
    fsdp = predict(spec(config=cfg, devices=4, strategy="fsdp", mb=1, seq=32))
    assert fsdp.peak_alloc_gib < ddp.peak_alloc_gib


def test_ddp_bucket_copy_only_without_gradient_as_bucket_view():
    cfg = tiny_config(n_layer=4, n_embd=256)
    views = predict(spec(config=cfg, devices=4, strategy="ddp", mb=1, seq=32))  # the lab's DDPStrategy
    copies = predict(
        dataclasses.replace(
            spec(config=cfg, devices=4, strategy="ddp", mb=1, seq=32), ddp_gradient_as_bucket_view=False
        )
    )
    assert views.breakdown_gib["communication_buffers"] == 0
    assert copies.breakdown_gib["communication_buffers"] == pytest.approx(copies.breakdown_gib["gradients"], rel=0.05)
    assert views.peak_alloc_gib < copies.peak_alloc_gib


@pytest.mark.slow
def test_peak_grows_with_micro_batch_and_sequence():
    assert peak(spec(mb=1)) < peak(spec(mb=2)) < peak(spec(mb=4))
    assert peak(spec(seq=32)) < peak(spec(seq=128))


def test_gradient_accumulation_holds_gradients_between_micro_batches():
    one, many = predict(spec(gradient_accumulation_iters=1)), predict(spec(gradient_accumulation_iters=4))
    assert many.breakdown_gib["gradients"] > 0
    assert many.peak_alloc_gib >= one.peak_alloc_gib


def _offload_spec(cfg: Config) -> TrainingSpec:
    return spec(
        config=cfg,
        devices=2,
        strategy="deepspeed-zero3",
        offload_optimizer=True,
        optimizer="DeepSpeedCPUAdam",
        mb=1,
        seq=32,
    )


def test_offload_moves_optimizer_bytes_to_host():
    cfg = tiny_config(n_layer=4, n_embd=256)
    on_gpu = predict(spec(config=cfg, devices=2, strategy="deepspeed-zero3", mb=1, seq=32))
    off = predict(_offload_spec(cfg))
    assert on_gpu.breakdown_gib["optimizer_states"] > 0
    assert off.breakdown_gib["optimizer_states"] == 0
    assert off.host_gib > on_gpu.host_gib
    assert off.peak_alloc_gib < on_gpu.peak_alloc_gib


def _real_bytes(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@pytest.mark.parametrize("precision,dtype", [("32-true", torch.float32), ("bf16-true", torch.bfloat16)])
@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_traced_bytes_equal_real_objects(precision, dtype, optimizer):
    """The fake trace's parameter and optimizer-state bytes equal those of real objects after a real step."""
    from litgpt.model import GPT
    from litgpt.utils import chunked_cross_entropy

    cfg = tiny_config()
    kwargs = {"momentum": 0.9} if optimizer == "SGD" else {}
    s = spec(precision=precision, optimizer=optimizer, optimizer_kwargs=kwargs, mb=1, seq=16)
    traced = trace_training(s)

    torch.manual_seed(0)
    model = GPT(cfg).to(dtype)
    model.max_seq_length = 16
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=1e-3, **kwargs)
    x = torch.randint(0, 512, (1, 16))
    loss = chunked_cross_entropy(model(x)[..., :-1, :].float(), x[..., 1:])
    loss.backward()
    opt.step()
    states = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.numel() > 1]
    assert traced.param_bytes == _real_bytes([*model.parameters(), *model.buffers()])
    assert traced.optimizer_state_bytes == _real_bytes(states)
    assert traced.trainable_param_numel == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_extrapolated_trace_equals_full_trace():
    s = spec("lora", config=tiny_config(n_layer=6), mb=1, seq=16, gradient_accumulation_iters=2)
    full, scaled = trace_training(s), trace(s)
    assert [p.peak_bytes for p in scaled.phases] == [p.peak_bytes for p in full.phases]


def test_plan_fields_and_breakdown_sum():
    plan = predict(spec(gpu_memory_gib=80.0))
    assert isinstance(plan, MemoryPlan)
    parts = {k: v for k, v in plan.breakdown_gib.items() if k != "cuda_context"}
    assert sum(parts.values()) == pytest.approx(plan.peak_alloc_gib, abs=1e-3)
    assert set(plan.breakdown_gib) == set(BREAKDOWN_PARTS)  # every part the plots stack, and no other
    assert plan.fits is True and "fits" in plan.summary()
    assert predict(spec(gpu_memory_gib=0.1)).fits is False
    assert predict(spec()).fits is None
    json.dumps(plan.to_dict())


def test_spec_from_recipe(checkpoint_dir):
    s = spec_from_recipe(recipe(checkpoint_dir), overrides={"train.micro_batch_size": 1}, data_max_len=40)
    assert (s.method, s.micro_batch_size, s.seq_len, s.gradient_accumulation_iters) == ("full", 1, 40, 4)
    s = spec_from_recipe(recipe(checkpoint_dir, lora_r=4, lora_mlp=True))
    assert s.method == "lora" and s.lora["lora_r"] == 4 and s.lora["lora_mlp"] is True
    s = spec_from_recipe(recipe(checkpoint_dir, lora_r=4, quantize="bnb.nf4-dq"))
    assert s.method == "qlora"
    s = spec_from_recipe(recipe(checkpoint_dir, train={"max_seq_length": 4096}))
    assert s.seq_len == 256  # capped by the block size
    s = spec_from_recipe({"checkpoint_dir": "checkpoints/meta-llama/Llama-3.2-1B", "precision": "bf16-true"})
    assert s.model_config.n_layer == 16
    # litgpt's own multi-device run (no strategy given) vs the lab's Lightning-Trainer strategies
    s = spec_from_recipe(
        recipe(checkpoint_dir, train={"global_batch_size": 8, "micro_batch_size": 1}), devices=4, strategy=None
    )
    assert (s.strategy, s.loop, s.activation_checkpointing) == ("fsdp", "litgpt", True)
    s = spec_from_recipe(
        recipe(checkpoint_dir, train={"global_batch_size": 8, "micro_batch_size": 1}),
        devices=4,
        strategy="fsdp",
        fsdp_wrap_blocks=False,
    )
    assert (s.loop, s.activation_checkpointing, s.fsdp_wrap_blocks) == ("lightning", False, False)
    assert plan_recipe(recipe(checkpoint_dir)).peak_alloc_gib > 0


@pytest.mark.parametrize(
    "change,kwargs,message",
    [
        ({"checkpoint_dir": "checkpoints/nobody/NoSuchModel-7B"}, {}, "unknown model"),
        ({"quantize": "bnb.nf4"}, {}, "finetune_lora"),
        ({}, {"devices": 0}, "devices"),
        ({}, {"strategy": "fsdp", "devices": 1}, "at least 2 devices"),
        ({}, {"strategy": "single", "devices": 2}, "one device"),
        ({"lora_r": 8, "quantize": "bnb.nf4", "precision": "bf16-mixed"}, {}, "mixed"),
    ],
)
def test_bad_input_is_one_clear_line(checkpoint_dir, change, kwargs, message):
    with pytest.raises(PlanError) as err:
        spec_from_recipe(recipe(checkpoint_dir, **change), **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_json_and_errors(checkpoint_dir, tmp_path, capsys):
    import yaml

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(checkpoint_dir)))
    parser = argparse.ArgumentParser()
    planner_cli.add_arguments(parser)
    assert (
        planner_cli.run(
            parser.parse_args([str(path), "--json", "--gpu-memory-gib", "80", "--set", "train.micro_batch_size=1"])
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert {"peak_alloc_gib", "breakdown_gib", "host_gib", "fits"} <= set(out) and out["fits"] is True
    assert out["micro_batch_size"] == 1
    assert planner_cli.run(parser.parse_args([str(path), "--devices", "0"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert planner_cli.run(parser.parse_args([str(path), "--strategy", "ddp", "--devices", "2"])) == 0
    assert "per GPU" in capsys.readouterr().out


def test_torch_upgrade_gives_clear_error(monkeypatch):
    from lab_helpers.planning.planner import _compat
    from lab_helpers.planning.planner.errors import PlannerUnavailable

    _compat.check_tracing_supported.cache_clear()
    monkeypatch.setattr(torch, "__version__", "9.1.0")
    try:
        with pytest.raises(PlannerUnavailable, match="outside the range"):
            predict(spec())
    finally:
        monkeypatch.undo()
        _compat.check_tracing_supported.cache_clear()


def test_the_offload_host_number_is_the_planners_own():
    """The doctor's and the pre-run gate's host RAM figure (no trace) equals the traced plan's host_gib."""
    from lab_helpers.planning.planner.analytic import offload_host_bytes

    plan = predict(_offload_spec(tiny_config(n_layer=4, n_embd=256)))
    assert offload_host_bytes(plan.total_params, plan.trainable_params, 2) / 2**30 == pytest.approx(plan.host_gib)


def test_the_sanity_validation_before_training_sees_no_optimizer_state(checkpoint_dir):
    """litgpt validates 2 batches before the first step; only an eval.interval inside the run (or a final
    validation) validates with the optimizer states and the last logits alive."""
    train = {"global_batch_size": 4, "micro_batch_size": 2, "max_seq_length": 64, "max_steps": 20, "lr_warmup_steps": 1}
    outside = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 1000, "final_validation": False}))
    inside = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 10, "final_validation": False}))
    final = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 1000, "final_validation": True}))
    assert not outside.validation_during_training and inside.validation_during_training
    assert final.validation_during_training
    assert predict(outside).peak_alloc_gib <= predict(inside).peak_alloc_gib


def test_a_cpu_plan_has_no_cuda_context_and_no_cublas_workspace():
    on_gpu, on_cpu = predict(spec()), predict(spec(device="cpu"))
    assert on_cpu.breakdown_gib["cuda_context"] == 0.0 and on_gpu.breakdown_gib["cuda_context"] > 0
    assert on_cpu.gpu_used_gib == pytest.approx(on_cpu.peak_alloc_gib)
    assert on_gpu.peak_alloc_gib - on_cpu.peak_alloc_gib >= 0.06  # at least cuBLAS's 64 MiB of workspaces


def _phases(result) -> list:
    return [(p.name, p.peak_bytes, p.by_category, p.step_temporaries) for p in result.phases]


@pytest.mark.slow  # full traces
def test_a_micro_batch_replayed_from_two_traces_equals_its_own_trace():
    """Every storage is affine in the micro-batch size on one timeline: traces at 2 and 3 answer 5 exactly."""
    from lab_helpers.planning.planner.tracer import scaled_trace

    s = spec("lora", gradient_accumulation_iters=2)
    two, three, five = (trace_training(dataclasses.replace(s, micro_batch_size=b)) for b in (2, 3, 5))
    scaled = scaled_trace(two, three, 2, 3, 5)
    assert scaled is not None and _phases(scaled) == _phases(five)
    # full fine-tuning chunks the loss over micro-batch x sequence rows: another timeline, so no shortcut is taken
    f2, f3 = (trace_training(dataclasses.replace(spec(), micro_batch_size=b)) for b in (2, 3))
    assert scaled_trace(f2, f3, 2, 3, 5) is None


@pytest.mark.slow
def test_repeated_predictions_at_other_batch_sizes_reuse_the_traces(monkeypatch):
    """A batch-size search (plan --fit) traces two sizes and replays the rest; the answers equal full traces."""
    from lab_helpers.planning.planner import plan as plan_module
    from lab_helpers.planning.planner import tracer

    monkeypatch.setattr(plan_module, "_CACHE", {})
    monkeypatch.setenv("LAB_TRACE_CACHE", "0")  # count the traces: no plan kept on disk by an earlier test
    monkeypatch.setattr(tracer, "_TIMELINES", {})
    calls = []
    real = tracer.trace_training
    monkeypatch.setattr(
        tracer, "trace_training", lambda s, n_layer=None: calls.append(s.micro_batch_size) or real(s, n_layer)
    )
    base = spec("lora", config=tiny_config(n_layer=4), seq=32)
    plans = {b: predict(dataclasses.replace(base, micro_batch_size=b)) for b in (2, 4, 3, 6, 8)}
    assert sorted(set(calls)) == [2, 4]  # two traced sizes (at two depths each); 3, 6 and 8 replayed
    for b in (3, 6, 8):
        full = plan_module._predict(dataclasses.replace(base, micro_batch_size=b))  # would trace: compare directly
        assert plans[b].peak_alloc_gib == pytest.approx(full.peak_alloc_gib, abs=1e-12)
        assert plans[b].breakdown_gib == full.breakdown_gib


@pytest.mark.slow  # full traces
@pytest.mark.parametrize("method,accumulation", [("full", 1), ("qlora", 2), ("lora", 3)])
def test_extrapolated_trace_equals_full_trace_for_every_method(method, accumulation):
    """Traced at 1 and 2 blocks (most models: identical blocks) and extrapolated to 5: equal to tracing all 5."""
    from lab_helpers.planning.planner.tracer import _TIMELINES, scaling_depths

    _TIMELINES.clear()
    s = spec(method, config=tiny_config(n_layer=5, n_embd=128), mb=1, seq=16, gradient_accumulation_iters=accumulation)
    assert scaling_depths(s.model_config) == (1, 2)
    full, scaled = trace_training(s), trace(s)
    assert [p.peak_bytes for p in scaled.phases] == [p.peak_bytes for p in full.phases]


@pytest.mark.slow  # full traces
def test_alternating_layers_are_traced_in_pairs():
    from lab_helpers.planning.planner.tracer import layer_period, scaling_depths

    alternating = tiny_config(n_layer=8, sliding_window_size=16, sliding_window_indices=[1, 0] * 4)
    assert layer_period(alternating) == 2 and scaling_depths(alternating) == (2, 4)
    assert layer_period(tiny_config(n_layer=8)) == 1
    irregular = tiny_config(n_layer=8, sliding_window_size=16, sliding_window_indices=[1, 0, 0, 1, 1, 1, 0, 1])
    assert scaling_depths(irregular) is None  # no period: traced at full depth
    s = spec(config=alternating, mb=1, seq=32)
    assert [p.peak_bytes for p in trace(s).phases] == [p.peak_bytes for p in trace_training(s).phases]


@pytest.mark.slow
def test_qlora_dequantizes_to_fp16_then_to_the_compute_dtype():
    """bitsandbytes 0.49 MatMul4Bit: dequantize_4bit gives the quant state's fp16, .to(A.dtype) a bf16 copy;
    both are alive at once, so a step's temporaries hold at least two copies of the largest weight."""
    cfg = tiny_config(n_embd=256, n_head=4, n_query_groups=4, vocab_size=4096, padded_vocab_size=4096)
    plan = predict(spec("qlora", config=cfg, mb=1, seq=16, device="cpu"))
    largest = 4096 * 256
    assert plan.breakdown_gib["temporaries"] * 2**30 >= 2 * 2 * largest
    saved = predict(spec("qlora", config=cfg, mb=1, seq=16, device="cpu", bitsandbytes_version="0.42.0"))
    assert saved.breakdown_gib["activations"] > plan.breakdown_gib["activations"]  # 0.42's kept inputs: not default


def _kept_input_bytes(cfg, tokens: int, first_qkv: bool) -> int:
    """bf16 bytes of the distinct inputs of every 4-bit layer of a LLaMA-style LoRA model: each block's qkv, proj,
    fc_1 = fc_2 (one tensor) and mlp proj inputs, and the head's; block 0's qkv input only when it needs a grad."""
    per_block = (2 * cfg.n_embd + cfg.head_size * cfg.n_head + cfg.intermediate_size) * tokens * 2
    return cfg.n_layer * per_block + cfg.n_embd * tokens * 2 - (0 if first_qkv else cfg.n_embd * tokens * 2)


def test_bitsandbytes_before_0_43_2_keeps_every_4bit_input_until_the_graph_dies():
    """bitsandbytes 0.42's MatMul4Bit sets ``ctx.tensors = (A, B)``: autograd frees saved tensors after a node's
    backward, but not a node's attributes. So every input is still alive at the optimizer step and at the
    validation that follows (litgpt's ``logits`` keeps the graph), exactly the bytes of those inputs."""
    from lab_helpers.planning.planner.tracer import trace_training

    cfg = tiny_config()
    now = trace_training(spec("qlora", config=cfg, mb=2, seq=32, device="cpu"))
    old = trace_training(spec("qlora", config=cfg, mb=2, seq=32, device="cpu", bitsandbytes_version="0.42.0"))
    kept = _kept_input_bytes(cfg, tokens=2 * 32, first_qkv=True)  # the trainable StableEmbedding: all need grads
    extra = {p.name: o.peak_bytes - p.peak_bytes for p, o in zip(now.phases, old.phases, strict=True)}
    assert extra["w0-step"] == extra["w1-step"] == extra["validation"] == kept
    assert extra["w1m0-forward"] > kept  # the last step's graph is alive beside the new inputs


@pytest.mark.slow
def test_litgpt_before_0_5_trains_qlora_on_the_frozen_embedding():
    """litgpt < 0.5.0 had no StableEmbedding: no trainable embedding copy, no old one kept alive, and block 0's
    first 4-bit layer sees an input that needs no gradient, so bitsandbytes 0.42 did not keep it."""
    from lab_helpers.planning.planner.tracer import trace_training

    cfg = tiny_config()
    runs = {
        (bnb, lit): trace_training(
            spec("qlora", config=cfg, mb=2, seq=32, device="cpu", bitsandbytes_version=bnb, litgpt_version=lit)
        )
        for bnb, lit in ((None, None), (None, "0.4.5"), ("0.42.0", "0.4.5"))
    }
    new, old = runs[None, None], runs[None, "0.4.5"]
    assert new.kept_alive_bytes > 0 and old.kept_alive_bytes == 0
    assert new.trainable_param_numel - old.trainable_param_numel == cfg.padded_vocab_size * cfg.n_embd + 2 * cfg.n_embd
    step = {key: next(p.peak_bytes for p in t.phases if p.kind == "step") for key, t in runs.items()}
    assert step["0.42.0", "0.4.5"] - step[None, "0.4.5"] == _kept_input_bytes(cfg, tokens=64, first_qkv=False)


def test_software_versions_are_read_once_and_checked():
    from lab_helpers.planning.planner.spec import Software

    assert Software.of(None, None) == Software(bnb_keeps_matmul_input=False, qlora_stable_embedding=True)
    assert Software.of("0.43.1", "0.4.5") == Software(bnb_keeps_matmul_input=True, qlora_stable_embedding=False)
    assert Software.of("0.43.2", "0.5.0") == Software()
    for bnb, lit, message in (
        ("banana", None, "bitsandbytes version 'banana' is not a version number"),
        ("0.41.3", None, "bitsandbytes 0.41.3 is older than the planner models (0.42.0 or later)"),
        (None, "0.3.1", "litgpt 0.3.1 is older than the planner models (0.4.0 or later)"),
    ):
        with pytest.raises(PlanError, match=re.escape(message)):
            spec("qlora", bitsandbytes_version=bnb, litgpt_version=lit).validate()


@pytest.mark.slow
def test_the_whole_run_has_a_load_phase_and_fits_is_judged_on_the_larger():
    from lab_helpers.planning.planner import whole_run

    s = spec("qlora", config=tiny_config(n_embd=256, n_head=4, n_query_groups=4), mb=1, seq=16)
    plan = predict(s)
    assert set(plan.peaks_by_phase_gib) == {"training", "load"}
    assert plan.whole_run_peak_alloc_gib == pytest.approx(max(plan.peaks_by_phase_gib.values()), abs=1e-4)
    assert plan.whole_run_peak_alloc_gib >= plan.peak_alloc_gib
    # the quantization pass holds one weight in bf16 and fp16 beside the model
    from lab_helpers.planning.planner.tracer import trace as trace_of

    t = trace_of(s)
    load, name = whole_run.load_bytes(s, t)
    assert name == "load + quantize" and load >= t.param_bytes + 4 * t.largest_weight_numel - t.kept_alive_bytes
    # a load phase larger than the loop decides the verdict
    w = whole_run.whole_run(s, t, training_bytes=1, training_phase="w1m1-forward")
    assert w["phase"] == "load + quantize" and w["bytes"] == load
    gen = predict(dataclasses.replace(s, generate_example=True, max_new_tokens=4))
    assert "generation" in gen.peaks_by_phase_gib


def test_spec_from_recipe_knows_when_litgpt_generates_an_example(checkpoint_dir):
    train = {"global_batch_size": 4, "micro_batch_size": 2, "max_seq_length": 64, "max_steps": 20, "lr_warmup_steps": 1}
    never = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 1000, "max_new_tokens": 10}))
    inside = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 10, "max_new_tokens": 10}))
    too_long = spec_from_recipe(recipe(checkpoint_dir, train=train, eval={"interval": 10, "max_new_tokens": 100}))
    assert (never.generate_example, inside.generate_example, too_long.generate_example) == (False, True, False)


def _timeline(result) -> tuple[list, list]:
    records, phases = result.timeline
    return (
        [(r.nbytes, r.raw_nbytes, r.t_alloc, r.t_free, r.phase, r.category) for r in records],
        [(p.name, p.kind, p.t_start, p.t_end, p.peak_bytes, p.t_peak, p.by_category) for p in result.phases],
    )


@pytest.mark.parametrize(
    "method,precision,accumulation",
    [
        ("full", "bf16-true", 2),
        pytest.param("full", "32-true", 1, marks=pytest.mark.slow),
        pytest.param("lora", "bf16-mixed", 2, marks=pytest.mark.slow),
        pytest.param("qlora", "bf16-true", 1, marks=pytest.mark.slow),
    ],
)
def test_the_loss_shortcut_records_the_same_timeline_as_the_ops_themselves(
    monkeypatch, method, precision, accumulation
):
    """``loss_outputs`` makes log_softmax's and nll_loss's outputs without their slow fake kernels (a 1.1B full
    fine-tune's --fit search: 21-24 s -> 15 s). It may change how fast a trace runs, never what it records: the
    same storages, sizes, lifetimes and roles, record for record; and the shortcut must really have been taken."""
    from lab_helpers.planning.planner import loss_outputs

    real = dict(loss_outputs.SHORTCUTS)
    taken = []

    def counted(op, make):
        def shortcut(args):
            out = make(args)
            if out is not None:
                taken.append(op)
            return out

        return shortcut

    s = spec(method, precision, mb=3, seq=100, gradient_accumulation_iters=accumulation)  # 297 rows: 3 loss chunks
    monkeypatch.setattr(loss_outputs, "SHORTCUTS", {op: counted(op, make) for op, make in real.items()})
    fast = trace_training(s)
    monkeypatch.setattr(loss_outputs, "SHORTCUTS", {})
    plain = trace_training(s)
    assert set(taken) == set(real)
    assert _timeline(fast) == _timeline(plain)


@pytest.mark.slow  # 5 traces of the tiny model
def test_fields_the_trace_does_not_read_leave_it_unchanged_and_share_it(monkeypatch):
    """Runs that differ only in ``tracer.UNTRACED_FIELDS`` (or in accumulation beyond 2 micro-batches) share one
    trace: FSDP over 2, 4 and 8 GPUs in ``--fit``'s alternatives trace once. Each such change must leave the
    trace exactly as it was, or sharing would hand one run another's timeline."""
    from lab_helpers.planning.planner import plan as plan_module
    from lab_helpers.planning.planner import tracer

    fsdp = spec("full", strategy="fsdp", devices=2, gradient_accumulation_iters=2)
    zero3 = spec("full", strategy="deepspeed-zero3", devices=2, gradient_accumulation_iters=2)
    changes = {
        "devices": 4,
        "fsdp_wrap_blocks": False,
        "gpu_memory_gib": 10.0,
        "fsdp_reshard_after_forward": False,
        "fsdp_impl": "fsdp2",
        "fsdp_unsharded_grad_accumulation": False,
        "ddp_gradient_as_bucket_view": False,
        "generate_example": True,
        "max_new_tokens": 7,
    }
    assert set(changes) | {"offload_optimizer"} == set(tracer.UNTRACED_FIELDS)
    changed = dataclasses.replace(fsdp, gradient_accumulation_iters=5, **changes)  # all at once: one trace
    assert _timeline(trace_training(changed)) == _timeline(trace_training(fsdp))
    offloaded = dataclasses.replace(zero3, offload_optimizer=True, optimizer="DeepSpeedCPUAdam")
    assert _timeline(trace_training(offloaded)) == _timeline(
        trace_training(dataclasses.replace(offloaded, offload_optimizer=False))
    )

    monkeypatch.setattr(plan_module, "_CACHE", {})
    monkeypatch.setenv("LAB_TRACE_CACHE", "0")  # count the traces: no plan kept on disk by an earlier test
    monkeypatch.setattr(tracer, "_TIMELINES", {})
    calls = []
    real = tracer.trace_training
    monkeypatch.setattr(tracer, "trace_training", lambda s, n_layer=None: calls.append(s.devices) or real(s, n_layer))
    plans = [predict(dataclasses.replace(fsdp, devices=n, gradient_accumulation_iters=16 // n)) for n in (2, 4, 8)]
    assert calls == [2]  # one trace; the analytic FSDP terms differ
    assert plans[0].peak_alloc_gib > plans[1].peak_alloc_gib > plans[2].peak_alloc_gib


def test_fsdp1_under_the_trainer_accumulates_unsharded_gradients(tmp_path):
    """Lightning's Trainer runs the accumulating micro-batches of an FSDP1 model in its ``no_sync``: the
    ``isinstance(model, DistributedDataParallel)`` test in ``ParallelStrategy.block_backward_sync`` is against a
    runtime-checkable protocol that FSDP1's wrapper satisfies (it has ``no_sync``), so every rank keeps the whole
    model's gradients, unsharded, from the first micro-batch of a step into the last one. FSDP2 (the module
    itself under ModelParallelStrategy) has no ``no_sync``: its gradients are reduce-scattered every micro-batch.
    Measured: the H200 simulated ranks of 2026-11-26 (7B, rank 0 of 4, accumulation 2) held 5.75 GiB more than the
    sharded-gradient model predicted; on a CPU the same Trainer with FSDPStrategy holds the unsharded gradients
    after the first micro-batch (FSDP1) where ModelParallelStrategy + fully_shard holds a quarter of them."""
    import lightning as L
    from lightning.pytorch.utilities.types import DistributedDataParallel as NoSyncProtocol
    from torch.distributed.fsdp import FullyShardedDataParallel

    assert issubclass(FullyShardedDataParallel, NoSyncProtocol)  # the Trainer calls FSDP1's no_sync
    assert not issubclass(L.LightningModule, NoSyncProtocol)  # and nothing of the kind under FSDP2

    ckpt = tmp_path / "checkpoints" / "tiny-llama-test"
    ckpt.mkdir(parents=True)
    save_config(tiny_config(n_layer=4, n_embd=256), ckpt)

    def plan(impl: str, global_batch: int):
        r = recipe(ckpt, train={"global_batch_size": global_batch, "micro_batch_size": 2, "max_seq_length": 32})
        s = spec_from_recipe(r, devices=4, strategy="fsdp", fsdp_impl=impl)
        return s, predict(s)

    (s1, fsdp1), (s2, fsdp2) = plan("fsdp1", 16), plan("fsdp2", 16)
    assert s1.gradient_accumulation_iters == 2
    assert s1.fsdp_unsharded_grad_accumulation and not s2.fsdp_unsharded_grad_accumulation
    grads = 2 * fsdp1.trainable_params / 2**30  # bf16
    assert fsdp1.peak_alloc_gib - fsdp2.peak_alloc_gib == pytest.approx(grads - grads / 4, rel=0.02)
    assert any("no_sync" in note for note in fsdp1.notes)
    # one micro-batch per step: no no_sync, the two alike
    assert plan("fsdp1", 8)[1].peak_alloc_gib == plan("fsdp2", 8)[1].peak_alloc_gib
