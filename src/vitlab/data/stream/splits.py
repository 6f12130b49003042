"""The three splits of a training run over streamed data, carved by the carving the in-memory ones use
(`vitlab.data.carving.carve_splits`, so a folder gives the same train / validation / test files either way): the
`SplitsOpener` of streamed data sets.

Data sets named by where they are: `folder` (class sub-folders, or train/ val/ test/ trees), `manifest` (a CSV
or JSON-lines file of path and label), `shards` (WebDataset-style tar shards: a file, a list or a pattern such
as `train-{000..015}.tar`) and `hf` (a Hugging Face dataset saved on disk, Parquet, or a hub name), or `auto`;
`data_dir` says where, and the registry (`vitlab.data.formats`) which format reads it. Whether a folder is held
in memory or streamed is `vitlab.data.loaders`' choice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from vitlab.data.carving import TEST_CARVING, TEST_FRACTION, carve_splits
from vitlab.data.formats import open_data_index, resolve_format
from vitlab.data.source import BatchSource, DataRequest, Splits
from vitlab.data.stream.crops import TrainCrop
from vitlab.data.stream.folder import folder_trees
from vitlab.data.stream.loader import StreamingSource, share_evaluation_workers
from vitlab.data.transforms import AugmentConfig
from vitlab.errors import DataError
from vitlab.preprocessing import Preprocessing


def labels_of(index) -> torch.Tensor:
    return torch.from_numpy(np.asarray(index.labels, dtype=np.int64))


def keep_classes(index, classes: list[int]):
    """Only the samples of `classes`, relabelled 0..len(classes)-1 in that order (as ImageDataset.select_classes)."""
    names = index.class_names or []
    for label in classes:
        if not 0 <= label < len(names):
            raise DataError(f"class {label} does not exist in {index.name}, which has classes 0..{len(names) - 1}")
    lookup = np.full(len(names), -1, dtype=np.int64)
    lookup[classes] = np.arange(len(classes))
    labelled = index.labels >= 0  # an unlabeled sample (-1) belongs to no class, not to the last one
    kept = index.subset(np.flatnonzero(labelled & (lookup[index.labels.clip(0)] >= 0)))
    return dataclasses.replace(kept, labels=lookup[kept.labels], class_names=[names[i] for i in classes])


def stream_splits(
    dataset: str,
    data_dir: str | Path | None,
    val_size: float,
    seed: int,
    image_size: tuple[int, int],
    channels: int = 3,
    classes: list[int] | None = None,
    max_train_images: int | None = None,
    preprocessing: Preprocessing | None = None,
    augment: AugmentConfig | None = None,
    workers: int = 0,
    pin_memory: bool = False,
    shard_order: str = "auto",
) -> Splits:
    """Train, validation and test splits of streamed image files; see the module docstring. The training split
    crops per image (`augment.crop`); validation and test read images under the model's contract."""
    augment = augment or AugmentConfig()
    contract = preprocessing or Preprocessing.image_files()
    dataset = resolve_format(dataset, data_dir).name  # "auto": the format data_dir looks like
    trees = folder_trees(data_dir) if dataset == "folder" and data_dir is not None else ()
    test_source = "official"
    if trees:
        train = open_data_index(dataset, data_dir, "train")
        test = open_data_index(dataset, data_dir, "test" if "test" in trees else "val")
        official = open_data_index(dataset, data_dir, "val") if trees == ("train", "val", "test") else None
    else:
        everything = open_data_index(dataset, data_dir)
        carving = carve_splits(labels_of(everything), test_fraction=TEST_FRACTION)
        train, test, official = everything.subset(carving.train.numpy()), everything.subset(carving.test.numpy()), None
        test_source = TEST_CARVING
    if classes is not None:
        train, test = keep_classes(train, classes), keep_classes(test, classes)
        official = keep_classes(official, classes) if official is not None else None
    carving = carve_splits(
        labels_of(train),
        0 if official is not None else val_size,
        seed,
        max_train_images,
        class_count=len(train.class_names or []),
        name=train.name,
    )
    validation, source = official, "official" if official is not None else "none"
    if carving.validation is not None:
        validation, source = train.subset(carving.validation.numpy(), f"{train.name} validation"), "carved"
    if len(carving.train) < len(train):
        train = train.subset(carving.train.numpy())
    crop = None  # --set augment.crop=none: training images read as for evaluation, then the batch augmentation
    if augment.crop is not None:
        crop = TrainCrop(
            augment.crop,
            min_area=augment.crop_min_area,
            resize_small=augment.resize_small,
            hflip=augment.hflip,
            resample=contract.resize,
            grey=contract.grey,
        )

    def source_of(index, train_crop: TrainCrop | None) -> StreamingSource:
        return StreamingSource(
            index,
            image_size,
            channels,
            train_crop,
            contract,
            seed,
            workers,
            hflip=augment.hflip,
            pin_memory=pin_memory,
            shard_order=shard_order,
            limit_by_caller=True,  # the limit of bad files is the data set's: `Splits.refuse_if_damaged`
        )

    training = source_of(train, crop)
    evaluated = source_of(validation, None) if validation is not None else None
    tested = source_of(test, None)
    share_evaluation_workers([evaluated, tested], starts_with=training)
    return Splits(training, evaluated, tested, source, test_source)


def training_image_count(request: DataRequest) -> int:
    """How many images the training tree of a folder holds (the whole tree when it has no train/ split),
    counted from the file listing alone: what decides whether the folder is held in memory."""
    trees = folder_trees(request.data_dir) if request.data_dir is not None else ()
    return len(open_data_index(request.dataset, request.data_dir, "train" if trees else None))


def open_splits(request: DataRequest) -> Splits:
    """The splits of streamed image files for the request (`stream_splits`)."""
    if request.image_size is None:
        raise DataError(
            f"streamed {request.dataset} images are decoded at the model's input size, which is not "
            "known here; give the model's --image-size"
        )
    return stream_splits(
        request.dataset,
        request.data_dir,
        request.val_size,
        request.seed,
        request.image_size,
        request.channels,
        request.classes,
        request.max_train_images,
        request.preprocessing,
        request.augment or AugmentConfig(crop=None),
        request.workers,
        request.pin_memory,
        request.shard_order,
    )


def open_split(request: DataRequest, split: str) -> BatchSource | None:
    """One split of streamed image files (see `SplitsOpener.open_split`); indexing all three costs no decoding,
    so this opens the splits and keeps the one asked for."""
    # "train" is every training image, as for data held in memory: nothing carved off, nothing left out.
    carving = {"val_size": 0, "max_train_images": None} if split == "train" else {}
    splits = open_splits(request.replace(**carving))
    part = {"train": splits.train, "val": splits.validation, "test": splits.test}[split]
    if isinstance(part, StreamingSource):  # read alone, the split is all the data its reader has: its own limit
        part.limit_by_caller = False
    return part
