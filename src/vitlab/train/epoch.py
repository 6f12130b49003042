"""One epoch of training, as MAE's and DeiT's `train_one_epoch`: the steps, with the host reading the device
every few steps (the figures' check, progress, a stop or a save agreed by every rank). `vitlab.train.loop` runs
the epochs around it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from vitlab.data.source import Batch, Splits
from vitlab.data.transforms import Draws
from vitlab.distributed import DistEnv, any_ranks, gather_lists, sum_over_ranks
from vitlab.model_input import to_device
from vitlab.objectives.base import NonFiniteLoss, Objective
from vitlab.train import hooks
from vitlab.train.clock import PeriodicSave, StopFlag
from vitlab.train.figures import StepFigures
from vitlab.train.state import Position
from vitlab.train.step import TrainingStep
from vitlab.train.summary import unreadable_files
from vitlab.train.watchdog import Heartbeat


@dataclass
class Safeguards:
    """What keeps a long run safe between its steps: the heartbeat a hung rank is found by, the saves within an
    epoch (`save_every`: `save` writes the state where `saving` says), the run folder (for the test hook after
    each step, `vitlab.train.hooks`), and how often the host reads the device (`read_every` steps: the figures'
    check, the stop and the saves are then)."""

    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(DistEnv()))
    saving: PeriodicSave = field(default_factory=lambda: PeriodicSave(None))
    save: Callable[[], None] = lambda: None
    run: Any = None  # the run folder
    read_every: int = 1


def train_one_epoch(
    step: TrainingStep,
    objective: Objective,
    batches: Iterable[Batch],
    steps_per_epoch: int,
    env: DistEnv,
    position: Position,
    epoch_seed: int,
    stop: StopFlag | None = None,
    on_step: Callable[[Position, list[float], float], None] | None = None,
    unreadable: UnreadableCount | None = None,
    guards: Safeguards | None = None,
) -> bool:
    """Run the rest of one epoch from `position` (the batches must start at its step); returns False if a stop was
    requested (the position is then consistent and can be saved). `step` holds the model, optimizer, schedule and
    EMA; `objective` turns each batch, moved to the step's device, into inputs and targets there.

    The host reads the device every `guards.read_every` steps (and at the epoch's end, and where a save by steps is
    due), never between: then the steps' figures are added to the epoch's and checked, `on_step(position, epoch
    sums, images per second)` reports progress, `unreadable` (the data set's unreadable files, whose limit is
    decided here on every rank's, under DDP) is counted, and a stop or a save within the epoch is agreed by every
    rank. Reading once per step (the CPU) checks each loss before its update. A non-finite loss
    raises NonFiniteLoss with `epoch` and `step` set; nothing has been saved after it."""
    augment_rng = torch.Generator()
    if position.augment_state is not None:
        augment_rng.set_state(position.augment_state)
    else:
        augment_rng.manual_seed(epoch_seed + 1)
    spec = (step.model or step.wrapped).config
    step.wrapped.train()
    guards = guards or Safeguards()
    figures = StepFigures(position.epoch_sums)
    step.check_finite = guards.read_every == 1  # read after every step: refuse a non-finite loss before its update
    unreadable = unreadable or UnreadableCount(None, env)
    images_since_read, seconds_since_read = 0, 0.0
    guards.heartbeat.at("loading data", position.global_step)
    for index, batch in enumerate(batches, start=position.step_in_epoch):
        guards.heartbeat.at("training step")
        started = time.perf_counter()
        batch = on_device(batch, env.device)
        inputs, targets = objective.training_inputs(batch, spec, Draws(augment_rng, batch.global_size, batch.shard))
        try:
            figures.add(step(inputs, targets))
        except NonFiniteLoss as error:
            error.epoch, error.step = position.epoch + 1, index + 1
            raise
        seconds = time.perf_counter() - started
        position.step_in_epoch = index + 1
        position.global_step += 1
        position.train_seconds += seconds
        images_since_read += len(batch) * env.world_size
        seconds_since_read += seconds
        reads = (
            (index + 1) % guards.read_every == 0
            or index + 1 == steps_per_epoch
            or guards.saving.at_step(position.global_step)
        )
        if reads:
            waited = time.perf_counter()
            read_figures(figures, position)
            waited = time.perf_counter() - waited  # the device finishing the steps queued since the last read
            position.train_seconds += waited
            if on_step is not None:
                on_step(position, position.epoch_sums, images_since_read / (seconds_since_read + waited))
            images_since_read, seconds_since_read = 0, 0.0
            unreadable.check()
        guards.heartbeat.at("after its step", position.global_step)
        hooks.after_step(hooks.AfterStep(env.rank, position.global_step, guards.run, guards.heartbeat.report))
        if not reads:
            guards.heartbeat.at("loading data")
            continue
        stop_now, save_now = any_ranks(
            [stop is not None and stop.requested, guards.saving.due(position.global_step)], env
        )
        if index + 1 < steps_per_epoch and (stop_now or save_now):  # the epoch's end saves anyway
            position.augment_state = augment_rng.get_state()
            if stop_now:
                return False
            guards.heartbeat.at("saving state")
            guards.save()
        guards.heartbeat.at("loading data")
    if figures.pending:  # a source that gave fewer batches than the epoch's steps
        read_figures(figures, position)
    position.augment_state = None
    return True


@dataclass
class UnreadableCount:
    """The unreadable files a run has met in its data set, every split's (a streamed split meets them as it is
    read), limited over the data set's files (`Splits.refuse_if_damaged`) and under DDP decided on every rank's
    together. `splits`: the run's (None: nothing to decide); `name`: the data set, as the message calls it;
    `earlier`: those the run met before it was resumed (every rank's)."""

    splits: Splits | None
    env: DistEnv
    name: str = "the data"
    earlier: list[str] = field(default_factory=list)
    synced: int = 0  # this rank's unreadable files already counted in a union

    def check(self) -> None:
        """Call on every rank at once: stops (DataError) every rank alike when the data set is damaged."""
        if self.splits is None:
            return
        met = unreadable_files(self.splits)
        if not sum_over_ranks(len(met) - self.synced, self.env):
            return
        # Some rank met a new unreadable file (rare): every rank takes the union of the ranks' lists (a stand-in
        # read for a bad file may be read by two ranks) and decides on its size, together.
        union = gather_lists(met, self.env)
        self.synced = len(met)
        self.splits.refuse_if_damaged(list(dict.fromkeys([*self.earlier, *union])), self.name)


def read_figures(figures: StepFigures, position: Position) -> None:
    """The epoch's sums read up to `position`'s step; a non-finite loss among the steps read raises NonFiniteLoss
    with the epoch and step where it happened."""
    try:
        position.epoch_sums = figures.read()
    except NonFiniteLoss as error:
        error.epoch, error.step = position.epoch + 1, position.step_in_epoch - error.steps_after
        raise


def on_device(batch: Batch, device: torch.device) -> Batch:
    """The batch's pixels and labels on `device`, where the objective prepares and augments them; the copies do not
    wait for the device (`vitlab.model_input.to_device`)."""
    if device.type == "cpu":
        return batch
    labels = to_device(batch.labels, device) if batch.labels is not None else None
    return dataclasses.replace(batch, images=to_device(batch.images, device), labels=labels)
