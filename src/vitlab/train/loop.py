"""Training: `train` runs a recipe end to end, in three steps that read top to bottom: `start` (data, model,
optimizer and schedule, fresh or restored from a saved state), `run_epochs` (each epoch: `train_one_epoch`, then
`end_epoch` validates, keeps the best checkpoint and saves the state) and `finish` (the test split, once, and the
run's outputs). What goes where in the run folder is `vitlab.runs`; the saved state is `vitlab.train.state`.

Model selection uses the validation split only (carved from the training images unless the data set has an
official one); the test split is measured once at the end, for the final and for the best-validation model.
Only rank 0 writes. Every file is written atomically, so the last good checkpoint survives any crash.

Randomness is made resumable: the data order of epoch e comes from a generator seeded with (seed, e), the
augmentation generator's state and the global RNG state are saved in the checkpoint, so a resumed run
continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from vitlab.checkpoint.io import save_model, save_state_dict
from vitlab.config import ViTConfig
from vitlab.data.datasets import ImageDataset
from vitlab.data.source import Batch, steps_per_epoch as whole_batches
from vitlab.data.transforms import Draws
from vitlab.hardware import Choice, choose_precision
from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.models.vit import VisionTransformer
from vitlab.objectives import NonFiniteLoss, Objective, build_objective
from vitlab.objectives.base import is_better
from vitlab.progress import LogLines, format_duration
from vitlab.train.clock import RunClock, StopFlag, seconds_since_launch
from vitlab.train.config import TrainConfig, budget_seconds
from vitlab.distributed import (DistEnv, any_rank, broadcast_object, cleanup, fetch_once, init_distributed,
                                replica_difference, synchronize)
from vitlab.runs import BEST, BEST_OBJECTIVE, RunFolder, default_run_name
from vitlab.train.optim import EMA, build_optimizer
from vitlab.train.schedule import (build_scheduler, fit_schedule, fitted_warmup_steps, follow_schedule, peak_lr,
                                   set_schedule_length, suggested_batch_size)
from vitlab.train.data import choose_streaming, training_splits
from vitlab.train.setup import apply_freezing, build_model, default_threads, training_attention_kernel
from vitlab.train.session import Session
from vitlab.train.state import Position, check_resumable, load_training_state
from vitlab.train.step import TrainingStep
from vitlab.train.summary import describe_precision, epoch_line, unreadable_files, write_outputs


class TrainingError(VitlabError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


def train_one_epoch(step: TrainingStep, objective: Objective, batches: Iterable[Batch], steps_per_epoch: int,
                    env: DistEnv, position: Position, epoch_seed: int, stop: StopFlag | None = None,
                    on_step: Callable[[Position, list[float], float], None] | None = None) -> bool:
    """Run the rest of one epoch from `position` (the batches must start at its step); returns False if a stop was
    requested (the position is then consistent and can be saved). `step` holds the model, optimizer, schedule and
    EMA; `objective` turns each batch into inputs and targets. After each step `on_step(position, epoch sums,
    images per second)` reports progress. A non-finite loss raises NonFiniteLoss with `epoch` and `step` set."""
    augment_rng = torch.Generator()
    if position.augment_state is not None:
        augment_rng.set_state(position.augment_state)
    else:
        augment_rng.manual_seed(epoch_seed + 1)
    spec = (step.model or step.wrapped).config
    step.wrapped.train()
    sums = torch.tensor(position.epoch_sums, dtype=torch.float64)
    for index, batch in enumerate(batches, start=position.step_in_epoch):
        started = time.perf_counter()
        inputs, targets = objective.training_inputs(batch, spec, Draws(augment_rng, batch.global_size, batch.shard))
        try:
            sums += step(inputs, targets)
        except NonFiniteLoss as error:
            error.epoch, error.step = position.epoch + 1, index + 1
            raise
        seconds = time.perf_counter() - started
        position.step_in_epoch = index + 1
        position.global_step += 1
        position.train_seconds += seconds
        position.epoch_sums = sums.tolist()
        if on_step is not None:
            on_step(position, position.epoch_sums, len(batch) * env.world_size / seconds)
        if any_rank(stop is not None and stop.requested, env) and index + 1 < steps_per_epoch:
            position.augment_state = augment_rng.get_state()
            return False
    position.augment_state = None
    return True


# ------------------------------------------------------------------------------------------------ run
def train(config: TrainConfig, resume: str | Path | None = None, use_previous: bool = False,
          epochs: int | None = None) -> dict[str, Any]:
    """Train a recipe (or resume a run folder) to the end; returns the summary (also written to the run).
    epochs: with `resume`, a new length for the run (e.g. to extend a finished one); the learning rate then
    follows the schedule of a run of that length from where the run stands."""
    launched = time.perf_counter() - seconds_since_launch()
    env = init_distributed()
    try:
        state = None
        if resume is not None:
            state = load_training_state(Path(resume), allow_previous=use_previous)
            config = resumed_config(state, Path(resume), epochs)
            refuse_finished(state, Path(resume), config)
        session = start(config, env, state, Path(resume) if resume is not None else None, epochs)
        session.launched = launched
        try:
            summary = run_epochs(session)
            if summary is None:
                summary = finish(session)
        finally:  # streamed splits' worker processes go with the run, not whenever the objects are collected
            for part in (session.splits.train, session.splits.validation, session.splits.test):
                getattr(part, "close", lambda: None)()
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


def refuse_finished(state: dict[str, Any], run_dir: Path, config: TrainConfig) -> None:
    """A run whose every epoch is trained and whose summary is written has nothing left to resume. (One stopped
    after its last state was saved but before its summary resumes into `finish`, which writes it.)"""
    summary = RunFolder(run_dir).summary()
    if state["epoch"] >= config.epochs and summary is not None and summary.get("status") == "finished":
        raise ConfigError(f"{run_dir} has finished its {config.epochs} epochs; nothing to resume. To train it "
                          f"longer, add --epochs N (more than {config.epochs}); to start again, train a new run")


def resumed_config(state: dict[str, Any], run_dir: Path, new_epochs: int | None) -> TrainConfig:
    """The recipe a run was saved with, at a new length if asked (never below the epochs already trained)."""
    config = TrainConfig.from_dict(json.loads(state["train_config"]))
    if new_epochs is not None and new_epochs != config.epochs:
        done = state["epoch"] + (1 if state["step_in_epoch"] else 0)
        if new_epochs < done:
            raise ConfigError(f"{run_dir} has already trained {done} epochs; --epochs must be at least that "
                              f"to extend it (the recipe's length is {config.epochs})")
        config.epochs = new_epochs
    return config


def start(config: TrainConfig, env: DistEnv, state: dict[str, Any] | None, run_dir: Path | None,
          new_epochs: int | None) -> Session:
    """Data, model, optimizer and schedule of a run, fresh or restored from `state`; the run folder's recipe
    written. Everything that can be wrong with the recipe or the data is found before the folder is made."""
    torch.set_num_threads(config.threads or default_threads(env))
    torch.manual_seed(config.seed + env.rank)
    if config.tensorboard and env.is_main:
        require_tensorboard()  # fail before anything is written if tensorboard is missing
    if run_dir is None:
        # Every rank must name the folder alike: rank 0's name (and time) wins.
        run = RunFolder(Path(config.out_dir) / broadcast_object(config.run_name or default_run_name(config.dataset),
                                                                env))
        if env.is_main and run.holds_run:
            raise ConfigError(f"run folder {run} already holds a run; resume it with --resume {run} "
                              "or choose another --set run_name=...")
    else:
        run = RunFolder(run_dir)
    if config.init_from:  # the recipe and summary name the checkpoint the model comes from, not a variant default
        config.model = str(config.init_from)
    pretrained = None
    if state is None and config.init_from:
        from vitlab.checkpoint.formats import read_checkpoint

        # A pre-trained name is downloaded by one process per machine; the others then find it in the cache.
        pretrained = fetch_once(lambda: read_checkpoint(config.init_from, image_size=config.image_size)[:2], env)
    # Image files are decoded at the size the model takes (its variant's, its checkpoint's or --image-size), as
    # `predict`, `eval` and `serve` read them; in-memory data sets are resized per batch whatever this is.
    config.stream = choose_streaming(config, env, state, pretrained)  # recorded in the recipe written below
    # Under torchrun one process per machine loads first (and downloads, where the files are not cached); the
    # others then find them verified in the cache, instead of racing for the same partial file.
    splits = fetch_once(lambda: training_splits(config, env, state, pretrained), env)
    objective = build_objective(config, splits.train)
    objective.check_data(splits.train)
    if state is not None:
        model = VisionTransformer(ViTConfig.from_json(state["model_config"]))
        model.load_state_dict(state["model"])
    else:
        model = build_model(config, splits.train, pretrained, objective.model_fields(splits.train))
    apply_freezing(model, config)
    model.set_attention_kernel(training_attention_kernel(config, model, env.device))
    if config.augment.hflip and not objective.allows_flips(splits.train):
        # Every rank turns flips off (each draws its augmentation from the same stream); rank 0 says so.
        if env.is_main:
            print(f"note: horizontal flips change the meaning of {config.dataset} images; flips are off")
        config.augment.hflip = False
    steps_per_epoch = check_batching(config, env, len(splits.train))
    # What trains: the model, or the objective's module around it (MAE's decoder, masked patch prediction's head).
    trained = objective.attach(model)
    if state is not None and state.get("objective_state"):
        objective.load_extra_state(state["objective_state"])
    trained.to(env.device)
    wrapped: nn.Module = trained
    if env.enabled:
        wrapped = nn.parallel.DistributedDataParallel(trained, device_ids=[env.device] if env.device.type == "cuda"
                                                      else None)
    if config.compile:
        wrapped = torch.compile(wrapped)
    optimizer = build_optimizer(trained, config.optimizer, config.lr, config.weight_decay, config.momentum,
                                config.layer_decay, config.adam_betas)
    warmup_steps, notes = fit_schedule(config, len(splits.train), steps_per_epoch)
    if env.is_main and state is None:
        for note in notes:
            print(f"note: {note}")
    scheduler = build_scheduler(optimizer, warmup_steps, config.epochs * steps_per_epoch, config.min_lr / config.lr)
    ema = EMA(model, config.ema_decay) if config.ema_decay > 0 else None
    position = Position(epoch_sums=objective.empty_sums())
    data_fingerprint = splits.train.fingerprint()
    if state is not None:
        for note in check_resumable(state, data_fingerprint, steps_per_epoch, env.world_size, run):
            if env.is_main:
                print(f"note: {note}")
        position = restore(state, optimizer, scheduler, ema, config, env, run, steps_per_epoch)
    history = run.read_metrics(before_epoch=position.epoch)
    if env.is_main:
        run.write_recipe(config.to_dict())
        # The file must match the state: on resume the rows of epochs that will be redone go; on a fresh start
        # every row goes (a start killed after writing an epoch's row but before its state leaves one behind).
        run.rewrite_metrics(history)
    eval_model = None
    if ema is not None:
        # Its random init is overwritten by the EMA weights; building it must not draw from the global RNG, or a
        # resumed run (which builds it after restoring that RNG) would diverge from an uninterrupted one.
        with torch.random.fork_rng(devices=[]):
            eval_model = VisionTransformer(model.config).to(env.device)
        # From the start it holds the EMA weights, not only after an epoch's end: a run resumed after its last
        # epoch goes straight to `finish`, which tests and saves these weights.
        ema.copy_to(eval_model)
    precision = training_precision(config, model, env)
    step = TrainingStep(wrapped, objective, optimizer, scheduler, ema, model, env, config.grad_accum,
                        config.grad_clip, precision.value, forward=objective.forward)
    session = Session(config, run, env, splits, model, wrapped, optimizer, scheduler, ema, eval_model, position,
                      history, steps_per_epoch, objective, step, data_fingerprint, precision,
                      writer=run.tensorboard_writer() if config.tensorboard and env.is_main else None)
    if env.is_main:
        announce(session, resumed=state is not None)
    return session


def training_precision(config: TrainConfig, model: VisionTransformer, env: DistEnv) -> Choice:
    """The recipe's precision on this machine: "auto" becomes bf16 autocast where bf16 matmuls pay here (see
    `vitlab.hardware.choose_precision`), else fp32. Every process decides from rank 0's answer, so a job spread
    over unlike machines still runs one precision."""
    from vitlab.counts import model_size

    return broadcast_object(choose_precision(config.precision, env.device, model_size(model.config)[1], "train"), env)


def check_batching(config: TrainConfig, env: DistEnv, train_images: int) -> int:
    """Steps per epoch, after checking that the batch splits over processes and micro-batches and fits the data."""
    if config.batch_size % env.world_size:
        raise ConfigError(f"batch_size {config.batch_size} does not divide over {env.world_size} processes")
    if (config.batch_size // env.world_size) % config.grad_accum:
        raise ConfigError(f"the per-process batch {config.batch_size // env.world_size} does not divide into "
                          f"{config.grad_accum} micro-batches")
    steps_per_epoch = whole_batches(train_images, config.batch_size)
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {config.batch_size} is larger than the {train_images} training images; "
                          f"use --set batch_size={suggested_batch_size(train_images)}")
    return steps_per_epoch


def restore(state: dict[str, Any], optimizer, scheduler, ema: EMA | None, config: TrainConfig, env: DistEnv,
            run: RunFolder, steps_per_epoch: int) -> Position:
    """Optimizer, schedule, EMA and this rank's RNG stream as saved; the position where the run stands."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    saved_epochs = TrainConfig.from_dict(json.loads(state["train_config"])).epochs
    if saved_epochs != config.epochs:  # extended (`resumed_config`): the new length's schedule from the next step
        previous_lr = optimizer.param_groups[-1]["lr"]
        follow_schedule(optimizer, scheduler)
        if env.is_main:
            print(f"extending {run} from {saved_epochs} to {config.epochs} epochs: the learning rate now follows "
                  f"a {config.epochs}-epoch schedule, {previous_lr:.2e} -> {optimizer.param_groups[-1]['lr']:.2e} "
                  f"at step {scheduler.last_epoch} of {config.epochs * steps_per_epoch}")
    if ema is not None and state["ema"] is not None:
        ema.state = {k: v.to(env.device) for k, v in state["ema"].items()}
    position = Position.from_state(state)
    rank_states = state.get("rank_rng_states")
    if rank_states is not None and len(rank_states) == env.world_size:
        # clone(): torch 2.13's set_rng_state segfaults on a row view with a storage offset (seen here).
        torch.set_rng_state(rank_states[env.rank].clone())  # each rank continues its own stream exactly
    else:  # resumed on another number of processes: rank 0's stream, fresh distinct ones for the others
        torch.set_rng_state(state["torch_rng_state"].clone())
        if env.rank:
            torch.manual_seed(config.seed + env.rank + position.global_step)
    cuda_states = state.get("cuda_rng_states")
    if env.device.type == "cuda":
        if cuda_states is not None and len(cuda_states) == env.world_size:
            torch.cuda.set_rng_state(cuda_states[env.rank].clone(), env.device)
        elif env.is_main:
            print("note: the saved state holds no CUDA random state for these processes (saved on a CPU, or by "
                  "another number of GPUs): dropout and stochastic depth on the GPU continue from a fresh stream")
    return position


