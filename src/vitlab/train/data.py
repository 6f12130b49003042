"""The data of a training run: the request its recipe makes of `vitlab.data.loaders` (the data set, at the size,
channels and preprocessing of the model it trains), and the one decision a run records about it, whether image
files are held in memory or streamed through worker processes. A new kind of data source is a module under
`vitlab.data` and a row of `vitlab.data.loaders.LOADERS`; the training loop only asks the splits for batches."""

from __future__ import annotations

import os
from typing import Any

from vitlab.config import ViTConfig
from vitlab.data.loaders import can_stream, open_splits, streaming_choice
from vitlab.data.source import DataRequest, Splits
from vitlab.distributed import DistEnv, broadcast_object
from vitlab.errors import ConfigError
from vitlab.messages import say
from vitlab.preprocessing import Preprocessing
from vitlab.train.config import TrainConfig
from vitlab.train.setup import default_workers
from vitlab.variants import variant_config, variant_names


def choose_streaming(
    config: TrainConfig, env: DistEnv, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None
) -> bool | None:
    """Whether the run's image files are streamed (None: data that are arrays, always in memory), as
    `vitlab.data.loaders.streaming_choice` decides. Decided once, by rank 0, and given to every rank (each rank
    deciding from its own free memory could split them between the two paths); the caller records it in the
    recipe, so a resumed run and `vitlab eval` of the run choose alike. The free memory is shared among the
    processes torchrun starts on this machine, each of which holds a copy."""
    request = data_request(config, env, state, pretrained)
    if not can_stream(config.dataset) or request.image_size is None:
        return config.stream
    decision = None
    if env.is_main:
        decision = streaming_choice(request, int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)))
    stream, why = broadcast_object(decision, env)
    if stream and env.is_main:
        say(
            f"note: streaming {config.dataset} {config.data_dir} through {request.workers} worker process(es) "
            f"per training process ({why})"
        )
    return stream


def training_splits(
    config: TrainConfig, env: DistEnv, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None
) -> Splits:
    """The run's data: in memory (the array data sets, and image folders that fit), or streamed from their files
    through worker processes (manifests, tar shards, Hugging Face datasets, and folders too large to hold), as
    `config.stream` says (`choose_streaming`)."""
    return open_splits(data_request(config, env, state, pretrained))


def data_request(
    config: TrainConfig, env: DistEnv, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None
) -> DataRequest:
    """What the recipe asks of its data set: its splits (carved by val_size and seed, classes, max_train_images),
    image files decoded at the model's input size and channels under its contract, the training crop when
    streamed, and the decoding processes (`--set workers`, else this process's share of the cores)."""
    size = model_input_size(config, state, pretrained)
    if size is not None:
        size = (size, size) if isinstance(size, int) else tuple(size)
    return DataRequest(
        config.dataset,
        config.data_dir,
        image_size=size,
        channels=channels_of(config, state, pretrained),
        preprocessing=file_preprocessing(config, state, pretrained),
        classes=config.classes,
        val_size=config.val_size,
        seed=config.seed,
        max_train_images=config.max_train_images,
        stream=config.stream,
        augment=config.augment,
        workers=config.workers if config.workers is not None else default_workers(env),
        pin_memory=env.device.type == "cuda",
        shard_order=config.shard_order,
    )


def channels_of(config: TrainConfig, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None) -> int:
    """The channels streamed images are read with: the resumed or pre-trained model's, else the variant's (1 for
    the grey presets such as mnist-28, 3 for the paper's variants)."""
    if state is not None:
        return ViTConfig.from_json(state["model_config"]).in_chans
    if pretrained is not None:
        return pretrained[0].in_chans
    if config.model not in variant_names():  # build_model names the unknown variant
        return 3
    return variant_config(config.model, **config.model_overrides).in_chans


def file_preprocessing(
    config: TrainConfig, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None
) -> Preprocessing:
    """The contract image files are decoded under, which the trained model records: the resumed model's; else the
    recipe's (`model_overrides["preprocessing"]`), the pre-trained checkpoint's (fine-tuning reads images as it was
    pre-trained to see them) or vitlab's default for files, made NaFlex (its kernel and grey kept) when
    `input` is "naflex"."""
    if state is not None:
        return ViTConfig.from_json(state["model_config"]).preprocessing or Preprocessing.image_files()
    overrides = dict(config.model_overrides)
    asked = overrides.pop("preprocessing", None)
    if isinstance(asked, dict):
        asked = Preprocessing.from_dict(asked)
    contract = asked or (pretrained[0].preprocessing if pretrained is not None else None) or Preprocessing.image_files()
    if config.input != "naflex" or contract.mode == "naflex":
        return contract
    if pretrained is not None:
        patch = pretrained[0].patch_size
    elif config.model in variant_names():
        patch = variant_config(config.model, **overrides).patch_size
    else:
        return contract  # build_model names the unknown variant
    if patch[0] != patch[1]:
        raise ConfigError(f"input=naflex cuts square patches; this model's are {patch[0]}x{patch[1]}")
    return Preprocessing.naflex(
        patch[0], config.max_patches, resize=contract.resize, grey=contract.grey, upscale=config.naflex_upscale
    )


def model_input_size(
    config: TrainConfig, state: dict[str, Any] | None, pretrained: tuple[ViTConfig, Any] | None
) -> tuple[int, int] | None:
    """The image size the run's model takes: the saved model's on resume, else --image-size, else the
    checkpoint's (fine-tuning) or the variant's. None when the variant is unknown (build_model then says so)."""
    if state is not None:
        return ViTConfig.from_json(state["model_config"]).image_size
    if config.image_size is not None:
        return config.image_size
    if pretrained is not None:
        return pretrained[0].image_size
    if config.model in variant_names():
        return variant_config(config.model, **config.model_overrides).image_size
    return None
