"""A streaming batch source (`vitlab.data.source`): images decoded per sample in DataLoader worker processes,
from a `SampleIndex` (paths, offsets and labels in numpy arrays; `vitlab.data.stream.index`).

Training batches follow the same epoch order as the in-memory source (a permutation fixed by (seed, epoch)),
each rank taking its shard of every global batch, so a rank reads only its own images. Each image's crop and
flip come from a generator seeded by (seed, epoch, image index): the batches do not depend on the number of
workers or processes, and a run resumed at a step continues exactly. Workers hand out uint8 tensors at the
model's input size; normalisation and the batch augmentations (Mixup, CutMix, random erasing, TrivialAugment)
run after the loader, on the training device, as for the in-memory data.

A file that cannot be read (corrupt, truncated, empty, not an image) is replaced by the next readable image of
the epoch's order, so every batch keeps its size and every rank its random-number draws; it is counted, named in
`skipped` and, above `max_bad_fraction` of the data, stops the run with a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from vitlab.data.contract import Preprocessing
from vitlab.data.images import MAX_BAD_FRACTION  # one stated limit for held and streamed image files
from vitlab.data.preprocess import decode_image
from vitlab.data.source import Batch, epoch_order, evaluation_share, rank_shard, steps_per_epoch
from vitlab.data.stream.crops import TrainCrop, crop_image, sample_rng
from vitlab.errors import DataError

REPLACEMENT_TRIES = 16  # readable images looked for after a bad one before the batch is given up
BATCH_TIMEOUT_SECONDS = 600  # a worker that delivers nothing for this long is taken as hung (a stalled disk, say)


@dataclass(frozen=True)
class Request:
    """What a worker is asked for: one image, in training (with the epoch's seed) or evaluation."""

    index: int
    epoch_seed: int = -1  # -1: evaluation (the contract's resize and centre crop, no randomness)
    replacements: tuple[int, ...] = ()  # training: the images to try, in order, if this one is unreadable


class SampleReader(torch.utils.data.Dataset):
    """The per-sample work done in a worker: read the bytes, decode, crop, to uint8 (C, H, W)."""

    def __init__(
        self,
        index: Any,
        image_size: tuple[int, int],
        channels: int,
        crop: TrainCrop | None,
        contract: Preprocessing,
        seed: int,
        flips_allowed: bool,
    ) -> None:
        self.index = index
        self.image_size = image_size
        self.channels = channels
        self.crop = crop
        self.contract = contract
        self.seed = seed
        self.flips_allowed = flips_allowed
        self.reading = None  # shared memory: the sample each worker is on, so a worker's death can name its file

    def __len__(self) -> int:
        return len(self.index)

    def note_reading(self, position: int) -> None:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.reading is not None:
            self.reading[info.id] = position

    def decode(self, position: int, epoch_seed: int) -> torch.Tensor:
        data = self.index.read_bytes(position)
        if epoch_seed < 0 or self.crop is None:  # evaluation, or training without a per-image crop
            return decode_image(data, self.image_size, self.channels, self.contract, name=self.index.location(position))
        array = crop_image(
            data,
            self.image_size,
            self.channels,
            self.crop,
            sample_rng(self.seed, epoch_seed, position),
            self.flips_allowed,
        )
        return torch.from_numpy(array).permute(2, 0, 1)

    def __getitem__(self, request: Request) -> tuple[torch.Tensor | None, int, int, list[tuple[str, str]]]:
        """(image or None, label, the index used, (location, message) of each file that could not be read)."""
        skipped = []
        for position in (request.index, *request.replacements):
            self.note_reading(position)
            try:
                image = self.decode(position, request.epoch_seed)
                return image, int(self.index.labels[position]), position, skipped
            except Exception as error:  # noqa: BLE001 - any decoder or read failure makes a skipped file
                message, location = str(error), self.index.location(position)
                skipped.append((location, message if message.startswith(location) else f"{location}: {message}"))
        return None, -1, request.index, skipped


def collate(samples: list[tuple[torch.Tensor | None, int, int, list[tuple[str, str]]]]) -> dict[str, Any]:
    kept = [s for s in samples if s[0] is not None]
    return {
        "images": torch.stack([s[0] for s in kept]) if kept else None,
        "labels": torch.tensor([s[1] for s in kept], dtype=torch.int64),
        "indices": torch.tensor([s[2] for s in kept], dtype=torch.int64),
        "skipped": [entry for s in samples for entry in s[3]],
        "missing": len(samples) - len(kept),
    }


class StreamingSource:
    """A batch source over a sample index, decoded in `workers` processes (0: in this process)."""

    def __init__(
        self,
        index: Any,
        image_size: tuple[int, int],
        channels: int = 3,
        crop: TrainCrop | None = None,
        contract: Preprocessing | None = None,
        seed: int = 0,
        workers: int = 0,
        hflip: bool = True,
        prefetch: int = 4,
        pin_memory: bool = False,
        max_bad_fraction: float = MAX_BAD_FRACTION,
    ) -> None:
        self.index = index
        self.name = index.name
        self.class_names = index.class_names
        self.image_size: tuple[int, int] = (int(image_size[0]), int(image_size[1]))
        self._channels = channels
        self.max_value = 255.0
        self.hflip = hflip
        self.crop = crop  # None: training images are read as for evaluation (batch augmentation only)
        self.preprocessing = contract or Preprocessing.image_files()
        self.seed = seed
        self.workers = workers
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.max_bad_fraction = max_bad_fraction
        self.skipped: list[str] = []  # every unreadable file met ("location: why"), in the order met, each once
        # Under DDP the training loop sums the ranks' counts after each step and calls `refuse_if_too_many` on every
        # rank at once (one rank stopping alone left the others waiting in a collective).
        self.limit_by_caller = False
        self._seen_skipped: set[str] = set()
        self.reader = SampleReader(index, self.image_size, channels, self.crop, self.preprocessing, seed, hflip)
        self._loaders: dict[str, tuple[PassRequests, DataLoader]] = {}

    def __len__(self) -> int:
        return len(self.index)

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def num_classes(self) -> int:
        return len(self.class_names or [])

    @property
    def labels(self) -> torch.Tensor:
        """Every label (int64; -1 where unlabeled), from the index: no image is read."""
        return torch.from_numpy(np.asarray(self.index.labels, dtype=np.int64))

    def fingerprint(self) -> dict[str, object]:
        return self.index.fingerprint()

    def subset(self, indices: torch.Tensor, name: str | None = None) -> StreamingSource:
        part = StreamingSource.__new__(StreamingSource)
        part.__dict__.update(self.__dict__)
        part.index = self.index.subset(np.asarray(indices, dtype=np.int64), name)
        part.name = part.index.name
        part.skipped, part._seen_skipped = [], set()
        part.reader = SampleReader(
            part.index, self.image_size, self._channels, self.crop, self.preprocessing, self.seed, self.hflip
        )
        part._loaders = {}
        return part

    def loader(self, purpose: str, plan: Callable[[], Iterator[list[Request]]], batches: int) -> DataLoader:
        """The loader for "train" or "eval", made once: its workers persist across epochs (a fork per worker per
        epoch is seconds on a large index), and each pass hands it that pass's plan (`batches` lists of requests,
        made as they are asked for)."""
        if purpose not in self._loaders:
            if self.workers and self.reader.reading is None:
                import multiprocessing

                self.reader.reading = multiprocessing.Array("q", [-1] * self.workers, lock=False)
            sampler = PassRequests()
            # Its own generator: a DataLoader draws its workers' base seed from the global RNG each time a pass
            # starts, which would shift dropout and stochastic depth between a resumed run and an uninterrupted one
            # (the workers need no torch randomness: crops are seeded per image).
            self._loaders[purpose] = (
                sampler,
                DataLoader(
                    self.reader,
                    batch_sampler=sampler,
                    collate_fn=collate,
                    num_workers=self.workers,
                    prefetch_factor=self.prefetch if self.workers else None,
                    pin_memory=self.pin_memory,
                    persistent_workers=self.workers > 0,
                    generator=torch.Generator().manual_seed(self.seed),
                    timeout=BATCH_TIMEOUT_SECONDS if self.workers else 0,
                ),
            )
        requests, loader = self._loaders[purpose]
        requests.plan, requests.batches = plan, batches
        return loader

    def close(self) -> None:
        """Stop the persistent workers now (they also stop when the source is collected, or the process ends)."""
        for _, loader in self._loaders.values():
            iterator = getattr(loader, "_iterator", None)  # the persistent pass DataLoader keeps
            if iterator is not None:
                iterator._shutdown_workers()
                loader._iterator = None
        self._loaders.clear()

    def training_batches(
        self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        order = epoch_order(len(self), epoch_seed)  # a tensor: 8 bytes an image, no Python object per image
        shard = rank_shard(batch_size, rank, world_size)
        steps = range(start_step, steps_per_epoch(len(self), batch_size))

        def plan() -> Iterator[list[Request]]:  # made as the loader asks, a batch at a time
            for step in steps:
                rows = order[step * batch_size : (step + 1) * batch_size][shard].tolist()
                after = step * batch_size + shard.start
                yield [
                    Request(row, epoch_seed, self.replacements(order, after + offset))
                    for offset, row in enumerate(rows)
                ]

        for batch in self.watched(self.loader("train", plan, len(steps))):
            self.record(batch)
            if batch["missing"]:  # every stand-in unreadable too: the shard would lose rows and its random draws
                raise DataError(
                    f"{batch['missing']} image(s) of a batch of {self.name} and the next "
                    f"{REPLACEMENT_TRIES - 1} in the order are unreadable: {batch['skipped'][0][1]}"
                )
            yield Batch(
                batch["images"],
                batch["labels"],
                batch["indices"],
                self.max_value,
                batch_size,
                shard,
                per_image_augmented=self.crop is not None,
            )

    def replacements(self, order: torch.Tensor, position: int) -> tuple[int, ...]:
        """The images that stand in for the one at `position` of the epoch's order if it cannot be read: the ones
        after it in the order (wrapping around), the same on every rank and worker."""
        length = len(order)
        return tuple(int(order[(position + k) % length]) for k in range(1, min(REPLACEMENT_TRIES, length)))

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        share = evaluation_share(len(self), rank, world_size)
        firsts = range(share.start, share.stop, batch_size)

        def plan() -> Iterator[list[Request]]:
            for first in firsts:
                yield [Request(i) for i in range(first, min(first + batch_size, share.stop))]

        for batch in self.watched(self.loader("eval", plan, len(firsts))):
            self.record(batch)
            if batch["images"] is not None:  # an unreadable image is left out of evaluation (and counted)
                yield Batch(batch["images"], batch["labels"], batch["indices"], self.max_value)

    def watched(self, loader: DataLoader) -> Iterator[dict[str, Any]]:
        """The loader's batches; a worker that dies or hangs becomes one DataError naming the files the workers
        were reading, instead of a traceback from inside the DataLoader (or a wait forever)."""
        try:
            yield from loader
        except RuntimeError as error:
            text = str(error)
            if "DataLoader worker" not in text and "timed out" not in text:
                raise
            reading = [self.index.location(int(i)) for i in (self.reader.reading or []) if i >= 0]
            cause = text.splitlines()[0].rstrip(".")
            raise DataError(
                f"a data-loading worker of {self.name} failed ({cause}) while the workers were reading "
                f"{', '.join(reading) or 'no file yet'}; a file that crashes the decoder can be found "
                "with --set workers=0, which reads in this process and names it"
            ) from None

    def record(self, batch: dict[str, Any]) -> None:
        """Note the batch's unreadable files; stop when there are too many, or when no stand-in could be read."""
        for location, message in batch["skipped"]:
            if location not in self._seen_skipped:
                self._seen_skipped.add(location)
                self.skipped.append(message)
        if not self.limit_by_caller:
            self.refuse_if_too_many(len(self.skipped))

    def refuse_if_too_many(self, count: int) -> None:
        """Stop (DataError) when `count` unreadable files, this process's or (under DDP) every rank's summed by the
        training loop, are over `max_bad_fraction` of the data; every rank decides on the same count, together."""
        if count > self.max_bad_fraction * len(self):
            first = self.skipped[0] if self.skipped else "listed by another process"
            raise DataError(
                f"{count} files of {self.name} are unreadable, more than {self.max_bad_fraction:.0%} of its "
                f"{len(self)}: the data are damaged (first: {first}); repair or remove them"
            )


class PassRequests:
    """A batch sampler whose plan is set before each pass over a persistent loader."""

    def __init__(self) -> None:
        self.plan: Callable[[], Iterator[list[Request]]] = lambda: iter(())
        self.batches = 0

    def __iter__(self) -> Iterator[list[Request]]:
        return self.plan()

    def __len__(self) -> int:
        return self.batches
