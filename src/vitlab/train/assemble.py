"""Assembling a run for its epochs: the run folder, the data, the objective, the model (a fresh one of the recipe's
variant, a checkpoint prepared for fine-tuning, or the one a saved state holds), the optimizer and schedule, the
EMA and the precision, fresh or restored from a saved state (`vitlab.train.state.restore`). `start` returns the
`Session` the loop trains. Everything that can be wrong with the recipe or the data is found before the run folder
is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.formats import read_checkpoint
from vitlab.counts import model_size
from vitlab.data.datasets import ImageDataset
from vitlab.data.source import steps_per_epoch as whole_batches
from vitlab.distributed import DistEnv, broadcast_object, fetch_once
from vitlab.errors import ConfigError
from vitlab.hardware import Choice, choose_precision, save_memory_over_speed
from vitlab.kernels import describe_kernel, model_fp32_kernel
from vitlab.layers.onednn_linear import use_fp32_kernel
from vitlab.models.checkpointing import set_grad_checkpointing
from vitlab.models.registry import create_model
from vitlab.models.vit import VisionTransformer
from vitlab.objectives import build_objective
from vitlab.objectives.base import BATCH_AUGMENTATION
from vitlab.runs import RunFolder, default_run_name
from vitlab.train.config import TrainConfig
from vitlab.train.data import choose_streaming, training_splits
from vitlab.train.elastic import remember_resumed, remember_run
from vitlab.train.fsdp import data_parallel_reason, mixed_precision_policy, shard_model
from vitlab.train.lora import prepare_lora
from vitlab.train.optim import EMA, build_optimizer
from vitlab.train.schedule import build_scheduler, fit_schedule, suggested_batch_size
from vitlab.train.session import Session
from vitlab.train.setup import apply_freezing, build_model, training_attention_kernel, use_training_threads
from vitlab.train.sharded_state import SHARDED_KEY, load_sharded_state
from vitlab.train.state import Position, check_resumable, restore, restored_model
from vitlab.train.step import TrainingStep
from vitlab.train.summary import announce, say_note


def start(config: TrainConfig, env: DistEnv, state: dict[str, Any] | None, run_dir: Path | None) -> Session:
    """Data, model, optimizer and schedule of a run, fresh or restored from `state` (of the run in `run_dir`);
    the run folder's recipe written."""
    threads = use_training_threads(config, env)
    if config.grad_checkpointing:  # before the model is read: its tensors then come from mappings, not the heap
        save_memory_over_speed()  # else the heap `vitlab` keeps for speed takes back what checkpointing saves
    torch.manual_seed(config.seed + env.rank)
    if config.tensorboard and env.is_main:
        require_tensorboard()  # fail before anything is written if tensorboard is missing
    run = RunFolder(run_dir) if run_dir is not None else new_run_folder(config, env)
    if run_dir is not None and env.is_main:  # a restart of this job then knows the run it finishes (train.restarts)
        remember_resumed(run)
    if config.init_from:  # the recipe and summary name the checkpoint the model comes from, not a variant default
        config.model = str(config.init_from)
    pretrained = None
    if state is None and config.init_from:
        # A pre-trained name is downloaded by one process per machine; the others then find it in the cache.
        pretrained = fetch_once(lambda: read_checkpoint(config.init_from, image_size=config.image_size)[:2], env)
    # Image files are decoded at the size the model takes (its variant's, its checkpoint's or --image-size), as
    # `predict`, `eval` and `serve` read them; in-memory data sets are resized per batch whatever this is.
    config.stream = choose_streaming(config, env, state, pretrained)  # recorded in the recipe written below
    # Under torchrun one process per machine loads first (and downloads, where the files are not cached); the
    # others then find them verified in the cache, instead of racing for the same partial file.
    splits = fetch_once(lambda: training_splits(config, env, state, pretrained), env)
    # An objective may load models (distillation's teachers, by pre-trained name too): one process per machine first.
    objective = fetch_once(lambda: build_objective(config, splits.train), env)
    objective.check_data(splits.train)
    if state is not None:
        model = restored_model(state)
    else:
        model = build_model(config, splits.train, pretrained, objective.model_fields(splits.train))
        model = objective.adapt_model(model)  # e.g. a segmentation head on the encoder
    if config.lora.enabled:  # adapters on the blocks (a restored model has them already), the base recorded
        prepare_lora(model, config.lora, str(config.init_from), pretrained[1] if pretrained else None, run, env.is_main)
    apply_freezing(model, config)
    model.set_attention_kernel(training_attention_kernel(config, model, env.device))
    if config.augment.hflip and not objective.allows_flips(splits.train):
        # Every rank turns flips off (each draws its augmentation from the same stream); rank 0 says so.
        say_note(f"horizontal flips change the meaning of {config.dataset} images; flips are off", env)
        config.augment.hflip = False
    # Streamed NaFlex images arrive as cut patches of their own grids; a stored-array set's share one grid and
    # stay whole pixel batches, which every augmentation takes.
    if getattr(splits.train.preprocessing, "mode", None) == "naflex" and not isinstance(splits.train, ImageDataset):
        whole_image = whole_image_augmentation(config.augment)
        if whole_image:
            # Images at their own sizes arrive as cut patches: what moves whole images of one size cannot apply.
            say_note(
                f"input=naflex: batch augmentation of whole images is off ({', '.join(whole_image)}); "
                "the per-image crops and flips stay",
                env,
            )
            for name in whole_image:
                setattr(config.augment, name, 0)
    steps_per_epoch = check_batching(config, env, len(splits.train))
    # What trains: the model, or the objective's module around it (MAE's decoder, masked patch prediction's head).
    trained = objective.attach(model)
    set_grad_checkpointing(trained, config.grad_checkpointing)
    trained.to(env.device)
    resolved_precision = training_precision(config, model, env)  # FSDP's mixed precision follows it
    wrapped = wrap_for_training(trained, config, env, model, resolved_precision.value, objective.name)
    optimizer = build_optimizer(
        trained,
        config.optimizer,
        config.lr,
        config.weight_decay,
        config.momentum,
        config.layer_decay,
        config.adam_betas,
        objective.learning_rate_scales(trained),
    )
    warmup_steps, notes = fit_schedule(config, len(splits.train), steps_per_epoch)
    if state is None:  # a resumed run was told at its start
        for note in notes:
            say_note(note, env)
    scheduler = build_scheduler(optimizer, warmup_steps, config.epochs * steps_per_epoch, config.min_lr / config.lr)
    ema = EMA(model, config.ema_decay) if config.ema_decay > 0 else None
    position = Position(epoch_sums=objective.empty_sums())
    data_fingerprint = splits.train.fingerprint()
    if state is not None:
        for note in check_resumable(state, data_fingerprint, steps_per_epoch, env.world_size, run):
            say_note(note, env)
        load_sharded_state(state, run, trained, optimizer)  # an FSDP run's model and optimizer, on any process count
        position = restore(state, optimizer, scheduler, ema, objective, config, env, run, steps_per_epoch)
    history = run.read_metrics(before_epoch=position.epoch)
    if env.is_main:
        run.write_recipe(config.to_dict())
        # The file must match the state: on resume the rows of epochs that will be redone go; on a fresh start
        # every row goes (a start killed after writing an epoch's row but before its state leaves one behind).
        run.rewrite_metrics(history)
    eval_model = objective.evaluated_model(model) or ema_model(model, ema, env)  # DINO: its teacher
    precision = training_linear_kernel(resolved_precision, config, model, env)
    step = TrainingStep(
        wrapped,
        objective,
        optimizer,
        scheduler,
        ema,
        model,
        env,
        config.grad_accum,
        config.grad_clip,
        precision.value,
        forward=objective.forward,
    )
    session = Session(
        config,
        run,
        env,
        splits,
        model,
        wrapped,
        optimizer,
        scheduler,
        ema,
        eval_model,
        position,
        history,
        steps_per_epoch,
        objective,
        step,
        data_fingerprint,
        precision,
        threads=threads,
        writer=run.tensorboard_writer() if config.tensorboard and env.is_main else None,
        sharded_state=state.get(SHARDED_KEY) if state is not None else None,
    )
    if env.is_main:
        announce(session, resumed=state is not None)
    return session


