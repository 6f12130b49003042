"""One optimisation step, the same for `vitlab train`, `vitlab bench --train` and benchmarks/profile_train_step.py:
forward and loss per micro-batch (gradients accumulated, synchronised across DDP ranks on the last one only),
the figures summed over ranks, a non-finite loss refused before the update, gradient clipping, the optimizer,
the schedule and the EMA, with the objective's hooks on either side of the update (`before_update`,
`after_update`).

Nothing in the step waits for the device unless asked to: its figures stay there, summed over ranks by a
collective on the device, and `check_finite` (on by default) is the one read on the host. The training loop
turns it off on an accelerator and reads the figures of several steps at once (`vitlab.train.epoch`), since each
read there stalls the host until the device has finished every kernel queued before it."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.eval.batches import call_model
from vitlab.model_input import ModelInput, to_device
from vitlab.objectives.base import NonFiniteLoss, Objective


@dataclass
class TrainingStep:
    wrapped: nn.Module  # what runs forward and backward: the model, or its DDP / torch.compile wrapper
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: Any = None  # stepped once per optimizer step
    ema: Any = None  # vitlab.train.optim.EMA, updated from `model` after each step
    model: nn.Module | None = None  # the module inside `wrapped` (default: `wrapped`)
    env: DistEnv = field(default_factory=DistEnv)
    grad_accum: int = 1
    grad_clip: float = 0.0  # clip the gradient norm to this (0: off)
    precision: str = "fp32"  # "bf16": forward under bf16 autocast on the step's device
    # Read the loss on the host and refuse a non-finite one before the update. False: the caller reads the returned
    # figures later (`vitlab.train.figures`), and a non-finite step has been applied by then.
    check_finite: bool = True
    forward: Callable[[nn.Module, ModelInput], torch.Tensor] = call_model  # e.g. to unwrap another library's output
    last_outputs: torch.Tensor | None = None  # the last micro-batch's outputs, detached (bench compares them)

    def __call__(self, inputs: ModelInput, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """One update on a batch of images (B, C, H, W) or cut patches (a PatchInput); returns [loss sum,
        *objective.sum_names, count] (float64 on the step's device, summed over ranks). With `check_finite`, raises
        NonFiniteLoss, without updating, when the loss is not finite on any rank."""
        device = self.env.device
        inputs = inputs.to(device)
        targets = {name: value.to(device) for name, value in targets.items()}
        chunks = [inputs.chunk(self.grad_accum)] + [value.chunk(self.grad_accum) for value in targets.values()]
        bf16 = self.precision == "bf16"
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        extra_sums = None
        for micro, (x, *parts) in enumerate(zip(*chunks)):
            last_micro = micro == self.grad_accum - 1
            with gradient_sync(self.wrapped, last_micro or not self.env.enabled):
                with autocast:
                    outputs = self.forward(self.wrapped, x)
                loss, extras = self.objective.loss(outputs, dict(zip(targets, parts)))
                loss = loss / self.grad_accum
                loss.backward()
            loss_sum += loss.detach().double() * len(x)
            extras = to_device(extras.detach(), device)
            extra_sums = extras if extra_sums is None else extra_sums + extras
            self.last_outputs = outputs.detach() if isinstance(outputs, torch.Tensor) else None
        count = torch.full((1,), float(len(inputs)), dtype=torch.float64, device=device)  # made there: no copy
        sums = torch.cat([(loss_sum * self.grad_accum).reshape(1), extra_sums, count])
        all_reduce_sum(sums, self.env)
        if self.check_finite and not math.isfinite(sums[0].item()):
            raise NonFiniteLoss(sums[0].item())
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.wrapped.parameters(), self.grad_clip)
        self.objective.before_update()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model if self.model is not None else self.wrapped)
        self.objective.after_update(self.env)
        return sums


def gradient_sync(wrapped: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """The context of a micro-batch's backward: gradients averaged over the processes when `sync` (the last
    micro-batch), else kept local (accumulated; DDP's `no_sync`, FSDP2's `set_requires_gradient_sync`)."""
    if hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2: a switch, set before every micro-batch
        wrapped.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if sync else wrapped.no_sync()
