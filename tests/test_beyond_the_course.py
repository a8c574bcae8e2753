"""LAB.md's "Beyond the course" experiments, without starting a training process (fast): activation
checkpointing, 8-bit AdamW, FSDP SHARD_GRAD_OP, DeepSpeed ZeRO-2 with optimizer offload.

Each is checked where it is decided: the code that switches it on (a real litgpt model, a real Lightning
strategy object, the DeepSpeed config), the planner's terms against the arithmetic a student can do on paper,
and what each kind of node does with it (recorded nodes, tests/node_fixtures.py). The runs themselves are in
tests/test_beyond_the_course_runs.py (slow).
"""

from __future__ import annotations

import pytest
import torch
from node_fixtures import node

from lab_helpers import launch, node_plan
from lab_helpers.config import recipe_defaults
from lab_helpers.config.experiments import load_experiments, resolve
from lab_helpers.config.record_schema import GIB
from lab_helpers.lab import predict_experiment
from lab_helpers.planning import arithmetic
from lab_helpers.planning.planner.errors import PlanError
from lab_helpers.planning.planner.optim8bit import AdamW8bitStandIn, bytes_per_param, state_bytes
from lab_helpers.planning.planner.spec import spec_from_recipe
from lab_helpers.planning.predict import planner_inputs
from lab_helpers.present import commands
from lab_helpers.training.activation_checkpointing import checkpoint_blocks
from lab_helpers.training.distributed import build_command, deepspeed_config
from lab_helpers.training.distributed.deepspeed_config import CPU_ADAM_CLASS, optimizer_class_path
from lab_helpers.training.distributed.strategies import make_strategy


def _tiny_gpt(n_layer: int = 2):
    from litgpt import Config
    from litgpt.model import GPT

    config = Config(n_layer=n_layer, n_head=2, n_embd=32, block_size=16, vocab_size=64, padded_vocab_size=64)
    torch.manual_seed(0)
    model = GPT(config)
    model.max_seq_length = 16
    return model


# ------------------------------------------------------------------------------------------- act-ckpt


def test_checkpointed_blocks_give_the_same_loss_and_gradients_and_keep_fewer_tensors():
    """The wrap changes what is stored, not what is computed: same loss and gradients, fewer saved tensors."""
    from torch.autograd.graph import saved_tensors_hooks

    def step(model):
        saved = []
        with saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = model(torch.arange(16).reshape(1, 16) % 64).float().pow(2).mean()
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()], sum(saved)

    plain_loss, plain_grads, plain_saved = step(_tiny_gpt())
    model = _tiny_gpt()
    assert checkpoint_blocks(model) == 2
    ckpt_loss, ckpt_grads, ckpt_saved = step(model)
    assert ckpt_loss == pytest.approx(plain_loss)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, ckpt_grads, strict=True))
    assert ckpt_saved < plain_saved


def test_checkpointing_refuses_a_model_that_is_not_a_litgpt_gpt():
    with pytest.raises(ValueError, match="needs a litgpt GPT"):
        checkpoint_blocks(torch.nn.Linear(2, 2))


def test_act_ckpt_is_full_7b_with_checkpointing_and_its_run_asks_for_it(tmp_path):
    """The pair differs only in the switch; the switch reaches the training command and the planner."""
    ckpt, plain = resolve("act-ckpt", "ci", check_files=False), resolve("full-7b", "ci", check_files=False)
    assert ckpt.recipe == plain.recipe
    asked, plain_asked = planner_inputs(ckpt, None), planner_inputs(plain, None)
    assert asked["activation_checkpointing"] is True and plain_asked["activation_checkpointing"] is False
    assert {k: v for k, v in asked.items() if k != "activation_checkpointing"} == {
        k: v for k, v in plain_asked.items() if k != "activation_checkpointing"
    }
    assert launch.command(ckpt, tmp_path)[-1] == "--activation-checkpointing"
    assert "--activation-checkpointing" not in launch.command(plain, tmp_path / "plain")


@pytest.mark.slow
def test_the_planner_trades_activations_for_nothing_else_with_checkpointing():
    ckpt, plain = predict_experiment("act-ckpt", profile="ci"), predict_experiment("full-7b", profile="ci")
    for part in ("parameters", "gradients", "optimizer_states"):
        assert ckpt.breakdown_gib[part] == plain.breakdown_gib[part], part
    assert ckpt.breakdown_gib["activations"] < plain.breakdown_gib["activations"] / 4
    assert ckpt.peak_alloc_gib < plain.peak_alloc_gib


def test_act_ckpt_command_says_litgpt_has_no_flag_for_it(capsys):
    commands.show_commands("act-ckpt", profile="gpu")
    out = capsys.readouterr().out
    assert "no flag" in out and "torch.utils.checkpoint" in out and "--activation-checkpointing" in out


