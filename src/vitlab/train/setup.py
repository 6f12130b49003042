"""Setting a run up: the model a recipe trains (fresh, or a checkpoint prepared for fine-tuning), what is frozen,
the attention kernel for training, and the threads each process uses."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint.formats import model_from_state, read_checkpoint
from vitlab.data.source import BatchSource
from vitlab.distributed import DistEnv
from vitlab.errors import ConfigError
from vitlab.hardware import TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS, Threads, available_cores, use_threads
from vitlab.models.registry import create_model
from vitlab.models.vit import EMBEDDING_PARAMETERS, VisionTransformer, block_index, encoder_parameter_name
from vitlab.train.config import TrainConfig
from vitlab.train.freezing import frozen_names
from vitlab.variants import variant_names


def build_model(
    config: TrainConfig,
    data: BatchSource,
    pretrained: tuple[Any, Any] | None = None,
    head: dict[str, Any] | None = None,
) -> VisionTransformer:
    """A fresh model of the recipe's variant shaped for the data (classes, channels), or with `init_from`
    the pre-trained model prepared for fine-tuning (`pretrained`: its (config, state) when already read).
    head: the fields the objective takes from the data (`Objective.model_fields`; default: the data's classes),
    e.g. no head at all for an encoder being pre-trained."""
    head = head if head is not None else {"num_classes": data.num_classes, "class_names": data.class_names}
    if config.init_from:
        return build_finetune_model(config, data, pretrained, head)
    if config.model not in variant_names():
        raise ConfigError(
            f"unknown model {config.model!r}; choose a variant from `vitlab models` "
            "(fine-tuning from a checkpoint is `vitlab finetune`)"
        )
    fields: dict[str, Any] = dict(
        **head,
        in_chans=data.channels,
        drop_path=config.drop_path,
        dropout=config.dropout,
        preprocessing=data.preprocessing,
    )
    if config.image_size is not None:
        fields["image_size"] = config.image_size
    fields.update(config.model_overrides)
    return create_model(config.model, **fields)


def build_finetune_model(
    config: TrainConfig,
    data: BatchSource,
    pretrained: tuple[Any, Any] | None = None,
    head: dict[str, Any] | None = None,
) -> VisionTransformer:
    """The paper's transfer set-up (section 3.2): load any checkpoint, drop its head and pre-logits layer, attach
    a zero-initialised D x K head, and for a new image size keep the patch size and resample the position
    embedding to the new grid (2-D interpolation, class-token row kept)."""
    pretrained_config, state = pretrained or read_checkpoint(config.init_from, image_size=config.image_size)[:2]
    # The model records how its training data became input (mean/std stay the checkpoint's).
    model = model_from_state(
        pretrained_config.replace(drop_path=config.drop_path, dropout=config.dropout, preprocessing=data.preprocessing),
        state,
        config.init_from,
    )
    if model.config.representation_size:
        model.remove_representation()
    head = head if head is not None else {"num_classes": data.num_classes, "class_names": data.class_names}
    model.reset_head(head["num_classes"], head["class_names"])
    if config.image_size is not None:
        try:
            model.set_image_size(config.image_size, config.resample_mode)
        except ConfigError as error:
            raise ConfigError(
                f"{config.init_from} cannot be fine-tuned at image size {config.image_size}: {error}"
            ) from None
    return model


def apply_freezing(model: nn.Module, config: TrainConfig) -> None:
    """Freeze what the recipe says: with linear_probe all but the head; with freeze_blocks = k the embeddings
    and the first k blocks; with freeze = SPEC what the spec names (`vitlab.train.freezing`). Frozen parameters get
    no gradient and are left out of the optimizer."""
    blocks = len(getattr(model, "encoder", model).blocks)
    if config.freeze_blocks > blocks:
        raise ConfigError(f"freeze_blocks {config.freeze_blocks} is more than the model's {blocks} blocks")
    # A parameter as the freeze spec names it: its encoder's name, without the wrapper part a LoRA layer adds.
    spec_names = {name: encoder_parameter_name(name).replace(".base_layer", "") for name, _ in model.named_parameters()}
    by_spec = (
        frozen_names(list(spec_names.values()), config.freeze, blocks, EMBEDDING_PARAMETERS) if config.freeze else set()
    )
    for name, parameter in model.named_parameters():
        if config.linear_probe:
            frozen = not name.startswith(("head.", "head_dist."))
        elif config.freeze_blocks:
            block = block_index(name)
            frozen = encoder_parameter_name(name).startswith(EMBEDDING_PARAMETERS) or (
                block is not None and block < config.freeze_blocks
            )
        else:
            frozen = False
        if frozen or spec_names[name] in by_spec:
            parameter.requires_grad_(False)


def training_attention_kernel(config: TrainConfig, model: VisionTransformer, device: torch.device | None = None) -> str:
    """The recipe's attention kernel; for "auto" on a CPU the explicit softmax (with its own backward) up to
    TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS tokens, faster to train there, and SDPA above; on a GPU always SDPA, whose
    fused flash and memory-efficient kernels the explicit path cannot match."""
    if config.attention != "auto":
        return config.attention
    if device is not None and torch.device(device).type != "cpu":
        return "sdpa"
    return "explicit" if model.config.num_tokens <= TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS else "sdpa"


def processes_on_this_machine(env: DistEnv) -> int:
    """The training processes torchrun started on this machine (LOCAL_WORLD_SIZE), which share its cores."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))


def use_training_threads(config: TrainConfig, env: DistEnv) -> Threads:
    """Torch threads for one training process, set now (`vitlab.hardware.choose_threads`: `--set threads`, else
    OMP_NUM_THREADS, else the cores this process may use shared among this machine's processes), and why."""
    return use_threads(config.threads, processes_on_this_machine(env))


def default_workers(env: DistEnv) -> int:
    """Decoding processes per training process when data are streamed: the cores this machine's processes share,
    as for threads (decoding and the training step then take turns on them)."""
    return max(1, available_cores() // processes_on_this_machine(env))
