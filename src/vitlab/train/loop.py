"""Training: `train` runs a recipe end to end; `train_one_epoch` and `evaluate` are the plain steps.

The run folder holds everything a run produces:
    train_config.json  the recipe as run          metrics.jsonl  one JSON line per epoch
    checkpoints/last.pt    full training state (model, optimizer, schedule, EMA, RNG, position), every epoch
    checkpoints/previous.pt  the one before it, in case the last is damaged
    checkpoints/best.safetensors  the model with the best validation accuracy so far (vitlab format)
    model.safetensors  the final model          summary.txt / summary.json, curves.png, confusion.png
Model selection uses the validation split only (carved from the training images unless the data set has an
official one); the test split is measured once at the end, for the final and for the best-validation model.
Only rank 0 writes. Every file is written atomically, so the last good checkpoint survives any crash.

Randomness is made resumable: the data order of epoch e comes from a generator seeded with (seed, e), the
augmentation generator's state and the global RNG state are saved in the checkpoint, so a resumed run
continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.checkpoint.io import atomic_write_bytes, save_model
from vitlab.config import ViTConfig, variant_config, variant_names
from vitlab.data.datasets import ImageDataset, Splits, load_splits
from vitlab.data.preprocess import normalize, to_unit_range
from vitlab.data.transforms import Draws, augment_batch
from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.eval.classify import evaluate
from vitlab.models.vit import EMBEDDING_PARAMETERS, VisionTransformer
from vitlab.progress import LogLines, format_duration
from vitlab.train.config import TrainConfig
from vitlab.train.distributed import (DistEnv, all_reduce_sum, any_rank, broadcast_object, cleanup, gather_rng_states,
                                      init_distributed, replica_difference, synchronize)
from vitlab.train.optim import EMA, build_optimizer, build_scheduler


class TrainingError(VitlabError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


# ------------------------------------------------------------------------------------------------ set-up
def build_model(config: TrainConfig, data: ImageDataset) -> VisionTransformer:
    """A fresh model of the recipe's variant shaped for the data (classes, channels), or with `init_from`
    the pre-trained model prepared for fine-tuning."""
    if config.init_from:
        return build_finetune_model(config, data)
    if config.model not in variant_names():
        raise ConfigError(f"unknown model {config.model!r}; choose a variant from `vitlab models` "
                          "(fine-tuning from a checkpoint is `vitlab finetune`)")
    fields: dict[str, Any] = dict(num_classes=data.num_classes, in_chans=data.channels, class_names=data.class_names,
                                  drop_path=config.drop_path, dropout=config.dropout)
    if config.image_size is not None:
        fields["image_size"] = config.image_size
    fields.update(config.model_overrides)
    return VisionTransformer(variant_config(config.model, **fields))


def build_finetune_model(config: TrainConfig, data: ImageDataset) -> VisionTransformer:
    """The paper's transfer set-up (section 3.2): load any checkpoint, drop its head and pre-logits layer, attach
    a zero-initialised D x K head, and for a new image size keep the patch size and resample the position
    embedding to the new grid (2-D interpolation, class-token row kept)."""
    from vitlab.checkpoint.formats import model_from_state, read_checkpoint

    pretrained_config, state, _ = read_checkpoint(config.init_from, image_size=config.image_size)
    model = model_from_state(pretrained_config.replace(drop_path=config.drop_path, dropout=config.dropout), state,
                             config.init_from)
    if model.config.representation_size:
        model.remove_representation()
    model.reset_head(data.num_classes, data.class_names)
    if config.image_size is not None:
        try:
            model.set_image_size(config.image_size, config.resample_mode)
        except ConfigError as error:
            raise ConfigError(f"{config.init_from} cannot be fine-tuned at image size {config.image_size}: {error}") from None
    return model


def apply_freezing(model: VisionTransformer, config: TrainConfig) -> None:
    """Freeze what the recipe says: with linear_probe all but the head; with freeze_blocks = k the embeddings
    and the first k blocks. Frozen parameters get no gradient and are left out of the optimizer."""
    if config.freeze_blocks > len(model.blocks):
        raise ConfigError(f"freeze_blocks {config.freeze_blocks} is more than the model's {len(model.blocks)} blocks")
    for name, parameter in model.named_parameters():
        if config.linear_probe:
            frozen = not name.startswith(("head.", "head_dist."))
        elif config.freeze_blocks:
            frozen = name.startswith(EMBEDDING_PARAMETERS) or (
                name.startswith("blocks.") and int(name.split(".")[1]) < config.freeze_blocks)
        else:
            frozen = False
        if frozen:
            parameter.requires_grad_(False)


# Up to this many tokens "auto" trains with the explicit attention kernel: measured on a 2-core Xeon, 17 tokens
# (mnist-28) 1.05x the SDPA step, 50 tokens (4x4 patches on 28x28) even (`vitlab bench --train`).
TRAIN_EXPLICIT_ATTENTION_TOKENS = 32


def training_attention_kernel(config: TrainConfig, model: VisionTransformer) -> str:
    if config.attention != "auto":
        return config.attention
    return "explicit" if model.config.num_tokens <= TRAIN_EXPLICIT_ATTENTION_TOKENS else "sdpa"


def default_threads(env: DistEnv) -> int:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    return max(1, (os.cpu_count() or 1) // local_world)


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


# ------------------------------------------------------------------------------------------------ state
@dataclass
class Position:
    epoch: int = 0  # epochs fully done
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    global_step: int = 0
    best_val_top1: float = -1.0  # validation accuracy of the best checkpoint (-1: none yet, or no validation)
    best_epoch: int = -1
    train_seconds: float = 0.0  # inside training steps
    elapsed_seconds: float = 0.0  # wall time of the run at the last epoch end, over all its sessions
    best_elapsed_seconds: float = -1.0  # wall time at which the best validation accuracy was reached
    augment_state: torch.Tensor | None = None  # generator state mid-epoch
    epoch_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss sum, correct, count so far


def training_state(model: VisionTransformer, optimizer, scheduler, ema: EMA | None, position: Position,
                   config: TrainConfig, rng_states: torch.Tensor) -> dict[str, Any]:
    """Everything a resumed run needs; rng_states holds every rank's global RNG state (gather_rng_states)."""
    return {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "ema": ema.state if ema else None, "epoch": position.epoch, "step_in_epoch": position.step_in_epoch,
        "global_step": position.global_step, "best_val_top1": position.best_val_top1, "best_epoch": position.best_epoch,
        "train_seconds": position.train_seconds, "elapsed_seconds": position.elapsed_seconds,
        "best_elapsed_seconds": position.best_elapsed_seconds, "augment_state": position.augment_state,
        "epoch_sums": torch.tensor(position.epoch_sums, dtype=torch.float64),
        "torch_rng_state": rng_states[0], "rank_rng_states": rng_states, "model_config": model.config.to_json(),
        "train_config": json.dumps(config.to_dict()),
    }


