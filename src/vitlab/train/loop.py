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

import contextlib
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.checkpoint.io import save_model
from vitlab.config import ViTConfig
from vitlab.data.datasets import ImageDataset, Splits, load_splits
from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.transforms import Draws, augment_batch
from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.eval.classify import evaluate
from vitlab.models.vit import VisionTransformer
from vitlab.progress import LogLines, format_duration
from vitlab.train.config import TrainConfig
from vitlab.distributed import (DistEnv, all_reduce_sum, any_rank, broadcast_object, cleanup, gather_rng_states,
                                      init_distributed, replica_difference, synchronize)
from vitlab.runs import BEST, RunFolder, default_run_name
from vitlab.train.optim import EMA, build_optimizer, build_scheduler, peak_lr
from vitlab.train.setup import apply_freezing, build_model, default_threads, training_attention_kernel
from vitlab.train.state import Position, load_training_state, save_training_state, training_state
from vitlab.train.summary import epoch_line, write_outputs


class TrainingError(VitlabError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


class StopFlag:
    """Set by SIGINT / SIGTERM so the loop can save and leave between steps; a second Ctrl-C aborts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None  # the first stop signal received: SIGINT (Ctrl-C) exits 130, SIGTERM 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopFlag":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[sig] = signal.signal(sig, self.handle)
                # The handler only sets a flag, so let interrupted system calls restart (SA_RESTART): a signal
                # arriving inside a gloo/NCCL collective must not fail it with EINTR.
                signal.siginterrupt(sig, False)
            except ValueError:  # not the main thread (e.g. called from a worker thread): no handlers
                pass
        return self

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal = self.signal or signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------------------------ steps
class RunClock:
    """Wall time of a run over all its sessions, and an estimate of the time left from this session's pace
    (training steps with evaluation amortised in, once an epoch has ended)."""

    def __init__(self, elapsed_before: float, steps_done: int, total_steps: int) -> None:
        self.started = time.perf_counter()
        self.elapsed_before = elapsed_before
        self.steps_at_start = steps_done
        self.total_steps = total_steps

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def remaining(self, steps_done: int) -> float | None:
        done_here = steps_done - self.steps_at_start
        if done_here <= 0:
            return None
        return (time.perf_counter() - self.started) / done_here * (self.total_steps - steps_done)


def train_one_epoch(wrapped: nn.Module, model: VisionTransformer, data: ImageDataset, optimizer, scheduler,
                    ema: EMA | None, config: TrainConfig, env: DistEnv, position: Position,
                    permutation_seed: int, stop: StopFlag, progress_bar: Any = None,
                    clock: RunClock | None = None, log_lines: LogLines | None = None) -> bool:
    """Run the rest of one epoch from `position`; returns False if a stop was requested (state is consistent).
    `wrapped` is what runs the steps (the model itself, or its DDP / compiled wrapper); `model` the
    VisionTransformer inside, whose config and weights the EMA reads."""
    batch = config.batch_size
    steps_per_epoch = len(data) // batch
    per_rank = batch // env.world_size
    shard = slice(env.rank * per_rank, (env.rank + 1) * per_rank)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(permutation_seed))
    augment_rng = torch.Generator()
    if position.augment_state is not None:
        augment_rng.set_state(position.augment_state)
    else:
        augment_rng.manual_seed(permutation_seed + 1)
    autocast = torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
    wrapped.train()
    sums = torch.tensor(position.epoch_sums, dtype=torch.float64)
    for step in range(position.step_in_epoch, steps_per_epoch):
        started = time.perf_counter()
        rows = order[step * batch:(step + 1) * batch][shard]
        images = to_unit_range(data.images[rows], data.max_value, model.config)
        images, targets = augment_batch(images, data.labels[rows], data.num_classes, config.augment,
                                        Draws(augment_rng, batch, shard), config.label_smoothing)
        images = normalize(images, model.config).to(env.device)
        targets, labels = targets.to(env.device), data.labels[rows].to(env.device)
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), dtype=torch.float64)
        correct = 0
        for micro, (x, t, y) in enumerate(zip(images.chunk(config.grad_accum), targets.chunk(config.grad_accum),
                                              labels.chunk(config.grad_accum))):
            last_micro = micro == config.grad_accum - 1
            sync = wrapped.no_sync() if env.enabled and not last_micro else contextlib.nullcontext()
            with sync:
                with autocast:
                    logits = wrapped(x)
                loss = F.cross_entropy(logits.float(), t) / config.grad_accum
                loss.backward()
            step_loss += loss.detach().double() * len(x)
            correct += (logits.argmax(1) == y).sum().item()
        local = torch.tensor([step_loss.item() * config.grad_accum, correct, len(images)], dtype=torch.float64)
        all_reduce_sum(local, env)
        if not math.isfinite(local[0].item()):
            raise TrainingError(
                f"the loss became {local[0].item()} at epoch {position.epoch + 1}, step {step + 1}; the last good "
                f"checkpoint is kept. Lower the learning rate (--set lr={config.lr / 3:.2g}), or use "
                "--set precision=fp32 if bf16 was on")
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(wrapped.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        if ema is not None:
            ema.update(model)
        sums += local
        position.step_in_epoch = step + 1
        position.global_step += 1
        position.train_seconds += time.perf_counter() - started
        if progress_bar is not None:
            progress_bar.update(1)
            progress_bar.set_postfix(loss=f"{sums[0] / sums[2]:.3f}", acc=f"{sums[1] / sums[2]:.3f}",
                                     lr=f"{peak_lr(scheduler):.2e}",
                                     img_s=f"{len(images) * env.world_size / (time.perf_counter() - started):.0f}",
                                     run_left=format_duration(clock.remaining(position.global_step)) if clock else "?")
        if log_lines is not None:
            log_lines.update(1, loss=f"{sums[0] / sums[2]:.4f}", train=f"{100 * sums[1] / sums[2]:.1f}%",
                             lr=f"{peak_lr(scheduler):.2e}",
                             tail=f"run {format_duration(clock.remaining(position.global_step)) if clock else '?'} left")
        position.epoch_sums = sums.tolist()
        if any_rank(stop.requested, env) and step + 1 < steps_per_epoch:
            position.augment_state = augment_rng.get_state()
            return False
    position.augment_state = None
    return True


# ------------------------------------------------------------------------------------------------ run
FEW_STEPS_PER_EPOCH = 10  # below this an epoch is a handful of updates: the recipe's epoch counts assume more
MIN_TOTAL_STEPS = 100  # a ViT from scratch barely leaves chance level in fewer optimizer steps


def fit_schedule(config: TrainConfig, train_images: int, steps_per_epoch: int) -> tuple[int, list[str]]:
    """(warm-up steps, notes for the user). A warm-up longer than half the run is shortened to a fifth of it,
    so that the learning rate reaches its peak; a run of few steps per epoch or few steps in all is named."""
    total = config.epochs * steps_per_epoch
    warmup = round(config.warmup_epochs * steps_per_epoch)
    notes = []
    if total > 1 and warmup > total / 2:
        shortened = max(1, round(total / 5))
        notes.append(f"the {config.warmup_epochs:g}-epoch warm-up is {'longer than' if warmup >= total else 'most of'} "
                     f"this {config.epochs}-epoch run, so the learning rate would {'never reach' if warmup >= total else 'barely reach'} "
                     f"its peak; it is shortened to {shortened} steps ({shortened / steps_per_epoch:.2g} epochs)")
        warmup = shortened
    dropped = train_images - steps_per_epoch * config.batch_size
    if steps_per_epoch < FEW_STEPS_PER_EPOCH or total < MIN_TOTAL_STEPS:
        suggestion = max(8, 2 ** int(math.log2(max(1, train_images // FEW_STEPS_PER_EPOCH))))
        notes.append(f"{train_images} training images at batch {config.batch_size} make {steps_per_epoch} optimizer "
                     f"step(s) per epoch, {total} in all" + (f", and {dropped} images are left out of each epoch"
                                                             if dropped else "")
                     + f"; a ViT needs far more steps to learn: use a smaller batch (--set batch_size={suggestion}) "
                     "or more epochs" if suggestion < config.batch_size else
                     f"{train_images} training images at batch {config.batch_size} make {total} optimizer steps in "
                     "all; a ViT needs far more to learn: train for more epochs")
    return warmup, notes


@dataclass
class Session:
    """One sitting of a run, built (fresh or from a saved state) and ready for its epochs."""

    config: TrainConfig
    run: RunFolder
    env: DistEnv
    splits: Splits
    model: VisionTransformer  # the model being trained
    wrapped: nn.Module  # what runs the steps: `model`, or its DDP / torch.compile wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    ema: EMA | None
    eval_model: VisionTransformer | None  # holds the EMA weights for evaluation (None without EMA)
    position: Position
    history: list[dict[str, Any]]
    steps_per_epoch: int
    writer: Any = None  # TensorBoard
    elapsed_seconds: float = 0.0  # wall time of the run when its last epoch ended, over all its sessions

    @property
    def evaluated(self) -> VisionTransformer:
        """The weights that are validated, tested and saved: the EMA's if any, else the model's."""
        return self.eval_model or self.model

    def save_state(self) -> None:
        """Every rank's RNG state gathered, then rank 0 writes checkpoints/last.pt."""
        rng_states = gather_rng_states(self.env)
        if self.env.is_main:
            save_training_state(training_state(self.model, self.optimizer, self.scheduler, self.ema, self.position,
                                               self.config, rng_states), self.run)


def train(config: TrainConfig, resume: str | Path | None = None, use_previous: bool = False,
          epochs: int | None = None) -> dict[str, Any]:
    """Train a recipe (or resume a run folder) to the end; returns the summary (also written to the run).
    epochs: with `resume`, a new length for the run (e.g. to extend a finished one); the learning rate then
    follows the schedule of a run of that length from where the run stands."""
    env = init_distributed()
    try:
        state = None
        if resume is not None:
            state = load_training_state(Path(resume), allow_previous=use_previous)
            config = resumed_config(state, Path(resume), epochs)
        session = start(config, env, state, Path(resume) if resume is not None else None, epochs)
        summary = run_epochs(session)
        if summary is None:
            summary = finish(session)
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
    splits = load_splits(config.dataset, config.data_dir, config.val_size, config.seed, config.image_size,
                         config.classes, max_train_images=config.max_train_images)
    if splits.train.num_classes < 2:
        raise DataError(f"{splits.train.name} has a single class; a classifier needs at least two")
    if state is not None:
        model = VisionTransformer(ViTConfig.from_json(state["model_config"]))
        model.load_state_dict(state["model"])
    else:
        model = build_model(config, splits.train)
    apply_freezing(model, config)
    model.set_attention_kernel(training_attention_kernel(config, model))
    if config.augment.hflip and not splits.train.hflip and env.is_main:
        print(f"note: horizontal flips change the meaning of {config.dataset} images; flips are off")
        config.augment.hflip = False
    steps_per_epoch = check_batching(config, env, len(splits.train))
    model.to(env.device)
    wrapped: nn.Module = model
    if env.enabled:
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda"
                                                      else None)
    if config.compile:
        wrapped = torch.compile(wrapped)
    optimizer = build_optimizer(model, config.optimizer, config.lr, config.weight_decay, config.momentum,
                                config.layer_decay)
    warmup_steps, notes = fit_schedule(config, len(splits.train), steps_per_epoch)
    if env.is_main and state is None:
        for note in notes:
            print(f"note: {note}")
    scheduler = build_scheduler(optimizer, warmup_steps, config.epochs * steps_per_epoch, config.min_lr / config.lr)
    ema = EMA(model, config.ema_decay) if config.ema_decay > 0 else None
    position = Position()
    if state is not None:
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
    session = Session(config, run, env, splits, model, wrapped, optimizer, scheduler, ema, eval_model, position,
                      history, steps_per_epoch,
                      writer=run.tensorboard_writer() if config.tensorboard and env.is_main else None)
    if env.is_main:
        announce(session, resumed=state is not None)
    return session


