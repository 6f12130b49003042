"""The batch-source seam: what the training loop, evaluation, few-shot, analysis and calibration need of data.

A batch source has a length, class names (or none, for unlabeled data), a channel count, and two ways to give
its images out in batches of stored pixels (uint8, or values in [0, max_value]):

- `training_batches(epoch_seed, batch_size, start_step, rank, world_size)`: the batches of one epoch from a given
  step on, for this rank. Each global batch of `batch_size` images is cut into `world_size` equal shards and a
  rank gets its own; the order of an epoch is a pure function of `epoch_seed`, so the state that resumes a run
  exactly is only (epoch, step), which the run's `Position` holds. A streaming source (decoding in worker
  processes) keeps that contract by making each image's per-image augmentation depend on (seed, epoch, index)
  alone.
- `evaluation_batches(batch_size, rank, world_size)`: every image once, in order; this rank's contiguous share.

and a `fingerprint()` that a saved run state records, so that a resume on other data is named. The rest of the
protocol is what callers read of any source: class count, stored image size, preprocessing contract, labels, the
unreadable files met so far, and `close()` for worker processes.

Turning stored pixels into model input (resize to the model, augmentation, normalisation) happens after the
source, in batches, on the training device: `vitlab.data.preprocess` and the objective.

Implementations: `ImageDataset` (data/datasets.py) and `SegmentationDataset` (data/segmentation.py), tensors
held in memory on one base (`InMemoryDataset` below); `StreamingSource` (data/stream/loader.py), image files
decoded in worker processes; `ImageFiles` below, the files named on a command line.

A data set is opened as `Splits` (train, validation, test) from a `DataRequest` by a module with the two
functions of `SplitsOpener`; `vitlab.data.formats` decides a data set's format (by its name, or by what its
location looks like) and `vitlab.data.loaders` opens it, held in memory or streamed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from vitlab.data.images import read_image, reason, refuse_damaged
from vitlab.data.preprocess import InputSpec
from vitlab.data.transforms import AugmentConfig
from vitlab.errors import DataError
from vitlab.model_input import ModelInput
from vitlab.preprocessing import Preprocessing, resolved_preprocessing


@dataclass
class Batch:
    """One rank's part of a batch: stored pixels, their labels (None for unlabeled data) and their positions in
    the source. `global_size` and `shard` place it in the global batch that every rank draws random numbers for
    (see `vitlab.data.transforms.Draws`)."""

    # (B, C, H, W) values in [0, max_value]; or a PatchInput of those values: images at their own sizes, cut into
    # the model's patches and padded to one length (vitlab.model_input)
    images: ModelInput
    labels: torch.Tensor | None  # int64 (B,)
    indices: torch.Tensor  # int64 (B,): each image's position in the source
    max_value: float = 255.0  # the stored value that means white
    global_size: int = 0  # the global batch this is a shard of (0: the batch is the whole of it)
    shard: slice = field(default_factory=lambda: slice(None))  # this rank's rows of the global batch
    # The source cropped and flipped each image already (streamed files): the batch's crop and flip are skipped.
    per_image_augmented: bool = False
    # Segmentation data (`vitlab.data.segmentation`): int64 (B, H, W), each pixel's class, 255 where it is left out
    # of the loss and the metrics; aligned with `images`. None for every other source.
    label_maps: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.images)


class BatchSource(Protocol):
    """What every data source offers; see the module docstring."""

    # Read-only to callers (properties here, so that a source may hold them as plain attributes of narrower types).
    @property
    def name(self) -> str: ...

    @property
    def class_names(self) -> list[str] | None:
        """The classes in label order; None for unlabeled data."""
        ...

    @property
    def max_value(self) -> float:
        """The stored value that means white (255 for uint8 pixels)."""
        ...

    @property
    def hflip(self) -> bool:
        """Whether a horizontal flip keeps an image's meaning (photos yes, digits no)."""
        ...

    def __len__(self) -> int: ...

    @property
    def channels(self) -> int: ...

    @property
    def num_classes(self) -> int:
        """len(class_names); 0 for unlabeled data."""
        ...

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of the stored pixels the batches hold (the model may take another size: `prepare` resizes)."""
        ...

    @property
    def preprocessing(self) -> Preprocessing:
        """How the stored pixels were read and become model input; a model trained on them records it."""
        ...

    @property
    def labels(self) -> torch.Tensor | None:
        """Every image's label, int64 (N,) in source order (-1 where an image has none), read without decoding
        any image; None for a source without labels."""
        ...

    @property
    def skipped(self) -> list[str]:
        """The unreadable files met so far, one "location: why" each."""
        ...

    def close(self) -> None:
        """Let go of what the source holds open (worker processes); it can still be read afterwards."""
        ...

    def training_batches(
        self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]: ...

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]: ...

    def fingerprint(self) -> dict[str, object]: ...


@dataclass
class Splits:
    """The three splits of a data set as a training run uses them. `validation` chooses (best checkpoint,
    hyper-parameters); `test` is measured once at the end. `validation` is None when the request asks for none.

    The limit of unreadable files is the data set's, not a split's (2 bad files in a test split of 9 are not a
    damaged data set of 43): whoever reads the splits decides it with `refuse_if_damaged`, over every split's
    files. Data held in memory are decided when they are read; a streamed split meets its bad files as it is read,
    and does not decide alone."""

    train: BatchSource
    validation: BatchSource | None
    test: BatchSource
    validation_source: str  # "carved" (from the training images), "official" or "none"
    test_source: str = "official"  # or how it was carved from a single tree of images ("carved: 20% of ...")
    # The image files the splits were read from, readable or not (a folder held in memory: every file decoded);
    # 0: the splits' images, as a streamed split holds every file, bad ones too.
    files: int = 0

    def parts(self) -> list[BatchSource]:
        """The splits there are: train, validation (when there is one), test."""
        return [part for part in (self.train, self.validation, self.test) if part is not None]

    def refuse_if_damaged(self, unreadable: Sequence[str], name: str) -> None:
        """Stop (DataError) when the data set's unreadable files (`unreadable`: every split's, under DDP every
        rank's, so that every rank decides alike) are over the limit of its files (`refuse_damaged`); `name`: the
        data set, as the message calls it."""
        refuse_damaged(unreadable, self.files or sum(len(part) for part in self.parts()), name)

    def close(self) -> None:
        """Close every split (a streamed split's worker processes go now, not when the objects are collected)."""
        for part in self.parts():
            part.close()


@dataclass(frozen=True)
class DataRequest:
    """What a caller asks of a data set: which one, the model input its image files are decoded for, how the
    splits are carved, and where the images are read (held in memory or streamed)."""

    # A format of the registry (`vitlab.data.formats.FORMATS`: digits, mnist, folder, manifest, ...), or "auto":
    # the image-file format data_dir looks like.
    dataset: str
    data_dir: str | Path | None = None  # where its files are; None: the download cache (array data sets)
    image_size: tuple[int, int] | None = None  # the model's input (H, W): image files are decoded at it
    channels: int = 3  # the model's: image files are decoded to this many
    preprocessing: Preprocessing | None = None  # how image files are decoded (None: Preprocessing.image_files())
    classes: list[int] | None = None  # only these classes, relabelled 0..len-1 in this order
    val_size: float = 0.1  # validation carved from the training images: a fraction, a count, or 0 for none
    seed: int = 0  # fixes the carving
    max_train_images: int | None = None  # a stratified subset of the training split (quick runs, tests)
    stream: bool | None = None  # image files streamed (True), held in memory (False), or by their size (None)
    # The streamed training split's per-image crop and flip (None: read as for evaluation, no crop).
    augment: AugmentConfig | None = None
    workers: int = 0  # decoding processes of a streamed source (0: decoded in the calling process)
    pin_memory: bool = False  # streamed batches in pinned memory (for a CUDA device)
    # Tar shards: "sequential" reads whole shards per rank (`shard_sequential_order`), "random" shuffles every
    # sample over all shards, "auto" is sequential for shards in object storage and random for local ones.
    shard_order: str = "auto"
    allow_download: bool = True  # the array data sets: fetch missing files into the cache

    @classmethod
    def for_model(cls, config: InputSpec, dataset: str, **fields: Any) -> DataRequest:
        """A request whose image files are decoded as the model `config` (a ViTConfig) reads images: at its input
        size and channels, under its preprocessing contract (`resolved_preprocessing(config, "files")`)."""
        height, width = config.image_size
        return cls(
            dataset,
            image_size=(height, width),
            channels=config.in_chans,
            preprocessing=resolved_preprocessing(config, "files"),
            **fields,
        )

    def replace(self, **changes: Any) -> DataRequest:
        return dataclasses.replace(self, **changes)


class SplitsOpener(Protocol):
    """How a kind of data set is opened (a module, or any object with these two functions): one row of the
    loader table (`vitlab.data.loaders.LOADERS`) points at it."""

    def open_splits(self, request: DataRequest) -> Splits:
        """Train, validation and test as a training run uses them: validation official or carved
        (`request.val_size`, `request.seed`), the training split cut to `request.max_train_images`."""
        ...

    def open_split(self, request: DataRequest, split: str) -> BatchSource | None:
        """One split alone, without opening the others: "train" (every training image: nothing carved off),
        "val" (official, or carved as `open_splits` carves it; None when there is none and `request.val_size`
        is 0) or "test"."""
        ...


def steps_per_epoch(source_length: int, batch_size: int) -> int:
    """Optimizer steps in an epoch: whole global batches only (the remainder is left out of that epoch, and a
    different remainder next epoch, since every epoch is reshuffled)."""
    return source_length // batch_size


def epoch_order(length: int, epoch_seed: int) -> torch.Tensor:
    """The order of an epoch's images: a permutation fixed by the seed alone."""
    return torch.randperm(length, generator=torch.Generator().manual_seed(epoch_seed))


def shard_sequential_order(shard_ids: np.ndarray, epoch_seed: int, batch_size: int, world_size: int) -> torch.Tensor:
    """An epoch's order in which each rank reads whole tar shards, as webdataset does: the shards shuffled by the
    seed and dealt to the ranks in turn, each shard's samples shuffled; step s's global batch holds each rank's next
    samples in its `rank_shard`, so a rank (and its decoding workers) fetches only its own shards, each once. Shares
    differ where shards differ in size: a rank whose shards run out before the epoch's steps do starts its own
    again, and one with more leaves its last samples out of this epoch. Fixed by (seed, epoch, batch, processes),
    so a resumed run reads what an uninterrupted one would. shard_ids: each sample's shard (N,)."""
    generator = torch.Generator().manual_seed(epoch_seed)
    steps, per_rank = steps_per_epoch(len(shard_ids), batch_size), batch_size // world_size
    by_shard = np.argsort(shard_ids, kind="stable")
    shards, starts = np.unique(shard_ids[by_shard], return_index=True)
    members = np.split(by_shard, starts[1:])
    if len(shards) < world_size:
        raise DataError(
            f"{len(shards)} tar shard(s) for {world_size} processes: reading whole shards per process needs at "
            "least one each; split the data into more shards, or --set shard_order=random"
        )
    dealt = torch.randperm(len(shards), generator=generator).numpy()
    order = np.zeros((steps, batch_size), dtype=np.int64)
    for rank in range(world_size):
        stream = np.concatenate(
            [members[i][torch.randperm(len(members[i]), generator=generator).numpy()] for i in dealt[rank::world_size]]
        )
        order[:, rank_shard(batch_size, rank, world_size)] = np.resize(stream, steps * per_rank).reshape(
            steps, per_rank
        )
    return torch.from_numpy(order.reshape(-1))


def rank_shard(batch_size: int, rank: int, world_size: int) -> slice:
    """This rank's rows of a global batch: equal contiguous shards, rank 0 first."""
    per_rank = batch_size // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def evaluation_share(length: int, rank: int, world_size: int) -> range:
    """This rank's contiguous share of an evaluation pass (the last rank's may be shorter, or empty)."""
    share = -(-length // world_size)
    return range(rank * share, min(length, (rank + 1) * share))


def digest(*parts: bytes | memoryview | str) -> str:
    """A short content hash for fingerprints (16 hex digits of SHA-256); buffers are hashed in place."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
    return hasher.hexdigest()[:16]


def batch_of(images: list[torch.Tensor] | torch.Tensor, contract: Preprocessing) -> ModelInput:
    """Decoded images (a list, or already stacked) as one model input: stacked, or under a NaFlex contract (each
    image on its own grid) their patches padded to the budget (`vitlab.data.naflex`)."""
    if contract.mode == "naflex":
        from vitlab.data.naflex import pad_patch_inputs

        return pad_patch_inputs(list(images), contract.patch, length=contract.max_patches)
    return images if isinstance(images, torch.Tensor) else torch.stack(images)


class InMemoryDataset:
    """What a data set whose arrays are held in memory does whatever its labels are: its sizes, and its images as
    one tensor, sliced into batches. `ImageDataset` (data/datasets.py: a label per image) and `SegmentationDataset`
    (data/segmentation.py: a label map per image) build on it. A subclass is a dataclass that holds the attributes
    below (in the order of its own fields) and calls this `__post_init__` from its own; it overrides `batch` where
    its batches carry more than a label per image."""

    images: torch.Tensor  # uint8 (N, C, H, W)
    labels: torch.Tensor | None  # int64 (N,); None where the images have no label of their own
    class_names: list[str]
    name: str
    max_value: float  # the stored value that means white

    def __post_init__(self) -> None:
        if len(self.images) == 0:
            raise DataError(f"data set {self.name!r} has no images")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[-2]), int(self.images.shape[-1])

    @property
    def channels(self) -> int:
        return int(self.images.shape[1])

    def batch(self, rows: torch.Tensor | slice, indices: torch.Tensor, **placing) -> Batch:
        """The images at `rows` (and their labels), `indices` their positions in the data set; `placing`: the
        batch's `global_size` and `shard`, for a training batch."""
        labels = self.labels[rows] if self.labels is not None else None
        return Batch(self.images[rows], labels, indices, self.max_value, **placing)

    def training_batches(
        self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        """The rest of an epoch from `start_step`: this rank's shard of each global batch of a seeded order."""
        order = epoch_order(len(self), epoch_seed)
        shard = rank_shard(batch_size, rank, world_size)
        for step in range(start_step, steps_per_epoch(len(self), batch_size)):
            rows = order[step * batch_size : (step + 1) * batch_size][shard]
            yield self.batch(rows, rows, global_size=batch_size, shard=shard)

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        """Every image once, in order: this rank's contiguous share, in batches of at most `batch_size`."""
        share = evaluation_share(len(self), rank, world_size)
        for first in range(share.start, share.stop, batch_size):
            rows = slice(first, min(first + batch_size, share.stop))
            yield self.batch(rows, torch.arange(rows.start, rows.stop))

    def close(self) -> None:
        """Nothing to let go of: the images are tensors in this process."""


class ImageFiles:
    """Image files named on a command line (`vitlab predict`, `eval` on images, calibration), decoded lazily
    under a model's preprocessing contract; labels are None. A file that cannot be read is left out of the
    batches and its message kept in `errors` (by index), so the others are still used."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        image_size: tuple[int, int],
        channels: int = 3,
        preprocessing: Preprocessing | None = None,
        name: str = "images",
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.image_size = image_size
        self._channels = channels
        self.preprocessing = preprocessing or Preprocessing.image_files()
        self.name = name
        self.class_names = None
        self.labels = None
        self.max_value = 255.0
        self.hflip = True
        self.errors: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def num_classes(self) -> int:
        return 0

    @property
    def skipped(self) -> list[str]:
        return [f"{self.paths[index]}: {message}" for index, message in sorted(self.errors.items())]

    def close(self) -> None:
        """Nothing to let go of: each file is opened and closed as it is read."""

    def read(self, index: int) -> torch.Tensor | None:
        """One file as uint8 (C, H, W), or None (message in `errors`) when it cannot be read."""
        try:
            return read_image(self.paths[index], self.image_size, self._channels, preprocessing=self.preprocessing)
        except DataError as error:
            self.errors[index] = reason(error, self.paths[index])  # listed beside its path
            return None

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        pending: list[tuple[int, torch.Tensor]] = []
        share = evaluation_share(len(self), rank, world_size)
        for position, index in enumerate(share):
            image = self.read(index)
            if image is not None:
                pending.append((index, image))
            if pending and (len(pending) == batch_size or position == len(share) - 1):
                yield Batch(
                    batch_of([image for _, image in pending], self.preprocessing),
                    None,
                    torch.tensor([i for i, _ in pending]),
                    self.max_value,
                )
                pending = []

    def training_batches(
        self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        raise NotImplementedError(
            "image files named on a command line are for evaluation and prediction; "
            "train on a data set (--dataset folder --data-dir PATH)"
        )

    def fingerprint(self) -> dict[str, object]:
        return {"count": len(self), "paths": digest(*(str(p) for p in self.paths))}
