"""Count the collectives FSDP1 and FSDP2 really issue per optimizer step, on torch's fake process group.

Run as a script (``python tests/fake_pg_collectives.py``): it prints one JSON object per line, one per
(implementation, sharding, wrapping, micro-batches), with the calls and elements of every all-gather and
reduce-scatter of one optimizer step of a tiny litgpt model as rank 0 of 4. A process of its own, because a
process group is global state. The step is run as Lightning's Trainer runs it (read in Lightning 2.6.6):

* FSDP1 (``FSDPStrategy``): the model is wrapped as ``strategies.strategy_call`` does (``auto_wrap_policy={Block}``
  per block, none for one unit) and every micro-batch but the last runs under the root's ``no_sync``, as
  ``ParallelStrategy.block_backward_sync`` does for a model with a ``no_sync`` method;
* FSDP2 (``ModelParallelStrategy``): ``fully_shard`` as the lab's module applies it (each Block, then the root with
  ``reshard_after_forward=None``, or False for grad-op), and no ``no_sync``: the LightningModule has none, and the
  Trainer never calls ``set_requires_gradient_sync``.

One step is run first (lazy initialisation), then one step is counted.
"""

from __future__ import annotations

import contextlib
import json

WORLD = 4
COUNTED = {
    "all_gather": "all-gather",  # FSDP1 on a CPU (a list of chunks)
    "all_gather_single": "all-gather",  # FSDP1 on CUDA, FSDP2
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_single": "reduce-scatter",
    "reduce_scatter_tensor": "reduce-scatter",
    "all_reduce": "all-reduce",
}


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    counts: dict[str, list[int]] = {}

    def counting(name: str, original):
        def call(*args, **kwargs):
            if name == "all_gather":
                numel = sum(t.numel() for t in args[0])
            elif name.startswith("all_gather"):
                numel = kwargs.get("output_tensor", args[0] if args else None).numel()
            elif name.startswith("reduce_scatter"):
                numel = kwargs.get("input", args[1] if len(args) > 1 else None).numel()
            else:
                numel = args[0].numel()
            entry = counts.setdefault(COUNTED[name], [0, 0])
            entry[0] += 1
            entry[1] += numel
            return original(*args, **kwargs)

        return call

    for name in COUNTED:
        setattr(dist, name, counting(name, getattr(dist, name)))
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    from litgpt.config import Config

    config = Config(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=64, padded_vocab_size=64)
    try:
        for impl in ("fsdp1", "fsdp2"):
            for sharding in ("full", "grad-op"):
                for wrap in ("block", "none"):
                    for micro_batches in (1, 2, 4):
                        model, no_sync = _wrapped(config, impl, sharding, wrap)
                        tokens = torch.randint(0, 64, (2, 8))
                        _step(model, no_sync, tokens, micro_batches)
                        counts.clear()
                        _step(model, no_sync, tokens, micro_batches)
                        total = sum(p.numel() for p in _model(config).parameters())
                        blocks = sum(p.numel() for p in _model(config).transformer.h.parameters())
                        print(json.dumps({
                            "impl": impl, "sharding": sharding, "wrap": wrap, "micro_batches": micro_batches,
                            "parameters": total, "root_parameters": total - blocks,
                            "collectives": {k: {"calls": v[0], "elements": v[1]} for k, v in counts.items()},
                        }), flush=True)  # fmt: skip
    finally:
        dist.destroy_process_group()


def _model(config):
    import torch
    from litgpt.model import GPT

    torch.manual_seed(0)
    return GPT(config)


def _wrapped(config, impl: str, sharding: str, wrap: str):
    import torch
    from litgpt.model import Block

    model = _model(config)
    if impl == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        strategy = ShardingStrategy.FULL_SHARD if sharding == "full" else ShardingStrategy.SHARD_GRAD_OP
        wrapped = FullyShardedDataParallel(
            model,
            sharding_strategy=strategy,
            # Lightning turns the lab's {Block} into this policy (fabric/strategies/fsdp.py, _auto_wrap_policy_kwargs)
            auto_wrap_policy=ModuleWrapPolicy({Block}) if wrap == "block" else None,
            device_id=torch.device("cpu"),
        )
        return wrapped, wrapped.no_sync
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    reshard = sharding == "full"
    if wrap == "block":
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False)
    return model, contextlib.nullcontext


def _step(model, no_sync, tokens, micro_batches: int) -> None:
    for index in range(micro_batches):
        with no_sync() if index < micro_batches - 1 else contextlib.nullcontext():
            model(tokens).float().sum().backward()


if __name__ == "__main__":
    main()