# ------------------------------------------------------------------------------------------- 8-bit AdamW


def test_eight_bit_state_layout_follows_bitsandbytes():
    """1 B per moment plus one fp32 absmax per 256 values; parameters under 4096 elements keep fp32 moments."""
    assert bytes_per_param() == 2 * (1 + 4 / 256)
    assert state_bytes(4096 * 256) == 2 * 4096 * 256 + 2 * 4 * 4096
    assert state_bytes(100) == 2 * 4 * 100


def test_eight_bit_stand_in_allocates_what_it_says_and_pages_the_large_moments():
    big, small = torch.nn.Parameter(torch.zeros(512, 512)), torch.nn.Parameter(torch.zeros(10))
    for p in (big, small):
        p.grad = torch.zeros_like(p)
    opt = AdamW8bitStandIn([big, small])
    opt.step()
    held = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    assert held == state_bytes(big.numel()) + state_bytes(small.numel())
    paged = AdamW8bitStandIn([big], paged=True)
    paged.step()
    assert paged.paged_bytes == 2 * big.numel()  # uint8 moments in managed memory; absmax on the allocator


@pytest.mark.slow
def test_eight_bit_arithmetic_and_planner_agree_on_the_7b():
    """Optimizer states: 4 B/param for bf16 AdamW, ~2 for 8-bit; the planner's trace of the real 7B agrees."""
    eight, plain = arithmetic.model_states("adamw-8bit"), arithmetic.model_states("full-7b")
    assert plain.trained.optimizer_states == 4 and eight.trained.optimizer_states == bytes_per_param()
    assert eight.counts == plain.counts
    plan = predict_experiment("adamw-8bit", profile="gpu", gpu_memory_gib=80.0)
    expected_gib = eight.counts.trainable * eight.trained.optimizer_states / GIB
    assert plan.breakdown_gib["optimizer_states"] == pytest.approx(expected_gib, rel=0.01)


def test_eight_bit_needs_cuda_and_bitsandbytes_and_says_so():
    run = resolve("adamw-8bit", "ci", check_files=False)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from lab_helpers.planning.decision import blocked

    assert blocked(run, node("none")) == "needs CUDA: bitsandbytes 8-bit AdamW cannot run on a CPU"
    step = node_plan.decide("adamw-8bit", node("none"), profile="ci")
    assert step.expected_status == "skipped" and not step.runs and "8-bit AdamW cannot run on a CPU" in step.sentence
    no_bnb = node("H100-80GB")
    no_bnb["packages"]["bitsandbytes"] = None
    step = node_plan.decide("adamw-8bit", no_bnb, profile="gpu", predict=lambda e, o: pytest.fail("asked"))
    assert not step.runs and "pip install" in step.sentence and "8-bit AdamW" in step.sentence


def test_litgpt_can_build_the_eight_bit_optimizer_from_the_recipe_string():
    """litgpt's instantiate_torch_optimizer imports a dotted class path: the recipe needs no lab code on a GPU."""
    import inspect

    from litgpt.utils import instantiate_torch_optimizer

    assert resolve("adamw-8bit", "gpu", check_files=False).recipe["optimizer"] == "bitsandbytes.optim.AdamW8bit"
    assert 'rsplit(".", 1)' in inspect.getsource(instantiate_torch_optimizer)


# ------------------------------------------------------------------------------------------- SHARD_GRAD_OP


@pytest.mark.slow
def test_grad_op_keeps_the_whole_model_gathered_while_full_shard_keeps_two_blocks():
    full, grad_op = predict_experiment("fsdp", profile="gpu"), predict_experiment("fsdp-grad-op", profile="gpu")
    for part in ("parameters", "gradients", "optimizer_states", "activations"):
        assert grad_op.breakdown_gib[part] == full.breakdown_gib[part], part
    states = arithmetic.model_states("fsdp-grad-op")
    weights_gib = states.counts.total * states.trained.weights / GIB
    # the whole model's weights, plus (in backward) one block's unsharded gradients on their way to the shards
    assert weights_gib <= grad_op.breakdown_gib["communication_buffers"] <= weights_gib * 1.05
    assert full.breakdown_gib["communication_buffers"] < weights_gib / 5


