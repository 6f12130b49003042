"""Training: `train` runs a recipe end to end, in three steps that read top to bottom: `start` (data, model,
optimizer and schedule, fresh or restored from a saved state: `vitlab.train.assemble`), `run_epochs` (each epoch:
`train_one_epoch`, then `end_epoch` validates, keeps the best checkpoint and saves the state) and `finish` (the test
split, once, and the run's outputs). What goes where in the run folder is `vitlab.runs`; the saved state and its
restore are `vitlab.train.state`; what the run prints is `vitlab.train.summary`.

Model selection uses the validation split only (carved from the training images unless the data set has an
official one); the test split is measured once at the end, for the final and for the best-validation model.
Only rank 0 writes. Every file is written atomically, so the last good checkpoint survives any crash.

Randomness is made resumable: the data order of epoch e comes from a generator seeded with (seed, e), the
augmentation generator's state and the global RNG state are saved in the checkpoint, so a resumed run
continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.formats import load_model
from vitlab.checkpoint.io import read_safetensors, save_model, save_state_dict
from vitlab.data.source import Batch, BatchSource
from vitlab.data.transforms import Draws
from vitlab.distributed import (
    DistEnv,
    any_rank,
    any_ranks,
    broadcast_object,
    cleanup,
    gather_lists,
    init_distributed,
    is_collective_timeout,
    replica_difference,
    sum_over_ranks,
    synchronize,
)
from vitlab.errors import CheckpointError, VitlabError
from vitlab.model_input import to_device
from vitlab.objectives.base import NonFiniteLoss, Objective, is_better
from vitlab.runs import BEST, BEST_OBJECTIVE, RunFolder
from vitlab.train.assemble import start
from vitlab.train.budget import fit_to_budget
from vitlab.train.clock import PeriodicSave, RunClock, StopFlag, seconds_since_launch
from vitlab.train.config import TrainConfig
from vitlab.train.elastic import (
    Fault,
    holds_state,
    restart_count,
    restarted,
    run_to_continue,
    shared_store_hazard,
)
from vitlab.train.figures import StepFigures, read_interval
from vitlab.train.schedule import peak_lr
from vitlab.train.session import Session
from vitlab.train.state import Position, read_resumable
from vitlab.train.step import TrainingStep
from vitlab.train.summary import EpochProgress, epoch_line, stop_line, unreadable_files, write_outputs
from vitlab.train.watchdog import Heartbeat


class TrainingError(VitlabError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


def train(
    config: TrainConfig, resume: str | Path | None = None, use_previous: bool = False, epochs: int | None = None
) -> dict[str, Any]:
    """Train a recipe (or resume a run folder) to the end; returns the summary (also written to the run).
    epochs: with `resume`, a new length for the run (e.g. to extend a finished one); the learning rate then
    follows the schedule of a run of that length from where the run stands."""
    launched = time.perf_counter() - seconds_since_launch()
    notes: list[str] = []
    state = None
    if resume is not None:
        state, config = read_resumable(Path(resume), use_previous, epochs, notes)
    env = init_distributed(config.collective_timeout_seconds())
    hazard = shared_store_hazard()
    if hazard is not None:
        notes.append(hazard)
    try:
        if resume is None:
            continued = continued_after_restart(config, env, notes)
            if isinstance(continued, dict):  # the run had finished: nothing to do again
                return continued
            if continued is not None:
                # A restart by torchrun's agent cannot ask: a damaged last state falls back to the one before it.
                resume = continued
                state, config = read_resumable(continued, True, epochs, notes)
        if state is not None:
            set_aside_damaged_state(state, Path(resume), env, notes)  # type: ignore[arg-type]
        for note in notes if env.is_main else []:
            print(f"note: {note}", flush=True)
        session = start(config, env, state, Path(resume) if resume is not None else None)
        session.launched = launched
        try:
            with Heartbeat(env, config.collective_timeout_seconds()) as session.heartbeat:
                try:
                    summary = run_epochs(session)
                    if summary is None:
                        summary = finish(session)
                except RuntimeError as error:  # read the ranks' reports while the heartbeat still has the store
                    if env.enabled and is_collective_timeout(error):
                        raise TrainingError(session.heartbeat.stuck_message()) from error
                    raise
        finally:  # streamed splits' worker processes go with the run, not whenever the objects are collected
            session.splits.close()
        # Leave together: rank 0 may still be writing (a stop's checkpoint, the final report) when the others
        # return, and a worker that tore down its process group and exited meanwhile was once seen to abort in
        # the teardown ("terminate called without an active exception", exit -6) after a SIGTERM stop.
        synchronize(env)
        return summary
    finally:
        cleanup(env)


def continued_after_restart(config: TrainConfig, env: DistEnv, notes: list[str]) -> Path | dict | None:
    """On an attempt restarted by torchrun's agent: the run folder to resume (the one this job's first attempt
    started), the run's summary where it had finished, or None. Where that attempt died before its first saved
    state, the run starts again in its folder. Decided by rank 0 for every rank: the agents of several machines
    count their restarts apart, and every rank must take the same way."""
    decision: tuple[str, str] | None = None
    if restarted(env):
        run = run_to_continue(config) if env.is_main else None
        if run is not None:
            summary = run.summary() or {}
            if summary.get("status") == "finished":
                decision = ("finished", str(run.path))
            elif holds_state(run):
                decision = ("resume", str(run.path))
            else:
                decision = ("again", str(run.path))
        decision = broadcast_object(decision, env)
    if decision is None:
        return None
    kind, path = decision
    run = RunFolder(path)
    if kind == "finished":
        if env.is_main:
            print(f"note: restart {restart_count()} of this torchrun job: {run} had finished; nothing to do again")
        return {"status": "finished", "run_dir": path, "restarted": True}
    if kind == "resume":
        notes.append(f"restart of this torchrun job: resuming {run} from its last saved state")
        return run.path
    config.out_dir, config.run_name = str(run.path.parent), run.path.name
    notes.append(f"restart of this torchrun job: {run} had saved no state yet; starting it again")
    return None


def set_aside_damaged_state(state: dict[str, Any], run_dir: Path, env: DistEnv, notes: list[str]) -> None:
    """Where the run resumes from previous.pt because last.pt is damaged (--use-previous, or a restart), rank 0
    renames last.pt to last.damaged.pt once every rank has read its state: the next save would otherwise turn it
    into previous.pt, over the good state the run fell back to."""
    if state.get("_loaded_from") != "previous.pt":
        return
    synchronize(env)
    damaged = RunFolder(run_dir).checkpoints / "last.pt"
    if env.is_main and damaged.exists():
        os.replace(damaged, damaged.with_name("last.damaged.pt"))
        notes.append(f"the damaged state is kept as {damaged.with_name('last.damaged.pt')}")


def resume(run_dir: str | Path, use_previous: bool = False, epochs: int | None = None) -> dict[str, Any]:
    """Continue a stopped run exactly where it stopped (with `epochs`, at a new length); see `train`."""
    return train(TrainConfig(), resume=run_dir, use_previous=use_previous, epochs=epochs)


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
    unreadable: Any = None,
    guards: Safeguards | None = None,
) -> bool:
    """Run the rest of one epoch from `position` (the batches must start at its step); returns False if a stop was
    requested (the position is then consistent and can be saved). `step` holds the model, optimizer, schedule and
    EMA; `objective` turns each batch, moved to the step's device, into inputs and targets there.

    The host reads the device every `guards.read_every` steps (and at the epoch's end, and where a save by steps is
    due), never between: then the steps' figures are added to the epoch's and checked, `on_step(position, epoch
    sums, images per second)` reports progress, `unreadable` (a streamed training source whose limit of unreadable
    files is decided here on every rank's sum, under DDP) is counted, and a stop or a save within the epoch is
    agreed by every rank. Reading once per step (the CPU) checks each loss before its update. A non-finite loss
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
    unreadable_synced = 0  # this rank's unreadable files already counted in a union (below)
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
            if unreadable is not None and sum_over_ranks(len(unreadable.skipped) - unreadable_synced, env):
                # Some rank met a new unreadable file (rare): every rank takes the union of the ranks' lists (a
                # stand-in read for a bad file may be read by two ranks) and decides on its size, together.
                union = gather_lists(unreadable.skipped, env)
                unreadable_synced = len(unreadable.skipped)
                unreadable.refuse_if_too_many(len(union))
        guards.heartbeat.at("after its step", position.global_step)
        if guards.fault is not None:
            guards.fault.maybe_fire(env.rank, position.global_step, guards.run, guards.heartbeat.report)
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


@dataclass
class Safeguards:
    """What keeps a long run safe between its steps: the heartbeat a hung rank is found by, the saves within an
    epoch (`save_every`: `save` writes the state where `saving` says), the fault tests' injected fault, and how
    often the host reads the device (`read_every` steps: the figures' check, the stop and the saves are then)."""

    heartbeat: Heartbeat = field(default_factory=lambda: Heartbeat(DistEnv()))
    saving: PeriodicSave = field(default_factory=lambda: PeriodicSave(None))
    save: Callable[[], None] = lambda: None
    fault: Fault | None = None
    run: Any = None  # the run folder (the fault that damages its state)
    read_every: int = 1


def run_epochs(session: Session) -> dict[str, Any] | None:
    """The remaining epochs: train, validate, choose the best, save, report. Returns the 'interrupted' summary
    when a stop was asked for (state saved), None when every epoch ran."""
    config, env, position, steps = session.config, session.env, session.position, session.steps_per_epoch
    clock = RunClock(position.elapsed_seconds, position.global_step, config.epochs * steps)

    def save_within_epoch() -> None:
        position.elapsed_seconds = clock.elapsed()
        session.save_state()

    guards = Safeguards(
        session.heartbeat,
        session.saving,
        save_within_epoch,
        Fault.from_environment(),
        session.run,
        read_interval(config.sync_every, env.device),
    )
    with StopFlag() as stop:
        for epoch in range(position.epoch, config.epochs):
            if epoch >= config.epochs:  # shortened to fit the budget
                break
            progress = EpochProgress(session, epoch, clock)
            epoch_started = time.perf_counter()
            seconds_before = position.train_seconds
            epoch_seed = config.seed * 1_000_003 + epoch
            batches = session.splits.train.training_batches(
                epoch_seed, config.batch_size, position.step_in_epoch, env.rank, env.world_size
            )
            # Under DDP a streamed source's limit of unreadable files is decided on every rank's sum, each step.
            unreadable = (
                session.splits.train if env.enabled and hasattr(session.splits.train, "limit_by_caller") else None
            )
            if unreadable is not None:
                unreadable.limit_by_caller = True
            try:
                finished = train_one_epoch(
                    session.step,
                    session.objective,
                    batches,
                    steps,
                    env,
                    position,
                    epoch_seed,
                    stop,
                    progress,
                    unreadable,
                    guards,
                )
            except NonFiniteLoss as error:
                raise TrainingError(
                    f"the loss became {error.value} at epoch {error.epoch}, step {error.step}; the last good "
                    f"checkpoint is kept. Lower the learning rate (--set lr={config.lr / 3:.2g})"
                    + (
                        ", or train in fp32 (--set precision=fp32; bf16 autocast is on)"
                        if session.precision.value == "bf16"
                        else ""
                    )
                ) from None
            progress.close()
            if not finished:
                position.elapsed_seconds = clock.elapsed()
                session.save_state()
                return stopped(
                    session, f"at epoch {epoch + 1}, step {position.step_in_epoch}", epoch, position.step_in_epoch, stop
                )
            row, improved = end_epoch(session, epoch, epoch_started, seconds_before, clock)
            session.epoch_timings.append((row["epoch_seconds"], row["images_per_second"]))
            fit_to_budget(session, clock)
            if env.is_main:
                every = max(1, config.epochs // 25)
                if config.progress and ((epoch + 1) % every == 0 or improved or epoch + 1 == config.epochs):
                    print(
                        epoch_line(
                            row, config.epochs, clock.remaining(position.global_step), improved, session.objective
                        ),
                        flush=True,
                    )
            if any_rank(stop.requested, env) and epoch + 1 < config.epochs:
                return stopped(session, f"after epoch {epoch + 1}", epoch + 1, 0, stop)
    session.elapsed_seconds = clock.elapsed()
    return None


def stopped(session: Session, where: str, epoch: int, step: int, stop: StopFlag) -> dict[str, Any]:
    """The 'interrupted' summary of a run stopped (its state saved) at `epoch`, `step`; rank 0 says how to resume."""
    if session.env.is_main:
        print(stop_line(where, session.objective, session.run))
    return {"status": "interrupted", "run_dir": str(session.run), "epoch": epoch, "step": step, "signal": stop.signal}


def end_epoch(
    session: Session, epoch: int, epoch_started: float, seconds_before: float, clock: RunClock
) -> tuple[dict[str, Any], bool]:
    """Validate (and test, if asked to show it), record the epoch's row, keep the best checkpoint by the
    objective's validation figure, save the training state. Returns the row and whether it is the best so far."""
    config, env, position, splits = session.config, session.env, session.position, session.splits
    objective = session.objective
    if session.ema is not None:
        session.ema.copy_to(session.eval_model)
    row = dict(
        epoch=epoch + 1,
        step=position.global_step,
        lr=peak_lr(session.scheduler),
        **objective.epoch_figures(position.epoch_sums),
    )
    validation = None
    session.heartbeat.at("validation")
    if splits.validation is not None:
        validation = objective.evaluate(
            session.evaluated, splits.validation, config.evaluation_batch(env.world_size), env, session.precision.value
        )
        row.update({f"val_{name}": value for name, value in objective.row_figures(validation).items()})
    if config.test_every_epoch:  # shown to the user; nothing below reads it
        test = objective.evaluate(
            session.evaluated, splits.test, config.evaluation_batch(env.world_size), env, session.precision.value
        )
        row.update({f"test_{name}": value for name, value in objective.row_figures(test).items()})
    skipped = gather_lists(unreadable_files(splits), env)  # every rank's share
    if skipped:
        row["skipped_files"] = len(skipped)
    position.elapsed_seconds = clock.elapsed()
    count = objective.sums_count(position.epoch_sums)
    row.update(
        images_per_second=count / max(position.train_seconds - seconds_before, 1e-9),
        epoch_seconds=time.perf_counter() - epoch_started,
        elapsed_seconds=position.elapsed_seconds,
    )
    session.history.append(row)
    position.epoch, position.step_in_epoch = epoch + 1, 0
    position.epoch_sums = objective.empty_sums()
    improved = validation is not None and is_better(
        objective, validation[objective.selection], position.best_value if position.best_epoch > 0 else None
    )
    if improved:
        position.best_value, position.best_epoch = validation[objective.selection], epoch + 1
        position.best_elapsed_seconds = position.elapsed_seconds
    if env.is_main:
        session.run.append_metrics(row)
        if session.writer is not None:
            for key, value in row.items():
                if key not in ("epoch", "step"):
                    session.writer.add_scalar(key, value, epoch + 1)
        if improved:
            best = session.run / BEST
            try:
                save_model(session.evaluated, best, checksum=True)
                extra = objective.extra_state()
                if extra:  # the objective's own parameters of the best epoch (a decoder), for its test figures
                    save_state_dict(extra, session.run / BEST_OBJECTIVE, checksum=True)
            except OSError as error:
                raise CheckpointError(
                    f"could not save {best} ({error.strerror or error}); the previous best is intact"
                ) from None
        objective.after_epoch(session.evaluated, epoch + 1, session.run.path, splits.validation)
    session.heartbeat.at("saving state")
    session.save_state()
    return row, improved


def finish(session: Session) -> dict[str, Any]:
    """The end of a run: the test split measured once (final model and best-validation checkpoint), the final
    model, pictures and summaries written."""
    env = session.env
    # Training is over: its streaming workers go before the test split's start (the run's memory peaked with the
    # training, validation and test workers all alive at the end; issue 38).
    session.splits.train.close()
    session.unreadable = gather_lists(unreadable_files(session.splits), env)  # every rank's, for the summary
    results = final_results(session, session.run / BEST)
    replica_diff = replica_difference(session.model, env)
    summary = {"status": "finished", "run_dir": str(session.run), "replica_max_abs_diff": replica_diff}
    if env.is_main:
        summary = write_outputs(session, results, replica_diff)
        if session.writer is not None:
            session.writer.close()
    return summary


def final_results(session: Session, best_path: Path) -> dict[str, Any]:
    """The figures measured once at the end: test (and validation) figures of the final model, and test figures
    of the best-validation checkpoint (the same model when the best epoch is the last)."""
    config, env, splits, position = session.config, session.env, session.splits, session.position
    final_model = session.evaluated

    def measure(model: nn.Module, data: BatchSource) -> dict[str, Any]:
        return session.objective.evaluate(
            model, data, config.evaluation_batch(env.world_size), env, session.precision.value
        )

    results: dict[str, Any] = {"test": measure(final_model, splits.test), "val": None, "best_test": None}
    if splits.validation is not None:
        results["val"] = measure(final_model, splits.validation)
    if position.best_epoch == config.epochs:
        results["best_test"] = results["test"]
    elif position.best_epoch > 0:
        best = load_model(best_path).to(next(final_model.parameters()).device)
        final_extra = {name: value.detach().clone() for name, value in session.objective.extra_state().items()}
        extra_path = session.run / BEST_OBJECTIVE
        if final_extra and extra_path.is_file():  # the best epoch's decoder with its encoder, then the final's back
            session.objective.load_extra_state(read_safetensors(extra_path)[0])
        results["best_test"] = measure(best, splits.test)
        if final_extra:
            session.objective.load_extra_state(final_extra)
    return results