def announce(session: Session, resumed: bool) -> None:
    """The run's first line: what trains on what, how long, where."""
    config, splits, model = session.config, session.splits, session.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    what = session.objective.job(config.init_from or config.model, fine_tuning=bool(config.init_from))
    validation = "no validation" if splits.validation is None else (
        f"{len(splits.validation)} validation ({splits.validation_source}"
        + (f", seed {config.seed})" if splits.validation_source == "carved" else ")"))
    test = f"{len(splits.test)} test" + (f" ({splits.test_source})" if splits.test_source != "official" else "")
    print(f"{what} ({params / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable) on {config.dataset}: "
          f"{len(splits.train)} train / {validation} / {test} images, {config.epochs} epochs of "
          f"{session.steps_per_epoch} steps, batch {config.batch_size}, {session.env.world_size} process(es) on "
          f"{session.env.device.type}; run folder {session.run}")
    print(f"precision: {describe_precision(session.precision)}")
    adaptation = data_adaptation(splits.train, model.config)
    if adaptation and not resumed:
        print(f"note: {adaptation}")
    if resumed:
        print(f"resuming at epoch {session.position.epoch + 1}, step {session.position.step_in_epoch} of "
              f"{session.steps_per_epoch}")


def data_adaptation(data: Any, config: ViTConfig) -> str | None:
    """How the training images become the model's input when they differ from it, in words ("8x8 grey images are
    resized to 16x16 and repeated to 3 channels"), or None when they already match."""
    stored = getattr(data, "image_size", None)
    stored = tuple(stored) if stored is not None else None
    size, channels = tuple(config.image_size), config.in_chans
    kind = {1: "grey", 3: "RGB"}.get(data.channels, f"{data.channels}-channel")
    changes = []
    if stored is not None and stored != size:
        changes.append(f"resized to {size[0]}x{size[1]}")
    if data.channels != channels:
        changes.append("repeated to 3 channels" if data.channels == 1 and channels == 3 else
                       "converted to grey" if channels == 1 else f"converted to {channels} channels")
    if not changes:
        return None
    shape = f"{stored[0]}x{stored[1]} " if stored is not None else ""
    return f"the {shape}{kind} training images are {' and '.join(changes)}, the model's input"


