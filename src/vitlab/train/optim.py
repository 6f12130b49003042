"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from vitlab.models.vit import EMBEDDING_PARAMETERS, block_index


def layer_id(name: str, depth: int) -> int:
    """Depth of a parameter for layer-wise lr decay: 0 for the embeddings, l + 1 for block l, depth + 1 after."""
    if name.startswith(EMBEDDING_PARAMETERS):
        return 0
    block = block_index(name)
    return depth + 1 if block is None else block + 1


def param_groups(model: nn.Module, weight_decay: float, lr: float = 1.0, layer_decay: float = 1.0) -> list[dict]:
    """Parameter groups: weight decay on the weight matrices, none on norms, biases, position embedding and
    class token (1-D tensors and the names the model lists in `no_weight_decay`); with layer_decay < 1 each
    depth gets lr * layer_decay^(depth + 1 - id), so early layers move least (BEiT-style fine-tuning).
    Frozen parameters (requires_grad False) are left out."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    depth = len(getattr(model, "blocks", []))
    groups: dict[tuple[int, bool], dict] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        decays = not (parameter.ndim <= 1 or name in skip or name.split(".")[-1] in skip)
        depth_id = layer_id(name, depth) if layer_decay < 1 else depth + 1
        group = groups.setdefault((depth_id, decays), {
            "params": [], "weight_decay": weight_decay if decays else 0.0,
            "lr": lr * layer_decay ** (depth + 1 - depth_id)})
        group["params"].append(parameter)
    return [groups[key] for key in sorted(groups, key=lambda k: (k[0], not k[1]))]


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, momentum: float = 0.9,
                    layer_decay: float = 1.0, betas: tuple[float, float] | list[float] = (0.9, 0.999)
                    ) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay, lr, layer_decay)
    # The fused kernels update every tensor in one pass (CPU and CUDA); on the CPU PyTorch otherwise loops over
    # the tensors one by one. Devices without fused kernels fall back to the default implementation.
    if name == "sgd":
        optimizer_class, options = torch.optim.SGD, dict(lr=lr, momentum=momentum)
    else:
        optimizer_class, options = torch.optim.AdamW, dict(lr=lr, betas=tuple(betas))
    try:
        return optimizer_class(groups, fused=True, **options)
    except (RuntimeError, TypeError):
        return optimizer_class(groups, **options)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear from 1/warmup to 1 over the warm-up, then a cosine down to min_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio))


def set_schedule_length(optimizer: torch.optim.Optimizer, scheduler, warmup_steps: int, total_steps: int,
                        min_ratio: float) -> None:
    """Refit a `build_scheduler` schedule to a new total length from the step it stands at: the cosine now ends
    at `total_steps`, and the rate of the next step follows the new curve (a run extended on resume, or shortened
    to fit a time budget)."""
    scheduler.lr_lambdas = [lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio)
                            for _ in optimizer.param_groups]
    follow_schedule(optimizer, scheduler)


def follow_schedule(optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Set every group's rate to what the scheduler's curve gives at the step it stands at."""
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def peak_lr(scheduler) -> float:
    """The learning rate to report: the largest of the groups', i.e. the head's (with layer-wise decay group 0,
    the embeddings, runs at lr * decay^(L + 1), which says little about the schedule)."""
    return max(scheduler.get_last_lr())


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