def check_batching(config: TrainConfig, env: DistEnv, train_images: int) -> int:
    """Steps per epoch, after checking that the batch splits over processes and micro-batches and fits the data."""
    if config.batch_size % env.world_size:
        raise ConfigError(f"batch_size {config.batch_size} does not divide over {env.world_size} processes")
    if (config.batch_size // env.world_size) % config.grad_accum:
        raise ConfigError(f"the per-process batch {config.batch_size // env.world_size} does not divide into "
                          f"{config.grad_accum} micro-batches")
    steps_per_epoch = train_images // config.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {config.batch_size} is larger than the {train_images} training images; "
                          f"use --set batch_size={2 ** int(math.log2(train_images))}")
    return steps_per_epoch


def restore(state: dict[str, Any], optimizer, scheduler, ema: EMA | None, config: TrainConfig, env: DistEnv,
            run: RunFolder, steps_per_epoch: int) -> Position:
    """Optimizer, schedule, EMA and this rank's RNG stream as saved; the position where the run stands."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    saved_epochs = TrainConfig.from_dict(json.loads(state["train_config"])).epochs
    if saved_epochs != config.epochs:  # extended (`resumed_config`): the new length's schedule from the next step
        previous_lr = optimizer.param_groups[-1]["lr"]
        for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base_lr * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
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
    return position


def announce(session: Session, resumed: bool) -> None:
    """The run's first line: what trains on what, how long, where."""
    config, splits, model = session.config, session.splits, session.model
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    what = f"fine-tuning {config.init_from}" if config.init_from else f"training {config.model}"
    validation = "no validation" if splits.validation is None else (
        f"{len(splits.validation)} validation ({splits.validation_source}"
        + (f", seed {config.seed})" if splits.validation_source == "carved" else ")"))
    print(f"{what} ({params / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable) on {config.dataset}: "
          f"{len(splits.train)} train / {validation} / {len(splits.test)} test images, {config.epochs} epochs of "
          f"{session.steps_per_epoch} steps, batch {config.batch_size}, {session.env.world_size} process(es) on "
          f"{session.env.device.type}; run folder {session.run}")
    if resumed:
        print(f"resuming at epoch {session.position.epoch + 1}, step {session.position.step_in_epoch} of "
              f"{session.steps_per_epoch}")


