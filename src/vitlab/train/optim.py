"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weight decay on the weight matrices; none on norms, biases, position embedding and class
    token (1-D tensors and the names the model lists in `no_weight_decay`)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if parameter.ndim <= 1 or name in skip or name.split(".")[-1] in skip:
            no_decay.append(parameter)
        else:
            decay.append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999))


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear from 1/warmup to 1 over the warm-up, then a cosine down to min_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio))


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