def test_grad_op_reaches_the_command_the_strategy_and_the_lightning_lines(tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy

    argv = build_command(resolve("fsdp-grad-op", "ci", check_files=False), tmp_path)
    assert argv[argv.index("--sharding") + 1] == "grad-op"
    assert "--sharding" not in build_command(resolve("fsdp", "ci", check_files=False), tmp_path / "fsdp")
    cpu = make_strategy("fsdp", on_cuda=False, world_size=2, sharding="grad-op")
    assert "reshard_after_forward=False (SHARD_GRAD_OP)" in cpu.label and cpu.sharding == "grad-op"
    cuda = make_strategy("fsdp", on_cuda=True, world_size=4, sharding="grad-op")
    assert isinstance(cuda.strategy, FSDPStrategy) and "SHARD_GRAD_OP" in cuda.label
    assert 'sharding_strategy="SHARD_GRAD_OP"' in commands.strategy_lines("fsdp-grad-op")
    with pytest.raises(ValueError, match="sharding 'half'"):
        make_strategy("fsdp", on_cuda=False, world_size=2, sharding="half")


def test_communication_per_optimizer_step_counts_fsdp1_as_lightning_runs_it():
    """The 4-GPU recipes accumulate 32 / (4 x 4) = 2 micro-batches, and Lightning runs FSDP1's accumulation under
    no_sync: FULL_SHARD per block gathers in every micro-batch (each block twice, the root unit once) and
    reduce-scatters once per step, (2a + 1)Ψ − aΨ_root; SHARD_GRAD_OP keeps the weights gathered through the step,
    2Ψ; DDP 2Ψ (tests/test_communication.py pins every count and checks them against torch's collectives)."""
    full, grad_op, ddp = (arithmetic.communication(e) for e in ("fsdp", "fsdp-grad-op", "ddp"))
    assert full.psi_multiple == pytest.approx(2 * 2 + 1 - 2 * full.root_share)
    assert (grad_op.psi_multiple, ddp.psi_multiple) == (2, 2)
    states = arithmetic.model_states("fsdp")
    assert full.psi_gib == pytest.approx(states.counts.total * 2 / GIB)  # bf16 weights
    assert full.per_gpu_gib == pytest.approx(full.psi_multiple * full.psi_gib * 3 / 4)  # ring: (N - 1)/N on 4
    assert grad_op.per_gpu_gib == pytest.approx(ddp.per_gpu_gib)
    assert arithmetic.communication("deepspeed-zero2-offload").psi_multiple == 5  # 4 reduce-scatters + 1 gather
    assert "4.92Ψ per optimizer step" in full.markdown() and "SHARD_GRAD_OP" in grad_op.markdown()
    with pytest.raises(ValueError, match="no communication"):
        arithmetic.communication("one-gpu")


def test_grad_op_is_an_fsdp_setting_for_the_planner(ci_assets):
    recipe = resolve("fsdp", "ci").recipe
    with pytest.raises(PlanError, match="FSDP setting"):
        spec_from_recipe(recipe, devices=2, strategy="ddp", fsdp_reshard_after_forward=False)


# ------------------------------------------------------------------------------------------- ZeRO-2 offload


def test_zero2_config_has_stage_2_the_planners_buckets_and_cpu_adam():
    recipe = resolve("deepspeed-zero2-offload", "gpu", check_files=False).recipe
    config = deepspeed_config(recipe, world_size=4, stage=2)
    zero = config["zero_optimization"]
    assert zero["stage"] == 2 and not any(k.startswith("stage3") for k in zero)
    assert zero["reduce_bucket_size"] == recipe_defaults.DS_REDUCE_BUCKET_NUMEL
    assert zero["allgather_bucket_size"] == recipe_defaults.DS_ALLGATHER_BUCKET_NUMEL
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert (
        optimizer_class_path(recipe, strategy="deepspeed-zero2", offload_optimizer=True, on_cuda=True) == CPU_ADAM_CLASS
    )
    with pytest.raises(ValueError, match="stage 2 or 3"):
        deepspeed_config(recipe, world_size=4, stage=1)


def test_zero2_runs_through_deepspeed_with_a_stage_2_config(tmp_path):
    import json

    argv = build_command(resolve("deepspeed-zero2-offload", "ci", check_files=False), tmp_path)
    assert argv[argv.index("--strategy") + 1] == "deepspeed-zero2"
    written = json.loads((tmp_path / "deepspeed.json").read_text())
    assert written["zero_optimization"]["stage"] == 2
    choice = make_strategy("deepspeed-zero2", on_cuda=False, world_size=2, deepspeed_config=written)
    assert choice.label.startswith("deepspeed zero2 + cpu offload")
    assert "'stage': 2" in commands.strategy_lines("deepspeed-zero2-offload")


@pytest.mark.slow
def test_zero2_offload_keeps_every_weight_on_each_gpu_and_the_same_host_bytes_per_param():
    """Same 7B on the same 4 GPUs: ZeRO-2 holds all the bf16 weights per GPU (ZeRO-3 a quarter), the host the
    same 16 B/param of offloaded optimizer state."""
    recipe = resolve("deepspeed-zero2-offload", "gpu", check_files=False).recipe
    from lab_helpers.planning.predict import predict_experiment as predict_on

    # on GPUs (from this CPU): a CPU prediction counts the offloaded states on the device, which is the host there
    zero2 = predict_on("deepspeed-zero2-offload", profile="gpu", device="cuda")
    zero3 = predict_on(
        "deepspeed-offload", profile="gpu", overrides={"checkpoint_dir": recipe["checkpoint_dir"]}, device="cuda"
    )
    weights_gib = arithmetic.model_states("deepspeed-zero2-offload").counts.total * 2 / GIB
    assert zero2.breakdown_gib["parameters"] == pytest.approx(weights_gib, rel=0.01)
    assert zero3.breakdown_gib["parameters"] == pytest.approx(weights_gib / zero3.devices, rel=0.01)
    assert zero2.breakdown_gib["optimizer_states"] == zero2.breakdown_gib["gradients"] == 0
    assert zero2.host_gib == pytest.approx(zero3.host_gib, rel=0.01)
    offloaded = arithmetic.offload_host_gib("deepspeed-zero2-offload")
    assert zero2.host_gib > offloaded


# ------------------------------------------------------------------------------------------- the nodes


@pytest.mark.slow
def test_every_node_kind_decides_the_new_experiments():
    """CPU: act-ckpt, SHARD_GRAD_OP and ZeRO-2 run on stand-ins, 8-bit AdamW and flash attention are skipped (the
    lesson of flash attention is a GPU's: attention-flash needs CUDA); one GPU: SHARD_GRAD_OP
    runs as a simulated rank 0 of 4 (memory, no communication); four H100s run the multi-GPU ones as defined."""
    ci = {e: node_plan.decide(e, node("none"), profile="ci") for e in load_experiments()}
    assert {e for e, s in ci.items() if s.expected_status != "ok"} == {"qlora-7b", "adamw-8bit", "attention-flash"}

    def fixture_plan(exp_id, overrides):
        from types import SimpleNamespace

        return SimpleNamespace(gpu_used_gib=30.0, peak_alloc_gib=29.0)

    one = node("H100-80GB")
    grad_op = node_plan.decide("fsdp-grad-op", one, profile="gpu", predict=fixture_plan)
    assert grad_op.runs and grad_op.simulate_world == 4 and "no communication" in grad_op.sentence
    zero2 = node_plan.decide("deepspeed-zero2-offload", one, profile="gpu", predict=fixture_plan)
    assert zero2.runs and "host RAM 128 GiB holds the offloaded optimizer" in zero2.sentence
    four = node("4xH100")
    for exp_id in ("fsdp-grad-op", "deepspeed-zero2-offload"):
        step = node_plan.decide(exp_id, four, profile="gpu", predict=fixture_plan)
        assert step.runs and step.expected_status == "ok" and step.overrides == {}, step
    act = node_plan.decide("act-ckpt", node("A10G-24GB"), profile="gpu", predict=fixture_plan)
    assert not act.runs and "model states alone" in act.sentence


# ------------------------------------------------------------------------------------------- fill-gpu


@pytest.mark.slow
def test_fill_gpu_is_lora_1b_with_the_largest_micro_batch_that_fits_and_the_same_global_batch():
    """On a memory budget between the planner's predictions at micro batch 8 and 16 (the ci model, as a CPU run
    holds it), fill-gpu takes 8 -- the largest divisor of the global batch 16 under the budget -- with 2
    accumulated; the rest of the recipe is lora-1b's."""
    from lab_helpers.planning import predict
    from lab_helpers.planning.planner.fit import DEFAULT_MARGIN
    from lab_helpers.planning.predict import fill_gpu_for

    fill, pair = resolve("fill-gpu", "ci", check_files=False), resolve("lora-1b", "ci", check_files=False)
    assert fill.recipe == pair.recipe and fill.options["fill_gpu"] and not pair.options["fill_gpu"]

    def used_gib(micro: int) -> float:
        overrides = {"train.micro_batch_size": micro}
        return predict.predict_experiment("fill-gpu", profile="ci", overrides=overrides, device="cpu").worst_gpu_used_gib

    budget_gib = (used_gib(8) + used_gib(16)) / 2 / (1 - DEFAULT_MARGIN)
    chosen, why = fill_gpu_for(fill, gpu_memory_gib=budget_gib, device="cpu")
    assert chosen == {"train.micro_batch_size": 8}, why
    assert "micro batch 8 x 2 accumulated keeps the global batch of 16" in why
    assert fill_gpu_for(fill, gpu_memory_gib=used_gib(16) * 2, device="cpu")[0] == {
        "train.micro_batch_size": 16
    }