def save_training_state(state: dict[str, Any], folder: Path) -> Path:
    """Write checkpoints/last.pt, keeping the one before as previous.pt, so that no crash or error loses the
    last good state: the new bytes are written and synced to a temporary file first; only then does last.pt
    become previous.pt and the temporary file become last.pt (two renames). A crash between the renames
    leaves previous.pt as the newest state, which `load_training_state` then takes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    last, previous, pending = folder / "last.pt", folder / "previous.pt", folder / "next.pt"
    try:
        atomic_write_bytes(pending, buffer.getvalue())
        if last.exists():
            os.replace(last, previous)
        os.replace(pending, last)
    except OSError as error:
        kept = last if last.exists() else previous
        raise CheckpointError(f"could not save the training state in {folder} ({error.strerror or error}); "
                              f"the last good checkpoint {kept} is intact") from None
    return last


def load_training_state(run_dir: Path, allow_previous: bool = False) -> dict[str, Any]:
    """The newest readable training state of a run; the previous one only when allowed."""
    folder = run_dir / "checkpoints"
    last_missing = not (folder / "last.pt").exists() and (folder / "previous.pt").exists()
    # A missing last.pt with a previous.pt means a stop between the two renames of a save: previous.pt is then
    # the newest state, so it is taken without asking. A damaged last.pt needs --use-previous.
    candidates = [folder / "last.pt"] + ([folder / "previous.pt"] if allow_previous or last_missing else [])
    problems = []
    for path in candidates:
        if not path.exists():
            problems.append(f"{path} does not exist")
            continue
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # unreadable: truncated, corrupt or refused
            problems.append(f"{path} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
    hint = "" if allow_previous or last_missing or not (folder / "previous.pt").exists() else \
        "; the previous checkpoint exists: add --use-previous to resume from it"
    raise CheckpointError(f"cannot resume {run_dir}: " + "; ".join(problems) + hint)


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


def train_one_epoch(model: nn.Module, core: VisionTransformer, data: ImageDataset, optimizer, scheduler,
                    ema: EMA | None, config: TrainConfig, env: DistEnv, position: Position,
                    permutation_seed: int, stop: StopFlag, progress_bar: Any = None,
                    clock: RunClock | None = None, log_lines: LogLines | None = None) -> bool:
    """Run the rest of one epoch from `position`; returns False if a stop was requested (state is consistent)."""
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
    model.train()
    sums = torch.tensor(position.epoch_sums, dtype=torch.float64)
    for step in range(position.step_in_epoch, steps_per_epoch):
        started = time.perf_counter()
        rows = order[step * batch:(step + 1) * batch][shard]
        images = to_unit_range(data.images[rows], data.max_value, core.config)
        images, targets = augment_batch(images, data.labels[rows], data.num_classes, config.augment,
                                        Draws(augment_rng, batch, shard), config.label_smoothing)
        images = normalize(images, core.config).to(env.device)
        targets, labels = targets.to(env.device), data.labels[rows].to(env.device)
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), dtype=torch.float64)
        correct = 0
        for micro, (x, t, y) in enumerate(zip(images.chunk(config.grad_accum), targets.chunk(config.grad_accum),
                                              labels.chunk(config.grad_accum))):
            last_micro = micro == config.grad_accum - 1
            sync = model.no_sync() if env.enabled and not last_micro else _null_context()
            with sync:
                with autocast:
                    logits = model(x)
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
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        if ema is not None:
            ema.update(core)
        sums += local
        position.step_in_epoch = step + 1
        position.global_step += 1
        position.train_seconds += time.perf_counter() - started
        if progress_bar is not None:
            progress_bar.update(1)
            progress_bar.set_postfix(loss=f"{sums[0] / sums[2]:.3f}", acc=f"{sums[1] / sums[2]:.3f}",
                                     lr=f"{scheduler.get_last_lr()[0]:.2e}",
                                     img_s=f"{len(images) * env.world_size / (time.perf_counter() - started):.0f}",
                                     run_left=format_duration(clock.remaining(position.global_step)) if clock else "?")
        if log_lines is not None:
            log_lines.update(1, loss=f"{sums[0] / sums[2]:.4f}", train=f"{100 * sums[1] / sums[2]:.1f}%",
                             lr=f"{scheduler.get_last_lr()[-1]:.2e}",
                             tail=f"run {format_duration(clock.remaining(position.global_step)) if clock else '?'} left")
        position.epoch_sums = sums.tolist()
        if any_rank(stop.requested, env) and step + 1 < steps_per_epoch:
            position.augment_state = augment_rng.get_state()
            return False
    position.augment_state = None
    return True


class _null_context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


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


def new_run_dir(config: TrainConfig, env: DistEnv) -> Path:
    name = config.run_name or f"{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    name = broadcast_object(name, env)
    run_dir = Path(config.out_dir) / name
    if env.is_main:
        if (run_dir / "checkpoints" / "last.pt").exists():
            raise ConfigError(f"run folder {run_dir} already holds a run; resume it with --resume {run_dir} "
                              "or choose another --set run_name=...")
    # Not created here: the first file written makes it, after data, model and schedule are checked, so a
    # command that fails before training leaves no empty run folder behind.
    return run_dir


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_metrics(path: Path, before_epoch: int | None = None) -> list[dict[str, Any]]:
    """Metric rows (dropping any torn last line and, on resume, rows of epochs that will be redone)."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if before_epoch is None or row["epoch"] <= before_epoch:
                rows.append(row)
    return rows