def new_run_folder(config: TrainConfig, env: DistEnv) -> RunFolder:
    """The folder of a new run, named alike on every rank (rank 0's name, and time, wins); one that holds a run
    already is refused."""
    name = config.run_name or default_run_name(config.dataset, config.out_dir)
    run = RunFolder(Path(config.out_dir) / broadcast_object(name, env))
    if env.is_main and run.holds_run:
        raise ConfigError(
            f"run folder {run} already holds a run; resume it with --resume {run} or choose another --set run_name=..."
        )
    if env.is_main:  # under torchrun's elastic agent, its restarts find the run here (vitlab.train.elastic)
        remember_run(run, config)
    return run


def wrap_for_training(
    trained: nn.Module,
    config: TrainConfig,
    env: DistEnv,
    model: nn.Module | None = None,
    precision: str = "fp32",
    objective_name: str = "",
) -> nn.Module:
    """What runs the steps: `trained` itself, sharded in place by FSDP2 (`parallel=fsdp` under torchrun, in
    `precision`: `vitlab.train.fsdp`), in DDP under torchrun, compiled when the recipe asks. `model` is the model
    inside `trained` (default: `trained`). A run that asks for FSDP and cannot have it is told why in one line."""
    wrapped: nn.Module = trained
    fallback = data_parallel_reason(config, env, trained, trained if model is None else model, objective_name)
    if fallback is not None:
        say_note(fallback, env)
    if config.parallel == "fsdp" and fallback is None:
        shard_model(trained, mixed_precision_policy(precision, env.device))
    elif env.enabled:
        wrapped = nn.parallel.DistributedDataParallel(
            trained, device_ids=[env.device] if env.device.type == "cuda" else None
        )
    if config.compile:
        wrapped = torch.compile(wrapped)
    return wrapped


