"""Fully sharded data parallel (FSDP2, `torch.distributed.fsdp.fully_shard`), switched on by `--set parallel=fsdp`
under torchrun: each process keeps 1/N of every parameter, of its gradient and of the optimizer's state, instead of
DDP's whole copy of each.

`fully_shard` goes on every transformer block (`vitlab.layers.block.Block`, the encoder's and any a dense head
adds, such as EoMT's query blocks) and then on the root, which takes what is left (patch embedding, positions,
class token, final norm, head). A block's parameters are gathered just before its forward and freed after, so at
most one block is whole at a time; its gradients are reduce-scattered as its backward ends. This is DINOv3's and
torchtitan's layout, and a reader removes it by deleting one call (`shard_model`).

Where sharding cannot serve the run it runs as data parallel and says why in one line (`data_parallel_reason`):
one process, a model too small to shard (`too_small_to_shard`), an objective that trains modules beside the model
(a pre-training decoder), or an EMA of the weights.

The gloo backend (CPU) has every collective FSDP2 needs in torch 2.13 (all_gather_into_tensor and
reduce_scatter_tensor, fp32 and bf16): checked with two processes, so the CPU and the GPU share one path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitlab.distributed import DistEnv
from vitlab.hardware import cpu_units
from vitlab.layers.block import Block
from vitlab.models.registry import create_model

PARALLEL_CHOICES = ("ddp", "fsdp")


def sharded_units(model: nn.Module) -> list[str]:
    """The names of the modules `shard_model` puts `fully_shard` on, in the order it does: every transformer block
    (by its qualified name, e.g. "blocks.3"), then the root (""). Blocks inside blocks do not occur in vitlab."""
    return [name for name, module in model.named_modules() if isinstance(module, Block)] + [""]


def too_small_to_shard(model: nn.Module, world_size: int) -> str | None:
    """Why `model` is too small to shard over `world_size` processes, or None. FSDP2 splits each parameter along its
    first dimension; a block's norm weights and biases are one row per channel, so a width (embedding dimension)
    below the process count leaves some processes with nothing of them: sharding such a model only adds
    collectives. A model without transformer blocks has no unit to shard block by block."""
    if not any(isinstance(module, Block) for module in model.modules()):
        return "it has no transformer blocks to shard one by one"
    width = getattr(getattr(model, "config", None), "embed_dim", None)
    if width is not None and width < world_size:
        return f"its width {width} is below the {world_size} processes, so some would hold no row of a block's norms"
    return None


def data_parallel_reason(
    config: Any, env: DistEnv, trained: nn.Module, model: nn.Module, objective_name: str
) -> str | None:
    """For a run that asks for `parallel=fsdp`: the one line that says why it runs as data parallel instead, or
    None where it shards. `trained` is what the optimizer trains (the objective's module around `model`, or the
    model itself)."""
    if config.parallel != "fsdp":
        return None
    if not env.enabled:
        return (
            "parallel=fsdp on one process has nothing to shard over: training unsharded "
            "(launch with torchrun --nproc-per-node N to shard)"
        )
    small = too_small_to_shard(model, env.world_size)
    if small is not None:
        return f"parallel=fsdp: the model is too small to shard ({small}): running as data parallel (DDP)"
    if trained is not model:
        return (
            f"parallel=fsdp shards the model alone, and the {objective_name} objective trains modules beside it: "
            "running as data parallel (DDP)"
        )
    if config.ema_decay > 0:
        return (
            f"parallel=fsdp keeps no EMA of sharded weights (ema_decay={config.ema_decay}): running as data "
            "parallel (DDP); set ema_decay=0 to shard"
        )
    return None


def device_has_bf16(device: torch.device) -> bool:
    """Whether `device` computes in bf16 natively: a GPU that supports it, a CPU with bf16 matmul units."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_units().bf16


def mixed_precision_policy(precision: str, device: torch.device) -> Any:
    """FSDP2's precision for a run of `precision` ("bf16" or "fp32", as resolved for this machine) on `device`:
    bf16 parameters in forward and backward with gradients reduced in fp32 where the run asks for bf16 and the
    device has it, else fp32 throughout. The sharded master weights and the optimizer stay fp32 either way."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16" and device_has_bf16(device):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: nn.Module, policy: Any) -> None:
    """`fully_shard` on every transformer block, then on the root (in place: `model` becomes an FSDP module whose
    parameters are DTensor shards of this process), from rank 0's weights. Needs the process group."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    # Each rank drew its own initial weights (its seed is seed + rank); DDP starts every replica from rank 0's, and
    # fully_shard keeps whatever each rank holds, so without this the shards would mix the ranks' initialisations.
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)
    modules = dict(model.named_modules())
    for name in sharded_units(model):
        fully_shard(modules[name], mp_policy=policy)


def is_sharded(module: nn.Module) -> bool:
    """Whether `module` is sharded by FSDP2 (its parameters are this process's shards, not the whole tensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def parallelism(module: nn.Module, env: DistEnv) -> str:
    """How a run trains over its processes, as its summary records it: "fsdp", "ddp" or "none" (one process)."""
    if is_sharded(module):
        return "fsdp"
    return "ddp" if env.enabled else "none"


def gathered_copy(model: nn.Module, env: DistEnv) -> nn.Module:
    """A plain model holding a sharded `model`'s whole weights, on every process (a collective: call on every rank at
    once), for what reads whole weights: validation, the best and final checkpoints. Made when needed and dropped
    after, so training never holds a whole copy besides its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # Building it must not draw from the global RNG: the run's random stream is part of its exact resume.
    with torch.random.fork_rng(devices=[]):
        copy = create_model(model.config)  # type: ignore[arg-type]
    copy.load_state_dict(whole)
    return copy.to(env.device)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this process holds of the parameters, their gradients (where a step left them) and the optimizer's
    state: of its shards alone under FSDP2 (each DTensor's local part), of the whole tensors otherwise. What the
    memory benchmark reports as parameter and optimizer memory, counted rather than read off the RSS."""
    from torch.distributed.tensor import DTensor

    def local_bytes(tensor: torch.Tensor) -> int:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return local.numel() * local.element_size()

    parameters = list(model.parameters())
    state = [value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)]
    return {
        "parameters": sum(local_bytes(p) for p in parameters),
        "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer": sum(local_bytes(value) for value in state),
    }