def train(config: TrainConfig, resume: str | Path | None = None, use_previous: bool = False,
          epochs: int | None = None) -> dict[str, Any]:
    """Train a recipe (or resume a run folder) to the end; returns the summary (also written to the run).
    epochs: with `resume`, a new length for the run (e.g. to extend a finished one); the learning rate then
    follows the schedule of a run of that length from where the run stands."""
    env = init_distributed()
    try:
        summary = _train(config, resume, use_previous, env, epochs)
        # Leave together: rank 0 may still be writing (a stop's checkpoint, the final report) when the others
        # return, and a worker that tore down its process group and exited meanwhile was once seen to abort in
        # the teardown ("terminate called without an active exception", exit -6) after a SIGTERM stop.
        synchronize(env)
        return summary
    finally:
        cleanup(env)


def _train(config: TrainConfig, resume: str | Path | None, use_previous: bool, env: DistEnv,
           new_epochs: int | None = None) -> dict[str, Any]:
    state = None
    old_epochs = None
    if resume is not None:
        run_dir = Path(resume)
        state = load_training_state(run_dir, allow_previous=use_previous)
        config = TrainConfig.from_dict(json.loads(state["train_config"]))
        if new_epochs is not None and new_epochs != config.epochs:
            done = state["epoch"] + (1 if state["step_in_epoch"] else 0)
            if new_epochs < done:
                raise ConfigError(f"{run_dir} has already trained {done} epochs; --epochs must be at least that "
                                  f"to extend it (the recipe's length is {config.epochs})")
            old_epochs, config.epochs = config.epochs, new_epochs
    torch.set_num_threads(config.threads or default_threads(env))
    torch.manual_seed(config.seed + env.rank)
    if config.tensorboard and env.is_main:
        open_tensorboard(None, config, env)  # fail before anything is written if tensorboard is missing
    if resume is None:
        run_dir = new_run_dir(config, env)
    splits = load_splits(config.dataset, config.data_dir, config.val_size, config.seed, config.image_size,
                         config.classes, max_train_images=config.max_train_images)
    train_data, val_data, test_data = splits.train, splits.validation, splits.test
    if train_data.num_classes < 2:
        raise DataError(f"{train_data.name} has a single class; a classifier needs at least two")
    if state is not None:
        core = VisionTransformer(ViTConfig.from_json(state["model_config"]))
        core.load_state_dict(state["model"])
    else:
        core = build_model(config, train_data)
    apply_freezing(core, config)
    core.set_attention_kernel(training_attention_kernel(config, core))
    if config.augment.hflip and not train_data.hflip and env.is_main:
        print(f"note: horizontal flips change the meaning of {config.dataset} images; flips are off")
        config.augment.hflip = False
    if config.batch_size % env.world_size:
        raise ConfigError(f"batch_size {config.batch_size} does not divide over {env.world_size} processes")
    if (config.batch_size // env.world_size) % config.grad_accum:
        raise ConfigError(f"the per-process batch {config.batch_size // env.world_size} does not divide into "
                          f"{config.grad_accum} micro-batches")
    steps_per_epoch = len(train_data) // config.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size {config.batch_size} is larger than the {len(train_data)} training images; "
                          f"use --set batch_size={2 ** int(math.log2(len(train_data)))}")
    core.to(env.device)
    model: nn.Module = core
    if env.enabled:
        model = nn.parallel.DistributedDataParallel(core, device_ids=[env.device] if env.device.type == "cuda" else None)
    if config.compile:
        model = torch.compile(model)
    optimizer = build_optimizer(core, config.optimizer, config.lr, config.weight_decay, config.momentum,
                                config.layer_decay)
    total_steps = config.epochs * steps_per_epoch
    warmup_steps, notes = fit_schedule(config, len(train_data), steps_per_epoch)
    if env.is_main and state is None:
        for note in notes:
            print(f"note: {note}")
    scheduler = build_scheduler(optimizer, warmup_steps, total_steps, config.min_lr / config.lr)
    ema = EMA(core, config.ema_decay) if config.ema_decay > 0 else None
    position = Position()
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if old_epochs is not None:  # the new length's schedule applies from the very next step
            previous_lr = optimizer.param_groups[-1]["lr"]
            for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
                group["lr"] = base_lr * factor(scheduler.last_epoch)
            scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
            if env.is_main:
                print(f"extending {run_dir} from {old_epochs} to {config.epochs} epochs: the learning rate now follows "
                      f"a {config.epochs}-epoch schedule, {previous_lr:.2e} -> {optimizer.param_groups[-1]['lr']:.2e} "
                      f"at step {scheduler.last_epoch} of {total_steps}")
        if ema is not None and state["ema"] is not None:
            ema.state = {k: v.to(env.device) for k, v in state["ema"].items()}
        position = Position(
            epoch=state["epoch"], step_in_epoch=state["step_in_epoch"], global_step=state["global_step"],
            best_val_top1=state.get("best_val_top1", -1.0), best_epoch=state["best_epoch"],
            train_seconds=state["train_seconds"], elapsed_seconds=state.get("elapsed_seconds", 0.0),
            best_elapsed_seconds=state.get("best_elapsed_seconds", -1.0), augment_state=state["augment_state"],
            epoch_sums=state["epoch_sums"].tolist())
        rank_states = state.get("rank_rng_states")
        if rank_states is not None and len(rank_states) == env.world_size:
            # clone(): torch 2.13's set_rng_state segfaults on a row view with a storage offset (seen here).
            torch.set_rng_state(rank_states[env.rank].clone())  # each rank continues its own stream exactly
        else:  # resumed on another number of processes: rank 0's stream, fresh distinct ones for the others
            torch.set_rng_state(state["torch_rng_state"].clone())
            if env.rank:
                torch.manual_seed(config.seed + env.rank + position.global_step)
    checkpoints = run_dir / "checkpoints"
    metrics_path = run_dir / "metrics.jsonl"
    history = read_metrics(metrics_path, before_epoch=position.epoch)
    if env.is_main:
        atomic_write_bytes(run_dir / "train_config.json", json.dumps(config.to_dict(), indent=1).encode())
        if state is not None:  # drop rows of epochs that will be redone, so the file matches the state
            atomic_write_bytes(metrics_path, "".join(json.dumps(r) + "\n" for r in history).encode())
    writer = open_tensorboard(run_dir, config, env)
    eval_model = None
    if ema is not None:
        # Its random init is overwritten by the EMA weights; building it must not draw from the global RNG, or a
        # resumed run (which builds it after restoring that RNG) would diverge from an uninterrupted one.
        with torch.random.fork_rng(devices=[]):
            eval_model = VisionTransformer(core.config).to(env.device)
    if env.is_main:
        params = sum(p.numel() for p in core.parameters())
        trainable = sum(p.numel() for p in core.parameters() if p.requires_grad)
        what = f"fine-tuning {config.init_from}" if config.init_from else f"training {config.model}"
        validation = "no validation" if val_data is None else f"{len(val_data)} validation ({splits.validation_source}" + (
            f", seed {config.seed})" if splits.validation_source == "carved" else ")")
        print(f"{what} ({params / 1e6:.2f}M parameters, {trainable / 1e6:.2f}M trainable) on {config.dataset}: "
              f"{len(train_data)} train / {validation} / {len(test_data)} test images, {config.epochs} epochs of "
              f"{steps_per_epoch} steps, batch {config.batch_size}, {env.world_size} process(es) on "
              f"{env.device.type}; run folder {run_dir}")
        if state is not None:
            print(f"resuming at epoch {position.epoch + 1}, step {position.step_in_epoch} of {steps_per_epoch}")

    from tqdm import tqdm

    clock = RunClock(position.elapsed_seconds, position.global_step, config.epochs * steps_per_epoch)
    with StopFlag() as stop:
        for epoch in range(position.epoch, config.epochs):
            bar = tqdm(total=steps_per_epoch, initial=position.step_in_epoch, desc=f"epoch {epoch + 1}/{config.epochs}",
                       leave=False, dynamic_ncols=True,
                       # None: tqdm shows the bar only on a terminal, so logs get the epoch lines alone.
                       disable=None if env.is_main and config.progress else True)
            epoch_started = time.perf_counter()
            seconds_before = position.train_seconds
            log_lines = None
            if bar.disable and env.is_main and config.progress:  # no terminal, no bar: lines in the log instead
                every = config.log_every_steps or (-(-steps_per_epoch // 4) if steps_per_epoch >= 40 else 0)
                if every:
                    log_lines = LogLines(steps_per_epoch, f"epoch {epoch + 1:>3}/{config.epochs}", every,
                                         done=position.step_in_epoch, left_label="epoch")
            finished = train_one_epoch(model, core, train_data, optimizer, scheduler, ema, config, env, position,
                                       permutation_seed=config.seed * 1_000_003 + epoch, stop=stop, progress_bar=bar,
                                       clock=clock, log_lines=log_lines)
            bar.close()
            if not finished:
                position.elapsed_seconds = clock.elapsed()
                rng_states = gather_rng_states(env)
                if env.is_main:
                    save_training_state(training_state(core, optimizer, scheduler, ema, position, config, rng_states),
                                        checkpoints)
                    print(f"stopped at epoch {epoch + 1}, step {position.step_in_epoch}; state saved. "
                          f"Resume with: vitlab train --resume {run_dir}")
                return {"status": "interrupted", "run_dir": str(run_dir), "epoch": epoch, "step": position.step_in_epoch,
                        "signal": stop.signal}
            if ema is not None:
                ema.copy_to(eval_model)
            loss_sum, correct, count = position.epoch_sums
            epoch_seconds = position.train_seconds - seconds_before
            row = dict(epoch=epoch + 1, step=position.global_step, lr=scheduler.get_last_lr()[0],
                       train_loss=loss_sum / count, train_top1=correct / count)
            if val_data is not None:
                val = evaluate(eval_model or core, val_data, config.eval_batch_size, env, config.precision)
                row.update(val_loss=val["loss"], val_top1=val["top1"], val_top5=val["top5"])
            if config.test_every_epoch:  # shown to the user; nothing below reads it
                test = evaluate(eval_model or core, test_data, config.eval_batch_size, env, config.precision)
                row.update(test_loss=test["loss"], test_top1=test["top1"], test_top5=test["top5"])
            position.elapsed_seconds = clock.elapsed()
            row.update(images_per_second=count / max(epoch_seconds, 1e-9),
                       epoch_seconds=time.perf_counter() - epoch_started, elapsed_seconds=position.elapsed_seconds)
            history.append(row)
            position.epoch, position.step_in_epoch, position.epoch_sums = epoch + 1, 0, [0.0, 0.0, 0.0]
            improved = val_data is not None and row["val_top1"] > position.best_val_top1
            if improved:
                position.best_val_top1, position.best_epoch = row["val_top1"], epoch + 1
                position.best_elapsed_seconds = position.elapsed_seconds
            rng_states = gather_rng_states(env)
            if env.is_main:
                append_metrics(metrics_path, row)
                if writer is not None:
                    for key, value in row.items():
                        if key not in ("epoch", "step"):
                            writer.add_scalar(key, value, epoch + 1)
                if improved:
                    try:
                        save_model(eval_model or core, checkpoints / "best.safetensors")
                    except OSError as error:
                        raise CheckpointError(f"could not save {checkpoints / 'best.safetensors'} "
                                              f"({error.strerror or error}); the previous best is intact") from None
                save_training_state(training_state(core, optimizer, scheduler, ema, position, config, rng_states),
                                    checkpoints)
                every = max(1, config.epochs // 25)
                if config.progress and ((epoch + 1) % every == 0 or improved or epoch + 1 == config.epochs):
                    print(epoch_line(row, config.epochs, clock.remaining(position.global_step), improved), flush=True)
            if any_rank(stop.requested, env) and epoch + 1 < config.epochs:
                if env.is_main:
                    print(f"stopped after epoch {epoch + 1}; state saved. Resume with: vitlab train --resume {run_dir}")
                return {"status": "interrupted", "run_dir": str(run_dir), "epoch": epoch + 1, "step": 0,
                        "signal": stop.signal}
    final_model = eval_model or core
    results = final_results(final_model, splits, checkpoints / "best.safetensors", position, config, env)
    replica_diff = replica_difference(core, env)
    summary = {"status": "finished", "run_dir": str(run_dir), "replica_max_abs_diff": replica_diff}
    if env.is_main:
        summary = write_outputs(run_dir, final_model, results, history, position, config, splits, env,
                                replica_diff, clock.elapsed())
        if writer is not None:
            writer.close()
    return summary


def epoch_line(row: dict[str, Any], epochs: int, seconds_left: float | None, improved: bool) -> str:
    """One line per epoch: training figures, validation accuracy (which chooses), test accuracy only when
    asked for (labelled as not used), speed and time left."""
    text = (f"epoch {row['epoch']:>3}/{epochs}  loss {row['train_loss']:.4f}  train {100 * row['train_top1']:5.1f}%")
    if "val_top1" in row:
        text += f"  val {100 * row['val_top1']:5.2f}%"
    if "test_top1" in row:
        text += f"  (test {100 * row['test_top1']:5.2f}%, not used to choose)"
    text += f"  {row['images_per_second']:.0f} img/s  {format_duration(row['elapsed_seconds'])}"
    if row["epoch"] < epochs:
        text += f", {format_duration(seconds_left)} left"
    return text + ("  best" if improved else "")


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


def open_tensorboard(run_dir: Path, config: TrainConfig, env: DistEnv):
    """A SummaryWriter in the run folder (None if off); with run_dir=None only checks the package is there."""
    if not (config.tensorboard and env.is_main):
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("tensorboard=True needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(run_dir / "tensorboard") if run_dir is not None else None


def write_outputs(run_dir: Path, model: VisionTransformer, results: dict[str, Any], history: list[dict[str, Any]],
                  position: Position, config: TrainConfig, splits: Splits, env: DistEnv,
                  replica_diff: float = 0.0, wall_seconds: float = 0.0) -> dict[str, Any]:
    from vitlab import plots

    final, best_test, val = results["test"], results["best_test"], results["val"]
    model_path = save_model(model, run_dir / "model.safetensors")
    plots.plot_training_curves(history, run_dir / "curves.png")
    plots.plot_confusion(final["confusion"], final["class_names"], run_dir / "confusion.png",
                         title=f"{config.dataset} test set: {100 * final['top1']:.2f}% top-1")
    throughput = sum(r["images_per_second"] * r["epoch_seconds"] for r in history) / max(
        sum(r["epoch_seconds"] for r in history), 1e-9)
    has_best = position.best_epoch > 0
    summary = {
        "status": "finished", "run_dir": str(run_dir), "model_path": str(model_path), "dataset": config.dataset,
        "model": config.model, "params": sum(p.numel() for p in model.parameters()), "epochs": config.epochs,
        "processes": env.world_size, "replica_max_abs_diff": replica_diff, "seed": config.seed,
        "wall_seconds": round(wall_seconds, 2), "train_seconds": round(position.train_seconds, 2),
        "train_images_per_second": round(throughput, 1), "train_count": len(splits.train),
        "validation": splits.validation_source, "val_count": len(splits.validation) if splits.validation else 0,
        "val_top1": val["top1"] if val else None,
        "best_val_top1": position.best_val_top1 if has_best else None,
        "best_epoch": position.best_epoch if has_best else None,
        "seconds_to_best": round(position.best_elapsed_seconds, 2) if has_best else None,
        "test_top1": final["top1"], "test_top5": final["top5"], "test_loss": final["loss"], "test_count": final["count"],
        "best_checkpoint_test_top1": best_test["top1"] if best_test else None,
        "per_class_top1": dict(zip(final["class_names"], final["per_class"])),
    }
    atomic_write_bytes(run_dir / "summary.json", json.dumps(summary, indent=1).encode())
    worst = sorted(summary["per_class_top1"].items(), key=lambda item: item[1])[:3]
    lines = [
        f"vitlab {'finetune' if config.init_from else 'train'}: {config.init_from or config.model} on "
        f"{config.dataset}{'' if config.classes is None else ' classes ' + str(config.classes)} - finished",
        f"  model        {summary['params'] / 1e6:.3f}M parameters, {model.config.num_patches} patches of "
        f"{model.config.patch_size[0]}x{model.config.patch_size[1]} on {model.config.image_size[0]}x{model.config.image_size[1]} images",
        f"  training     {config.epochs} epochs in {format_duration(wall_seconds)} ({position.train_seconds:.1f} s in "
        f"training steps, {summary['train_images_per_second']:.0f} images/s, {env.world_size} process(es))",
    ]
    if has_best:
        lines.append(f"  validation   best top-1 {100 * position.best_val_top1:.2f}% at epoch {position.best_epoch}, "
                     f"reached after {format_duration(position.best_elapsed_seconds)} ({summary['val_count']} "
                     f"{splits.validation_source} images; chooses the best checkpoint)")
    else:
        lines.append("  validation   none (val_size 0): no best checkpoint is chosen")
    lines.append(f"  test         final model: top-1 {100 * final['top1']:.2f}%  top-5 {100 * final['top5']:.2f}%  "
                 f"loss {final['loss']:.4f}  ({final['count']} images, measured once, at the end)")
    if best_test is not None:
        lines.append(f"               best-validation checkpoint (epoch {position.best_epoch}): top-1 "
                     f"{100 * best_test['top1']:.2f}%")
    lines += [
        "  weakest      " + ", ".join(f"{name}: {100 * acc:.1f}%" for name, acc in worst),
        f"  files        {model_path}, checkpoints/, metrics.jsonl, curves.png, confusion.png",
    ]
    text = "\n".join(lines)
    atomic_write_bytes(run_dir / "summary.txt", (text + "\n").encode())
    print(text)
    return summary