def ema_model(model: VisionTransformer, ema: EMA | None, env: DistEnv) -> VisionTransformer | None:
    """The model that holds the EMA weights for evaluation and saving (None without EMA)."""
    if ema is None:
        return None
    # Its random init is overwritten by the EMA weights; building it must not draw from the global RNG, or a
    # resumed run (which builds it after restoring that RNG) would diverge from an uninterrupted one.
    with torch.random.fork_rng(devices=[]):
        eval_model = create_model(model.config).to(env.device)
    # From the start it holds the EMA weights, not only after an epoch's end: a run resumed after its last
    # epoch goes straight to `finish`, which tests and saves these weights.
    ema.copy_to(eval_model)
    return eval_model


def training_precision(config: TrainConfig, model: VisionTransformer, env: DistEnv) -> Choice:
    """The recipe's precision on this machine: "auto" becomes bf16 autocast where bf16 matmuls pay here (see
    `vitlab.hardware.choose_precision`), else fp32. Every process decides from rank 0's answer, so a job spread
    over unlike machines still runs one precision."""
    return broadcast_object(choose_precision(config.precision, env.device, model_size(model.config)[1], "train"), env)


def training_linear_kernel(precision: Choice, config: TrainConfig, model: VisionTransformer, env: DistEnv) -> Choice:
    """An fp32 step on the CPU runs its linear layers on the fp32 kernel that measured fastest here for the
    model's shape (`vitlab.kernels`; rank 0 measures, every rank follows); `precision` comes back with the choice
    added to its reason. Compiled steps keep Inductor's own kernels."""
    if precision.value != "fp32" or env.device.type != "cpu" or config.compile:
        return precision
    per_step = max(1, config.batch_size // (config.grad_accum * env.world_size))
    kernel = broadcast_object(model_fp32_kernel(model.config, "train", per_step) if env.is_main else None, env)
    use_fp32_kernel(model, "torch", kernel.value)
    return Choice("fp32", f"{precision.reason}; {describe_kernel(kernel)}")


def check_batching(config: TrainConfig, env: DistEnv, train_images: int) -> int:
    """Steps per epoch, after checking that the batch splits over processes and micro-batches and fits the data."""
    if config.batch_size % env.world_size:
        raise ConfigError(f"batch_size {config.batch_size} does not divide over {env.world_size} processes")
    if (config.batch_size // env.world_size) % config.grad_accum:
        raise ConfigError(
            f"the per-process batch {config.batch_size // env.world_size} does not divide into "
            f"{config.grad_accum} micro-batches"
        )
    steps_per_epoch = whole_batches(train_images, config.batch_size)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"batch_size {config.batch_size} is larger than the {train_images} training images; "
            f"use --set batch_size={suggested_batch_size(train_images)}"
        )
    return steps_per_epoch


def require_tensorboard() -> None:
    """Refuse a recipe asking for TensorBoard logs where the tensorboard package is missing, with the fix."""
    try:
        import torch.utils.tensorboard  # noqa: F401 - only whether it is there
    except ImportError:
        raise ConfigError("tensorboard=True needs the tensorboard package: pip install tensorboard") from None


def whole_image_augmentation(augment: Any) -> list[str]:
    """The batch augmentations that are on and move whole images of one size (flips aside: streamed crops flip
    each image in the workers)."""
    return [name for name in BATCH_AUGMENTATION if name != "hflip" and getattr(augment, name)]
