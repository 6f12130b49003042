"""Parameter, gradient and optimizer bytes per process under FSDP2 (`--set parallel=fsdp`) and DDP, counted from the
tensors each process holds (each DTensor's local shard under FSDP2), after one AdamW step of a variant.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/fsdp_shard_bytes.py S/16

No data and no forward pass: the gradients are zeros, so the step only makes AdamW's state. DDP holds whole
tensors on every process, so its figures are those of the unsharded model. Peak RSS is
benchmarks/finetune_memory.py's; this counts what sharding divides.
"""

from __future__ import annotations

import sys

import torch

from vitlab.distributed import cleanup, init_distributed
from vitlab.models import create_model
from vitlab.train.fsdp import held_bytes, mixed_precision_policy, shard_model
from vitlab.train.optim import build_optimizer


def one_step_bytes(model: torch.nn.Module) -> dict[str, int]:
    """held_bytes after one AdamW step on zero gradients (which creates the optimizer's state)."""
    optimizer = build_optimizer(model, "adamw", 1e-3, 0.05)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    return held_bytes(model, optimizer)


def main(variant: str) -> None:
    env = init_distributed()
    torch.manual_seed(0)
    whole = one_step_bytes(create_model(variant))
    model = create_model(variant)
    shard_model(model, mixed_precision_policy("fp32", env.device))
    sharded = one_step_bytes(model)
    if env.is_main:
        print(f"{variant}, {env.world_size} processes: MiB per process, FSDP2 / DDP")
        for kind in ("parameters", "gradients", "optimizer"):
            print(f"  {kind:<11} {sharded[kind] / 2**20:9.1f} / {whole[kind] / 2**20:9.1f}")
        total_sharded, total_whole = sum(sharded.values()), sum(whole.values())
        print(
            f"  {'all':<11} {total_sharded / 2**20:9.1f} / {total_whole / 2**20:9.1f}  ({total_sharded / total_whole:.1%})"
        )
    cleanup(env)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "S/16")
