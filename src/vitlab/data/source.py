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

and a `fingerprint()` that a saved run state records, so that a resume on other data is named.

Turning stored pixels into model input (resize to the model, augmentation, normalisation) happens after the
source, in batches, on the training device: `vitlab.data.preprocess` and the objective.

`ImageDataset` (data/datasets.py), the in-memory tensor, is the first implementation; `ImageFiles` below, the
files named on a command line, the second.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol, Sequence

import torch


@dataclass
class Batch:
    """One rank's part of a batch: stored pixels, their labels (None for unlabeled data) and their positions in
    the source. `global_size` and `shard` place it in the global batch that every rank draws random numbers for
    (see `vitlab.data.transforms.Draws`)."""

    images: torch.Tensor  # (B, C, H, W), values in [0, max_value]
    labels: torch.Tensor | None  # int64 (B,)
    indices: torch.Tensor  # int64 (B,): each image's position in the source
    max_value: float = 255.0  # the stored value that means white
    global_size: int = 0  # the global batch this is a shard of (0: the batch is the whole of it)
    shard: slice = field(default_factory=lambda: slice(None))  # this rank's rows of the global batch
    # The source cropped and flipped each image already (streamed files): the batch's crop and flip are skipped.
    per_image_augmented: bool = False

    def __len__(self) -> int:
        return len(self.images)


class BatchSource(Protocol):
    """What every data source offers; see the module docstring."""

    name: str
    class_names: list[str] | None
    max_value: float
    hflip: bool  # whether a horizontal flip keeps an image's meaning (photos yes, digits no)

    def __len__(self) -> int: ...

    @property
    def channels(self) -> int: ...

    def training_batches(self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0,
                         world_size: int = 1) -> Iterator[Batch]: ...

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]: ...

    def fingerprint(self) -> dict[str, object]: ...


def steps_per_epoch(source_length: int, batch_size: int) -> int:
    """Optimizer steps in an epoch: whole global batches only (the remainder is left out of that epoch, and a
    different remainder next epoch, since every epoch is reshuffled)."""
    return source_length // batch_size


def epoch_order(length: int, epoch_seed: int) -> torch.Tensor:
    """The order of an epoch's images: a permutation fixed by the seed alone."""
    return torch.randperm(length, generator=torch.Generator().manual_seed(epoch_seed))


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


class ImageFiles:
    """Image files named on a command line (`vitlab predict`, `eval` on images, calibration), decoded lazily
    under a model's preprocessing contract; labels are None. A file that cannot be read is left out of the
    batches and its message kept in `errors` (by index), so the others are still used."""

    def __init__(self, paths: Sequence[str | Path], image_size: tuple[int, int], channels: int = 3,
                 preprocessing=None, name: str = "images") -> None:
        self.paths = [Path(p) for p in paths]
        self.image_size = image_size
        self._channels = channels
        self.preprocessing = preprocessing
        self.name = name
        self.class_names = None
        self.max_value = 255.0
        self.hflip = True
        self.errors: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def channels(self) -> int:
        return self._channels

    def read(self, index: int) -> torch.Tensor | None:
        """One file as uint8 (C, H, W), or None (message in `errors`) when it cannot be read."""
        from vitlab.data.datasets import read_image, reason
        from vitlab.errors import DataError

        try:
            kwargs = {} if self.preprocessing is None else {"preprocessing": self.preprocessing}
            return read_image(self.paths[index], self.image_size, self._channels, **kwargs)
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
                yield Batch(torch.stack([image for _, image in pending]), None,
                            torch.tensor([i for i, _ in pending]), self.max_value)
                pending = []

    def training_batches(self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0,
                         world_size: int = 1) -> Iterator[Batch]:
        raise NotImplementedError("image files named on a command line are for evaluation and prediction; "
                                  "train on a data set (--dataset folder --data-dir PATH)")

    def fingerprint(self) -> dict[str, object]:
        return {"count": len(self), "paths": digest(*(str(p) for p in self.paths))}
