"""Training: `train` runs a recipe end to end, in three steps that read top to bottom: `start` (data, model,
optimizer and schedule, fresh or restored from a saved state: `vitlab.train.assemble`), `run_epochs` (each epoch:
`train_one_epoch`, then `end_epoch` validates, keeps the best checkpoint and saves the state) and `finish` (the test
split, once, and the run's outputs). What goes where in the run folder is `vitlab.runs`; the saved state and its
restore are `vitlab.train.state`; what the run prints is `vitlab.train.summary`. One epoch's steps are
`vitlab.train.epoch`, its end `vitlab.train.epoch_end`; what a restarted attempt does is `vitlab.train.restarts`.

Model selection uses the validation split only (carved from the training images unless the data set has an
official one); the test split is measured once at the end, for the final and for the best-validation model.
Only rank 0 writes. Every file is written atomically, so the last good checkpoint survives any crash.

Randomness is made resumable: the data order of epoch e comes from a generator seeded with (seed, e), the
augmentation generator's state and the global RNG state are saved in the checkpoint, so a resumed run
continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.checkpoint.formats import load_model
from vitlab.checkpoint.io import read_safetensors
from vitlab.data.source import BatchSource
from vitlab.distributed import (
    any_rank,
    cleanup,
    init_distributed,
    is_collective_timeout,
    replica_difference,
    synchronize,
)
from vitlab.errors import VitlabError
from vitlab.messages import say
from vitlab.objectives.base import NonFiniteLoss
from vitlab.runs import BEST, BEST_OBJECTIVE
from vitlab.train.assemble import start
from vitlab.train.budget import fit_to_budget
from vitlab.train.clock import RunClock, StopFlag, seconds_since_launch
from vitlab.train.config import TrainConfig
from vitlab.train.elastic import shared_store_hazard
from vitlab.train.epoch import Safeguards, UnreadableCount, train_one_epoch
from vitlab.train.epoch_end import end_epoch, unreadable_so_far
from vitlab.train.figures import read_interval
from vitlab.train.fsdp import is_sharded
from vitlab.train.restarts import continued_after_restart, finished_in_this_job, set_aside_damaged_state
from vitlab.train.session import Session
from vitlab.train.state import RunFinished, read_resumable
from vitlab.train.summary import EpochProgress, show_epoch, stop_line, write_outputs
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
        try:
            state, config = read_resumable(Path(resume), use_previous, epochs, notes)
        except RunFinished as refusal:
            return finished_in_this_job(Path(resume), refusal)
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
            say(f"note: {note}")
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


def resume(run_dir: str | Path, use_previous: bool = False, epochs: int | None = None) -> dict[str, Any]:
    """Continue a stopped run exactly where it stopped (with `epochs`, at a new length); see `train`."""
    return train(TrainConfig(), resume=run_dir, use_previous=use_previous, epochs=epochs)


def run_epochs(session: Session) -> dict[str, Any] | None:
    """The remaining epochs: train, validate, choose the best, save, report. Returns the 'interrupted' summary
    when a stop was asked for (state saved), None when every epoch ran."""
    config, env, position, steps = session.config, session.env, session.position, session.steps_per_epoch
    clock = RunClock(position.elapsed_seconds, position.global_step, config.epochs * steps)

    def save_within_epoch() -> None:
        position.elapsed_seconds = clock.elapsed()
        session.save_state()

    guards = Safeguards(
        session.heartbeat, session.saving, save_within_epoch, session.run, read_interval(config.sync_every, env.device)
    )
    # The limit of unreadable files is the data set's, every split's files, decided on every rank's together: at
    # the reads of the steps, and before each epoch (the files the last validation met). Never after the last
    # epoch: a run whose training finished writes its model, and lists the files the test split met.
    unreadable = UnreadableCount(session.splits, env, str(config.data_dir or config.dataset), position.unreadable)
    with StopFlag() as stop:
        for epoch in range(position.epoch, config.epochs):
            if epoch >= config.epochs:  # shortened to fit the budget
                break
            unreadable.check()
            progress = EpochProgress(session, epoch, clock)
            epoch_started = time.perf_counter()
            seconds_before = position.train_seconds
            epoch_seed = config.seed * 1_000_003 + epoch
            batches = session.splits.train.training_batches(
                epoch_seed, config.batch_size, position.step_in_epoch, env.rank, env.world_size
            )
            try:
                finished = train_one_epoch(
                    session.step, session.objective, batches, steps, env, position, epoch_seed,
                    stop=stop, on_step=progress, unreadable=unreadable, guards=guards,
                )  # fmt: skip
            except NonFiniteLoss as error:
                raise loss_error(error, session) from None
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
            show_epoch(session, row, clock, improved)
            if any_rank(stop.requested, env) and epoch + 1 < config.epochs:
                return stopped(session, f"after epoch {epoch + 1}", epoch + 1, 0, stop)
    session.elapsed_seconds = clock.elapsed()
    return None


def loss_error(error: NonFiniteLoss, session: Session) -> TrainingError:
    """What to do about a loss that became NaN or infinite at `error`'s epoch and step."""
    return TrainingError(
        f"the loss became {error.value} at epoch {error.epoch}, step {error.step}; the last good "
        f"checkpoint is kept. Lower the learning rate (--set lr={session.config.lr / 3:.2g})"
        + (
            ", or train in fp32 (--set precision=fp32; bf16 autocast is on)"
            if session.precision.value == "bf16"
            else ""
        )
    )


def stopped(session: Session, where: str, epoch: int, step: int, stop: StopFlag) -> dict[str, Any]:
    """The 'interrupted' summary of a run stopped (its state saved) at `epoch`, `step`; rank 0 says how to resume."""
    if session.env.is_main:
        say(stop_line(where, session.objective, session.run))
    return {"status": "interrupted", "run_dir": str(session.run), "epoch": epoch, "step": step, "signal": stop.signal}


def finish(session: Session) -> dict[str, Any]:
    """The end of a run: the test split measured once (final model and best-validation checkpoint), the final
    model, pictures and summaries written."""
    env = session.env
    # Training is over: its streaming workers go before the test split's start (the run's memory peaked with the
    # training, validation and test workers all alive at the end; issue 38).
    session.splits.train.close()
    session.refresh_evaluated()  # a sharded model's weights gathered whole: measured and saved as one model
    results = final_results(session, session.run / BEST)
    session.unreadable = unreadable_so_far(session)  # for the summary: the test split's too, met just now
    # Sharded (FSDP), the processes hold different shards by design: the replicas compared are the gathered copies.
    replica_diff = replica_difference(session.evaluated if is_sharded(session.model) else session.model, env)
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
