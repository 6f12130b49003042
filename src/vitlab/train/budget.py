"""A run fitted to its wall-time budget (`--set budget=20m`): after each epoch, the number of epochs that still fit,
and the schedule refitted to end at the last of them."""

from __future__ import annotations

import math
import time

from vitlab.distributed import broadcast_object
from vitlab.train.clock import RunClock
from vitlab.train.config import budget_seconds
from vitlab.train.schedule import fitted_warmup_steps, set_schedule_length
from vitlab.train.session import Session
from vitlab.train.summary import say_note


def fit_to_budget(session: Session, clock: RunClock) -> None:
    """With a wall-time budget (`--set budget=20m`): after each epoch, fit the run's length to what is left of the
    budget, from the measured time of this sitting's recent epochs (steps, validation and saves; the first epoch,
    which pays one-time costs, only while it is the only one) and the time the test measurements at the end take.
    The cosine schedule is refitted to end at the new last epoch, its warm-up as a fresh run of that length would
    have it (`fitted_warmup_steps`). The run never grows beyond the recipe's epochs: they are its plan, the budget
    a ceiling. Rank 0 decides for every process."""
    config, position, env = session.config, session.position, session.env
    budget = budget_seconds(config.budget)
    planned = session.budget_planned_epochs or config.epochs
    if budget is None or position.epoch >= config.epochs:
        return
    measured = session.epoch_timings
    recent = measured[1:][-3:] or measured
    epoch_seconds = sum(seconds for seconds, _ in recent) / len(recent)
    images_per_second = sum(rate for _, rate in recent) / len(recent)
    used = clock.elapsed_before + time.perf_counter() - session.launched
    # The final test of the final and best models, and the validation of the final one, at about three times the
    # training rate (a forward pass without backward), plus the saves.
    held_out = 2 * len(session.splits.test) + (len(session.splits.validation) if session.splits.validation else 0)
    final_seconds = held_out / max(3 * images_per_second, 1e-9) + 5.0
    margin = 0.02 * budget  # a noisy machine's epochs vary by a few per cent
    fitting = math.floor((budget - margin - used - final_seconds) / max(epoch_seconds, 1e-9))
    epochs = max(position.epoch, min(planned, position.epoch + fitting))
    # Epochs vary by a few per cent: grow back only by a clear step, so the schedule does not flutter.
    if config.epochs < epochs < config.epochs + max(1, round(0.05 * planned)):
        epochs = config.epochs
    epochs = broadcast_object(epochs, env)
    if epochs == config.epochs:
        return
    session.budget_planned_epochs = planned
    config.epochs = epochs
    total_steps = epochs * session.steps_per_epoch
    clock.total_steps = total_steps  # the progress line's "run ... left" counts to the new end
    warmup_steps = fitted_warmup_steps(round(config.warmup_epochs * session.steps_per_epoch), total_steps)
    set_schedule_length(session.optimizer, session.scheduler, warmup_steps, total_steps, config.min_lr / config.lr)
    session.budget_note = (
        f"{config.budget}: {epochs} of the recipe's {planned} epochs fit ({epoch_seconds:.1f} s "
        f"an epoch here); the cosine schedule was refitted to end at epoch {epochs}"
    )
    if env.is_main:
        session.run.write_recipe(config.to_dict())
    say_note(f"budget {session.budget_note}", env)