def run_epochs(session: Session) -> dict[str, Any] | None:
    """The remaining epochs: train, validate, choose the best, save, report. Returns the 'interrupted' summary
    when a stop was asked for (state saved), None when every epoch ran."""
    from tqdm import tqdm

    config, env, position, run = session.config, session.env, session.position, session.run
    steps = session.steps_per_epoch
    clock = RunClock(position.elapsed_seconds, position.global_step, config.epochs * steps)
    with StopFlag() as stop:
        for epoch in range(position.epoch, config.epochs):
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
            finished = train_one_epoch(session.wrapped, session.model, session.splits.train, session.optimizer,
                                       session.scheduler, session.ema, config, env, position,
                                       permutation_seed=config.seed * 1_000_003 + epoch, stop=stop, progress_bar=bar,
                                       clock=clock, log_lines=log_lines)
            bar.close()
            if not finished:
                position.elapsed_seconds = clock.elapsed()
                session.save_state()
                if env.is_main:
                    print(f"stopped at epoch {epoch + 1}, step {position.step_in_epoch}; state saved. "
                          f"Resume with: vitlab train --resume {run}")
                return {"status": "interrupted", "run_dir": str(run), "epoch": epoch, "step": position.step_in_epoch,
                        "signal": stop.signal}
            row, improved = end_epoch(session, epoch, epoch_started, seconds_before, clock)
            if env.is_main:
                every = max(1, config.epochs // 25)
                if config.progress and ((epoch + 1) % every == 0 or improved or epoch + 1 == config.epochs):
                    print(epoch_line(row, config.epochs, clock.remaining(position.global_step), improved), flush=True)
            if any_rank(stop.requested, env) and epoch + 1 < config.epochs:
                if env.is_main:
                    print(f"stopped after epoch {epoch + 1}; state saved. Resume with: vitlab train --resume {run}")
                return {"status": "interrupted", "run_dir": str(run), "epoch": epoch + 1, "step": 0,
                        "signal": stop.signal}
    session.elapsed_seconds = clock.elapsed()
    return None


def end_epoch(session: Session, epoch: int, epoch_started: float, seconds_before: float,
              clock: RunClock) -> tuple[dict[str, Any], bool]:
    """Validate (and test, if asked to show it), record the epoch's row, keep the best checkpoint by validation
    accuracy, save the training state. Returns the row and whether it is the best so far."""
    config, env, position, splits = session.config, session.env, session.position, session.splits
    if session.ema is not None:
        session.ema.copy_to(session.eval_model)
    loss_sum, correct, count = position.epoch_sums
    row = dict(epoch=epoch + 1, step=position.global_step, lr=peak_lr(session.scheduler),
               train_loss=loss_sum / count, train_top1=correct / count)
    if splits.validation is not None:
        val = evaluate(session.evaluated, splits.validation, config.eval_batch_size, env, config.precision)
        row.update(val_loss=val["loss"], val_top1=val["top1"], val_top5=val["top5"])
    if config.test_every_epoch:  # shown to the user; nothing below reads it
        test = evaluate(session.evaluated, splits.test, config.eval_batch_size, env, config.precision)
        row.update(test_loss=test["loss"], test_top1=test["top1"], test_top5=test["top5"])
    position.elapsed_seconds = clock.elapsed()
    row.update(images_per_second=count / max(position.train_seconds - seconds_before, 1e-9),
               epoch_seconds=time.perf_counter() - epoch_started, elapsed_seconds=position.elapsed_seconds)
    session.history.append(row)
    position.epoch, position.step_in_epoch, position.epoch_sums = epoch + 1, 0, [0.0, 0.0, 0.0]
    improved = splits.validation is not None and row["val_top1"] > position.best_val_top1
    if improved:
        position.best_val_top1, position.best_epoch = row["val_top1"], epoch + 1
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
                save_model(session.evaluated, best)
            except OSError as error:
                raise CheckpointError(f"could not save {best} ({error.strerror or error}); the previous best is "
                                      "intact") from None
    session.save_state()
    return row, improved


def finish(session: Session) -> dict[str, Any]:
    """The end of a run: the test split measured once (final model and best-validation checkpoint), the final
    model, pictures and summaries written."""
    env = session.env
    results = final_results(session.evaluated, session.splits, session.run / BEST, session.position,
                            session.config, env)
    replica_diff = replica_difference(session.model, env)
    summary = {"status": "finished", "run_dir": str(session.run), "replica_max_abs_diff": replica_diff}
    if env.is_main:
        summary = write_outputs(session, results, replica_diff)
        if session.writer is not None:
            session.writer.close()
    return summary


def final_results(final_model: VisionTransformer, splits: Splits, best_path: Path, position: Position,
                  config: TrainConfig, env: DistEnv) -> dict[str, Any]:
    """The figures measured once at the end: test (and validation) metrics of the final model, and test metrics
    of the best-validation checkpoint (the same model when the best epoch is the last)."""
    def measure(model: nn.Module, data: ImageDataset) -> dict[str, Any]:
        return evaluate(model, data, config.eval_batch_size, env, config.precision)

    results: dict[str, Any] = {"test": measure(final_model, splits.test), "val": None, "best_test": None}
    if splits.validation is not None:
        results["val"] = measure(final_model, splits.validation)
    if position.best_epoch == config.epochs:
        results["best_test"] = results["test"]
    elif position.best_epoch > 0:
        from vitlab.checkpoint.formats import load_model

        best = load_model(best_path).to(next(final_model.parameters()).device)
        results["best_test"] = measure(best, splits.test)
    return results


def require_tensorboard() -> None:
    try:
        import torch.utils.tensorboard  # noqa: F401 - only whether it is there
    except ImportError:
        raise ConfigError("tensorboard=True needs the tensorboard package: pip install tensorboard") from None
