"""The learning-rate schedule: a linear warm-up then a cosine decay (`warmup_cosine`), refitted to a new length
from the step a run stands at (`set_schedule_length`: an extended or budget-shortened run), and the one rule for a
warm-up too long for its run (`fitted_warmup_steps`), which a fresh start and a budget refit both follow."""

from __future__ import annotations

import math

import torch

from vitlab.train.config import TrainConfig

FEW_STEPS_PER_EPOCH = 10  # below this an epoch is a handful of updates: the recipe's epoch counts assume more
MIN_TOTAL_STEPS = 100  # a ViT from scratch barely leaves chance level in fewer optimizer steps


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear from 1/warmup to 1 over the warm-up, then a cosine down to min_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """A per-step scheduler following `warmup_cosine` (min_ratio: the last rate over the peak one)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio)
    )


def set_schedule_length(
    optimizer: torch.optim.Optimizer, scheduler, warmup_steps: int, total_steps: int, min_ratio: float
) -> None:
    """Refit a `build_scheduler` schedule to a new total length from the step it stands at: the cosine now ends
    at `total_steps`, and the rate of the next step follows the new curve (a run extended on resume, or shortened
    to fit a time budget)."""
    scheduler.lr_lambdas = [
        lambda step: warmup_cosine(step, warmup_steps, total_steps, min_ratio) for _ in optimizer.param_groups
    ]
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


def fitted_warmup_steps(warmup_steps: int, total_steps: int) -> int:
    """The warm-up a run of `total_steps` optimizer steps gets: the recipe's `warmup_steps`, unless they are more
    than half the run; then a fifth of the run (at least one step), so that the rate reaches its peak early and
    most of the run decays from it. A fresh start (`fit_schedule`) and a run shortened to fit its budget
    (`vitlab.train.budget.fit_to_budget`) both take it, so a fitted run follows the schedule a fresh run of that
    length would. (The budget once capped the warm-up at half the run instead; the fifth is the rule a fresh
    start announced in its note and its tests pin.) Neither shipped digits nor MNIST recipe meets it: digits warms
    up 5 of 150 epochs with no budget; MNIST warms up 1 of 24 epochs, so its budget meets it only when it cuts the
    run to the single epoch already trained, after which no step follows."""
    if total_steps > 1 and warmup_steps > total_steps / 2:
        return max(1, round(total_steps / 5))
    return warmup_steps


def suggested_batch_size(train_images: int) -> int:
    """The batch size vitlab advises for a small training set: a power of two giving about FEW_STEPS_PER_EPOCH
    steps an epoch, at least 8 where there are 8 images. The one figure every message suggests, so following one
    piece of advice never draws another."""
    wanted = max(8, 2 ** int(math.log2(max(1, train_images // FEW_STEPS_PER_EPOCH))))
    return min(wanted, 2 ** int(math.log2(max(1, train_images))))


def fit_schedule(config: TrainConfig, train_images: int, steps_per_epoch: int) -> tuple[int, list[str]]:
    """(warm-up steps, notes for the user). A warm-up longer than half the run is shortened
    (`fitted_warmup_steps`); a run of few steps per epoch or few steps in all is named."""
    total = config.epochs * steps_per_epoch
    warmup = round(config.warmup_epochs * steps_per_epoch)
    notes = []
    shortened = fitted_warmup_steps(warmup, total)
    if shortened != warmup:
        notes.append(
            f"the {config.warmup_epochs:g}-epoch warm-up is {'longer than' if warmup >= total else 'most of'} "
            f"this {config.epochs}-epoch run, so the learning rate would {'never reach' if warmup >= total else 'barely reach'} "
            f"its peak; it is shortened to {shortened} step{'s' if shortened != 1 else ''} "
            f"({shortened / steps_per_epoch:.2g} epochs)"
        )
    dropped = train_images - steps_per_epoch * config.batch_size
    if steps_per_epoch < FEW_STEPS_PER_EPOCH or total < MIN_TOTAL_STEPS:
        suggestion = suggested_batch_size(train_images)
        notes.append(
            f"{train_images} training images at batch {config.batch_size} make {steps_per_epoch} optimizer "
            f"step(s) per epoch, {total} in all"
            + (f", and {dropped} images are left out of each epoch" if dropped else "")
            + f"; a ViT needs far more steps to learn: use a smaller batch (--set batch_size={suggestion}) "
            "or more epochs"
            if suggestion < config.batch_size
            else f"{train_images} training images at batch {config.batch_size} make {total} optimizer steps in "
            "all; a ViT needs far more to learn: train for more epochs"
        )
    return shortened, notes