def run_epochs(session: Session) -> dict[str, Any] | None:
    """The remaining epochs: train, validate, choose the best, save, report. Returns the 'interrupted' summary
    when a stop was asked for (state saved), None when every epoch ran."""
    from tqdm import tqdm

    config, env, position, run = session.config, session.env, session.position, session.run
    steps = session.steps_per_epoch
    clock = RunClock(position.elapsed_seconds, position.global_step, config.epochs * steps)
    resume_command = session.objective.command
    with StopFlag() as stop:
        for epoch in range(position.epoch, config.epochs):
            if epoch >= config.epochs:  # shortened to fit the budget
                break
            bar = tqdm(total=steps, initial=position.step_in_epoch, desc=f"epoch {epoch + 1}/{config.epochs}",
                       leave=False, dynamic_ncols=True,
                       # None: tqdm shows the bar only on a terminal, so logs get the epoch lines alone.
                       disable=None if env.is_main and config.progress else True)
            epoch_started = time.perf_counter()
            seconds_before = position.train_seconds
            log_lines = None
            if bar.disable and env.is_main and config.progress:  # no terminal, no bar: lines in the log instead
                every = config.log_every_steps or (-(-steps // 4) if steps >= 40 else 0)
                if every:
                    log_lines = LogLines(steps, f"epoch {epoch + 1:>3}/{config.epochs}", every,
                                         done=position.step_in_epoch, left_label="epoch")

            def report(position: Position, sums: list[float], images_per_second: float) -> None:
                figures = session.objective.progress_figures(sums)
                run_left = format_duration(clock.remaining(position.global_step))
                lr = f"{peak_lr(session.scheduler):.2e}"
                if not bar.disable:
                    bar.update(1)
                    bar.set_postfix(**figures, lr=lr, img_s=f"{images_per_second:.0f}", run_left=run_left)
                if log_lines is not None:
                    log_lines.update(1, **figures, lr=lr, tail=f"run {run_left} left")

            epoch_seed = config.seed * 1_000_003 + epoch
            batches = session.splits.train.training_batches(epoch_seed, config.batch_size, position.step_in_epoch,
                                                            env.rank, env.world_size)
            try:
                finished = train_one_epoch(session.step, session.objective, batches, steps, env, position,
                                           epoch_seed, stop, report)
            except NonFiniteLoss as error:
                raise TrainingError(
                    f"the loss became {error.value} at epoch {error.epoch}, step {error.step}; the last good "
                    f"checkpoint is kept. Lower the learning rate (--set lr={config.lr / 3:.2g})"
                    + (", or train in fp32 (--set precision=fp32; bf16 autocast is on)"
                       if session.precision.value == "bf16" else "")) from None
            bar.close()
            if not finished:
                position.elapsed_seconds = clock.elapsed()
                session.save_state()
                if env.is_main:
                    print(f"stopped at epoch {epoch + 1}, step {position.step_in_epoch}; state saved. "
                          f"Resume with: vitlab {resume_command} --resume {run}")
                return {"status": "interrupted", "run_dir": str(run), "epoch": epoch, "step": position.step_in_epoch,
                        "signal": stop.signal}
            row, improved = end_epoch(session, epoch, epoch_started, seconds_before, clock)
            session.epoch_timings.append((row["epoch_seconds"], row["images_per_second"]))
            fit_to_budget(session, clock)
            if env.is_main:
                every = max(1, config.epochs // 25)
                if config.progress and ((epoch + 1) % every == 0 or improved or epoch + 1 == config.epochs):
                    print(epoch_line(row, config.epochs, clock.remaining(position.global_step), improved,
                                     session.objective), flush=True)
            if any_rank(stop.requested, env) and epoch + 1 < config.epochs:
                if env.is_main:
                    print(f"stopped after epoch {epoch + 1}; state saved. Resume with: vitlab {resume_command} --resume "
                          f"{run}")
                return {"status": "interrupted", "run_dir": str(run), "epoch": epoch + 1, "step": 0,
                        "signal": stop.signal}
    session.elapsed_seconds = clock.elapsed()
    return None


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
    warmup_steps = fitted_warmup_steps(round(config.warmup_epochs * session.steps_per_epoch), total_steps)
    set_schedule_length(session.optimizer, session.scheduler, warmup_steps, total_steps, config.min_lr / config.lr)
    session.budget_note = (f"{config.budget}: {epochs} of the recipe's {planned} epochs fit ({epoch_seconds:.1f} s "
                           f"an epoch here); the cosine schedule was refitted to end at epoch {epochs}")
    if env.is_main:
        session.run.write_recipe(config.to_dict())
        print(f"note: budget {session.budget_note}", flush=True)


def end_epoch(session: Session, epoch: int, epoch_started: float, seconds_before: float,
              clock: RunClock) -> tuple[dict[str, Any], bool]:
    """Validate (and test, if asked to show it), record the epoch's row, keep the best checkpoint by the
    objective's validation figure, save the training state. Returns the row and whether it is the best so far."""
    config, env, position, splits = session.config, session.env, session.position, session.splits
    objective = session.objective
    if session.ema is not None:
        session.ema.copy_to(session.eval_model)
    row = dict(epoch=epoch + 1, step=position.global_step, lr=peak_lr(session.scheduler),
               **objective.epoch_figures(position.epoch_sums))
    validation = None
    if splits.validation is not None:
        validation = objective.evaluate(session.evaluated, splits.validation, config.eval_batch_size, env,
                                        session.precision.value)
        row.update({f"val_{name}": value for name, value in objective.row_figures(validation).items()})
    if config.test_every_epoch:  # shown to the user; nothing below reads it
        test = objective.evaluate(session.evaluated, splits.test, config.eval_batch_size, env,
                                  session.precision.value)
        row.update({f"test_{name}": value for name, value in objective.row_figures(test).items()})
    skipped = unreadable_files(splits)
    if skipped:
        row["skipped_files"] = len(skipped)
    position.elapsed_seconds = clock.elapsed()
    count = objective.sums_count(position.epoch_sums)
    row.update(images_per_second=count / max(position.train_seconds - seconds_before, 1e-9),
               epoch_seconds=time.perf_counter() - epoch_started, elapsed_seconds=position.elapsed_seconds)
    session.history.append(row)
    position.epoch, position.step_in_epoch = epoch + 1, 0
    position.epoch_sums = objective.empty_sums()
    improved = validation is not None and is_better(objective, validation[objective.selection],
                                                    position.best_value if position.best_epoch > 0 else None)
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
                raise CheckpointError(f"could not save {best} ({error.strerror or error}); the previous best is "
                                      "intact") from None
        objective.after_epoch(session.evaluated, epoch + 1, session.run.path, splits.validation)
    session.save_state()
    return row, improved


def finish(session: Session) -> dict[str, Any]:
    """The end of a run: the test split measured once (final model and best-validation checkpoint), the final
    model, pictures and summaries written."""
    env = session.env
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

    def measure(model: nn.Module, data: ImageDataset) -> dict[str, Any]:
        return session.objective.evaluate(model, data, config.eval_batch_size, env, session.precision.value)

    results: dict[str, Any] = {"test": measure(final_model, splits.test), "val": None, "best_test": None}
    if splits.validation is not None:
        results["val"] = measure(final_model, splits.validation)
    if position.best_epoch == config.epochs:
        results["best_test"] = results["test"]
    elif position.best_epoch > 0:
        from vitlab.checkpoint.formats import load_model
        from vitlab.checkpoint.io import read_safetensors

        best = load_model(best_path).to(next(final_model.parameters()).device)
        final_extra = {name: value.detach().clone() for name, value in session.objective.extra_state().items()}
        extra_path = session.run / BEST_OBJECTIVE
        if final_extra and extra_path.is_file():  # the best epoch's decoder with its encoder, then the final's back
            session.objective.load_extra_state(read_safetensors(extra_path)[0])
        results["best_test"] = measure(best, splits.test)
        if final_extra:
            session.objective.load_extra_state(final_extra)
    return results


def require_tensorboard() -> None:
    try:
        import torch.utils.tensorboard  # noqa: F401 - only whether it is there
    except ImportError:
        raise ConfigError("tensorboard=True needs the tensorboard package: pip install tensorboard") from None
