"""The end of an epoch: validate (and test, if asked to show it), record the epoch's row, keep the best checkpoint
by the objective's validation figure, save the training state. `vitlab.train.loop` calls it after each epoch."""

from __future__ import annotations

import time
from typing import Any

from vitlab.checkpoint.io import save_state_dict
from vitlab.distributed import gather_lists
from vitlab.errors import CheckpointError
from vitlab.objectives.base import is_better
from vitlab.runs import BEST, BEST_OBJECTIVE
from vitlab.train.clock import RunClock
from vitlab.train.lora import save_trained_model
from vitlab.train.schedule import peak_lr
from vitlab.train.session import Session
from vitlab.train.summary import unreadable_files


def end_epoch(
    session: Session, epoch: int, epoch_started: float, seconds_before: float, clock: RunClock
) -> tuple[dict[str, Any], bool]:
    """Validate (and test, if asked to show it), record the epoch's row, keep the best checkpoint by the
    objective's validation figure, save the training state. Returns the row and whether it is the best so far."""
    config, env, position, splits = session.config, session.env, session.position, session.splits
    objective = session.objective
    session.refresh_evaluated()  # the EMA's weights, or a sharded model's gathered whole
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
    skipped = position.unreadable = unreadable_so_far(session)
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
            save_best(session)
        objective.after_epoch(session.evaluated, epoch + 1, session.run.path, splits.validation)
    session.release_evaluated()
    session.heartbeat.at("saving state")
    session.save_state()
    return row, improved


def unreadable_so_far(session: Session) -> list[str]:
    """The run's unreadable files, each once: those its saved state recorded (met before a resume) and those every
    rank has met since, in every split. A collective: call on every rank at once."""
    met = gather_lists(unreadable_files(session.splits), session.env)
    return list(dict.fromkeys([*session.position.unreadable, *met]))


def save_best(session: Session) -> None:
    """Rank 0: the evaluated weights as the best checkpoint, with the objective's own parameters of this epoch."""
    best = session.run / BEST
    try:
        save_trained_model(session.evaluated, best, checksum=True)
        extra = session.objective.extra_state()
        if extra:  # the objective's own parameters of the best epoch (a decoder), for its test figures
            save_state_dict(extra, session.run / BEST_OBJECTIVE, checksum=True)
    except OSError as error:
        raise CheckpointError(
            f"could not save {best} ({error.strerror or error}); the previous best is intact"
        ) from None
