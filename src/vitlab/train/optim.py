"""The optimizer (parameter groups: weight decay, layer-wise rate decay) and the weights' moving average (EMA);
the learning-rate schedule is `vitlab.train.schedule`."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from vitlab.models.vit import EMBEDDING_PARAMETERS, block_index, encoder_parameter_name


def layer_id(name: str, depth: int) -> int:
    """Depth of a parameter for layer-wise lr decay: 0 for the embeddings, l + 1 for block l, depth + 1 after."""
    if encoder_parameter_name(name).startswith(EMBEDDING_PARAMETERS):
        return 0
    block = block_index(name)
    return depth + 1 if block is None else block + 1


def param_groups(
    model: nn.Module,
    weight_decay: float,
    lr: float = 1.0,
    layer_decay: float = 1.0,
    lr_scales: Mapping[str, float] | None = None,
) -> list[dict]:
    """Parameter groups: weight decay on the weight matrices, none on norms, biases, position embedding and
    class token (1-D tensors and the names the model lists in `no_weight_decay`); with layer_decay < 1 each
    depth gets lr * layer_decay^(depth + 1 - id), so early layers move least (BEiT-style fine-tuning).
    lr_scales: a further factor by parameter name (an objective's, e.g. a fine-tuned encoder's lower rate than its
    new head's; `Objective.learning_rate_scales`), 1 where not named.
    Frozen parameters (requires_grad False) are left out."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    depth = len(getattr(model, "blocks", []))
    lr_scales = lr_scales or {}
    groups: dict[tuple[int, bool, float], dict] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        decays = not (parameter.ndim <= 1 or name in skip or name.split(".")[-1] in skip)
        depth_id = layer_id(name, depth) if layer_decay < 1 else depth + 1
        scale = lr_scales.get(name, 1.0)
        group = groups.setdefault(
            (depth_id, decays, scale),
            {
                "params": [],
                "weight_decay": weight_decay if decays else 0.0,
                "lr": lr * layer_decay ** (depth + 1 - depth_id) * scale,
            },
        )
        group["params"].append(parameter)
    return [groups[key] for key in sorted(groups, key=lambda k: (k[0], not k[1], k[2]))]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    momentum: float = 0.9,
    layer_decay: float = 1.0,
    betas: tuple[float, float] | list[float] = (0.9, 0.999),
    lr_scales: Mapping[str, float] | None = None,
) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay, lr, layer_decay, lr_scales)
    # The fused kernels update every tensor in one pass (CPU and CUDA); on the CPU PyTorch otherwise loops over
    # the tensors one by one. Devices without fused kernels fall back to the default implementation.
    if name == "sgd":
        optimizer_class, options = torch.optim.SGD, dict(lr=lr, momentum=momentum)
    else:
        optimizer_class, options = torch.optim.AdamW, dict(lr=lr, betas=tuple(betas))
    if name == "sgd" and sharded(model):
        # DTensor shards (FSDP2) have a fused AdamW but no fused SGD in torch 2.13: aten._fused_sgd_ has no sharding
        # strategy, and the first step would fail.
        return optimizer_class(groups, **options)
    try:
        return optimizer_class(groups, fused=True, **options)
    except (RuntimeError, TypeError):
        return optimizer_class(groups, **options)


def sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are DTensor shards (FSDP2: `vitlab.train.fsdp`)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


class EMA:
    """Exponential moving average of a model's floating-point state: ema = decay * ema + (1 - decay) * weights."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, value in model.state_dict().items():
            if name in self.state:
                self.state[name].lerp_(value.detach(), 1 - self.decay)

    def copy_to(self, model: nn.Module) -> None:
        model.load_state_dict({**model.state_dict(), **self.state})
