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
`skipped` and, above `max_bad_fraction` of the source's files, stops the reading with a message. The splits of a
data set read together leave that to their reader (`limit_by_caller`), which decides over the whole data set
(`vitlab.data.source.Splits.refuse_if_damaged`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from vitlab.data.images import MAX_BAD_FRACTION, refuse_damaged  # one stated limit for held and streamed files
from vitlab.data.preprocess import decode_image, resized_size
from vitlab.data.source import (
    Batch,
    batch_of,
    epoch_order,
    evaluation_share,
    rank_shard,
    shard_sequential_order,
    steps_per_epoch,
)
from vitlab.data.stream.crops import TrainCrop, crop_image, sample_rng
from vitlab.data.stream.remote import RemoteUnreachable, ShardPrefetcher, redacted
from vitlab.errors import DataError, UsageError
from vitlab.hardware import return_freed_memory
from vitlab.preprocessing import Preprocessing

REPLACEMENT_TRIES = 16  # readable images looked for after a bad one before the batch is given up
BATCH_TIMEOUT_SECONDS = 600  # a worker that delivers nothing for this long is taken as hung (a stalled disk, say)


@dataclass(frozen=True)
class Request:
    """What a worker is asked for: one image, in training (with the epoch's seed) or evaluation."""

    index: int
    epoch_seed: int = -1  # -1: evaluation (the contract's resize and centre crop, no randomness)
    replacements: tuple[int, ...] = ()  # training: the images to try, in order, if this one is unreadable
    source: int = 0  # which of a pool's readers (`DecodePool`): validation and test share one pool


class SampleReader:
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

    def __len__(self) -> int:
        return len(self.index)

    def decode(self, position: int, epoch_seed: int) -> torch.Tensor:
        data = self.index.read_bytes(position)
        if epoch_seed < 0 or self.crop is None:  # evaluation, or training without a per-image crop
            name = redacted(self.index.location(position))
            return decode_image(data, self.image_size, self.channels, self.contract, name=name)
        array = crop_image(
            data,
            self.image_size,
            self.channels,
            self.crop,
            sample_rng(self.seed, epoch_seed, position),
            self.flips_allowed,
            # NaFlex: the box goes to its own grid, the size decoding gives a whole image of the box's shape.
            grid=functools.partial(resized_size, image_size=self.image_size, contract=self.contract)
            if self.contract.mode == "naflex"
            else None,
        )
        return torch.from_numpy(array).permute(2, 0, 1)

    def read(
        self, request: Request, note_reading: Callable[[int], None]
    ) -> tuple[torch.Tensor | None, int, int, list[tuple[str, str]]]:
        """(image or None, label, the index used, (location, message) of each file that could not be read);
        `note_reading(position)` before each file is tried (the pool's record of what its workers are on)."""
        skipped = []
        for position in (request.index, *request.replacements):
            note_reading(position)
            try:
                image = self.decode(position, request.epoch_seed)
                return image, int(self.index.labels[position]), position, skipped
            except Exception as error:  # noqa: BLE001 - any decoder or read failure makes a skipped file
                if isinstance(error, RemoteUnreachable) or type(error) is UsageError:
                    raise  # the storage (network, credentials, a package missing), not the file: stop, not skip all
                message, location = str(error), redacted(self.index.location(position))
                skipped.append((location, message if message.startswith(location) else f"{location}: {message}"))
        return None, -1, request.index, skipped


def collate(samples: list[tuple[torch.Tensor | None, int, int, list[tuple[str, str]]]]) -> dict[str, Any]:
    """The worker's batch: images stacked, or a list where each has its own size (NaFlex grids; the training
    process pads their patches, a copy of a few hundred kilobytes)."""
    kept = [s for s in samples if s[0] is not None]
    same_size = len({tuple(s[0].shape) for s in kept}) == 1
    return {
        "images": (torch.stack([s[0] for s in kept]) if same_size else [s[0] for s in kept]) if kept else None,
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
        shard_order: str = "auto",
        limit_by_caller: bool = False,
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
        self.shard_order = shard_order  # see DataRequest.shard_order
        self.skipped: list[str] = []  # every unreadable file met ("location: why"), in the order met, each once
        # The splits of a data set read together (`stream_splits`) do not stop on their own counts: the limit is the
        # data set's, every split's files (a test split of 9 with 2 bad files stopped a run of 3 in 43 after its
        # training), and under DDP every rank decides it at once (one rank stopping alone left the others waiting
        # in a collective).
        self.limit_by_caller = limit_by_caller
        self._seen_skipped: set[str] = set()
        self.reader = SampleReader(index, self.image_size, channels, self.crop, self.preprocessing, seed, hflip)
        self._pools: dict[str, DecodePool] = {}  # "train", "eval": this source's own workers
        self.evaluation_pool: DecodePool | None = None  # evaluation workers shared with other splits, if any
        self.evaluation_slot = 0  # this source's reader in that pool
        self.started_with: list[DecodePool] = []  # other pools forked when this one's training workers are

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
        part._pools, part.evaluation_pool, part.evaluation_slot, part.started_with = {}, None, 0, []
        return part

    def pool(self, purpose: str) -> tuple[DecodePool, int]:
        """The workers for "train" or "eval" passes and this source's slot among their readers."""
        if purpose == "eval" and self.evaluation_pool is not None:
            return self.evaluation_pool, self.evaluation_slot
        if purpose not in self._pools:
            if purpose == "train":
                for other in self.started_with:
                    other.start()
            self._pools[purpose] = DecodePool(self.workers, self.prefetch, self.pin_memory, self.seed)
            self._pools[purpose].add(self.reader)
        return self._pools[purpose], 0

    def close(self) -> None:
        """Stop the workers now (they also stop when the source is collected, or the process ends); a pool shared
        with another split stops for both, and starts again if that one is read."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self.evaluation_pool is not None:
            self.evaluation_pool.close()

    def training_batches(
        self, epoch_seed: int, batch_size: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        order = self.epoch_order(epoch_seed, batch_size, world_size)  # a tensor: 8 bytes an image
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

        pool, _ = self.pool("train")
        prefetcher = self.shard_prefetcher(order, batch_size, shard, steps)
        try:
            yield from self.read_training_batches(pool, plan, steps, batch_size, shard, prefetcher)
        finally:
            if prefetcher is not None:
                prefetcher.close()

    def shard_prefetcher(
        self, order: torch.Tensor, batch_size: int, shard: slice, steps: range
    ) -> ShardPrefetcher | None:
        """For shards in object storage: a thread fetching this rank's shards ahead of its workers."""
        store = self.index.store
        if not getattr(store, "remote", False) or not len(steps):
            return None
        rows = order.reshape(-1, batch_size)[steps.start : steps.stop, shard]
        sequence, seen = [], set()
        for step, shards in zip(steps, store.shard_ids[rows.numpy()]):
            for shard_id in dict.fromkeys(shards.tolist()):
                if shard_id not in seen:
                    seen.add(shard_id)
                    sequence.append((step, shard_id))
        return ShardPrefetcher(store, sequence)

    def read_training_batches(
        self, pool: DecodePool, plan: Any, steps: range, batch_size: int, shard: slice, prefetcher: Any
    ) -> Iterator[Batch]:
        for step, batch in zip(steps, self.watched(pool, pool.loader(plan, len(steps)))):
            if prefetcher is not None:  # the workers decode up to `prefetch` batches each beyond this one
                prefetcher.reached(step + self.prefetch * max(1, self.workers))
            self.record(batch)
            if batch["missing"]:  # every stand-in unreadable too: the shard would lose rows and its random draws
                raise DataError(
                    f"{batch['missing']} image(s) of a batch of {self.name} and the next "
                    f"{REPLACEMENT_TRIES - 1} in the order are unreadable: {batch['skipped'][0][1]}"
                )
            yield Batch(
                batch_of(batch["images"], self.preprocessing),
                batch["labels"],
                batch["indices"],
                self.max_value,
                batch_size,
                shard,
                per_image_augmented=self.crop is not None,
            )

    def epoch_order(self, epoch_seed: int, batch_size: int, world_size: int) -> torch.Tensor:
        """The epoch's order: whole tar shards per rank where `shard_order` asks for it (shards in object storage,
        by default), else every sample shuffled alike."""
        shard_ids = getattr(self.index.store, "shard_ids", None)
        remote = getattr(self.index.store, "remote", False)
        if self.shard_order == "sequential" and shard_ids is None:
            raise DataError(f"--set shard_order=sequential reads tar shards whole; {self.name} is not tar shards")
        if shard_ids is not None and (self.shard_order == "sequential" or (self.shard_order == "auto" and remote)):
            return shard_sequential_order(shard_ids, epoch_seed, batch_size, world_size)
        return epoch_order(len(self), epoch_seed)

    def replacements(self, order: torch.Tensor, position: int) -> tuple[int, ...]:
        """The images that stand in for the one at `position` of the epoch's order if it cannot be read: the ones
        after it in the order (wrapping around), the same on every rank and worker."""
        length = len(order)
        return tuple(int(order[(position + k) % length]) for k in range(1, min(REPLACEMENT_TRIES, length)))

    def evaluation_batches(self, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        share = evaluation_share(len(self), rank, world_size)
        firsts = range(share.start, share.stop, batch_size)
        pool, slot = self.pool("eval")

        def plan() -> Iterator[list[Request]]:
            for first in firsts:
                yield [Request(i, source=slot) for i in range(first, min(first + batch_size, share.stop))]

        for batch in self.watched(pool, pool.loader(plan, len(firsts))):
            self.record(batch)
            if batch["images"] is not None:  # an unreadable image is left out of evaluation (and counted)
                yield Batch(
                    batch_of(batch["images"], self.preprocessing), batch["labels"], batch["indices"], self.max_value
                )

    def watched(self, pool: DecodePool, loader: DataLoader) -> Iterator[dict[str, Any]]:
        """The loader's batches; a worker that dies or hangs becomes one DataError naming the files the workers
        were reading, instead of a traceback from inside the DataLoader (or a wait forever)."""
        try:
            yield from loader
        except RuntimeError as error:
            text = str(error)
            if "DataLoader worker" not in text and "timed out" not in text:
                raise
            reading = pool.reading()
            cause = text.splitlines()[0].rstrip(".")
            raise DataError(
                f"a data-loading worker of {self.name} failed ({cause}) while the workers were reading "
                f"{', '.join(reading) or 'no file yet'}; a file that crashes the decoder can be found "
                "with --set workers=0, which reads in this process and names it"
            ) from None

    def record(self, batch: dict[str, Any]) -> None:
        """Note the batch's unreadable files; stop when there are too many of this source's (unless the caller
        decides: `limit_by_caller`)."""
        for location, message in batch["skipped"]:
            if location not in self._seen_skipped:
                self._seen_skipped.add(location)
                self.skipped.append(message)
        if not self.limit_by_caller:
            refuse_damaged(self.skipped, len(self), self.name, self.max_bad_fraction)


class ReaderSet(torch.utils.data.Dataset):
    """The readers a pool's workers serve, each request naming its reader (`Request.source`)."""

    def __init__(self, readers: list[SampleReader], reading: Any) -> None:
        self.readers = readers
        self.reading = reading  # shared memory: (reader, sample) each worker is on, to name the file if it dies

    def __len__(self) -> int:
        return sum(len(reader) for reader in self.readers)

    def __getitem__(self, request: Request) -> tuple[torch.Tensor | None, int, int, list[tuple[str, str]]]:
        return self.readers[request.source].read(request, lambda position: self.note(request.source, position))

    def note(self, source: int, position: int) -> None:
        info = torch.utils.data.get_worker_info()
        if info is not None and self.reading is not None:
            self.reading[2 * info.id], self.reading[2 * info.id + 1] = source, position


class DecodePool:
    """Worker processes decoding for one or more sources, made once: they persist across epochs (a fork per worker
    per epoch is seconds on a large index), and each pass hands them that pass's plan (`batches` lists of
    requests, made as they are asked for). Validation and test share one pool: two pools held four processes at the
    end of a run where two do the same work, one pass after the other (issue 38)."""

    def __init__(self, workers: int, prefetch: int, pin_memory: bool, seed: int) -> None:
        self.workers, self.prefetch, self.pin_memory, self.seed = workers, prefetch, pin_memory, seed
        self.readers: list[SampleReader] = []
        self.requests = PassRequests()
        self._loader: DataLoader | None = None
        self._reading: Any = None

    def add(self, reader: SampleReader) -> int:
        """Serve `reader` too; its requests name the slot returned. Only before the workers start."""
        if self._loader is not None:
            raise RuntimeError("a decode pool takes its readers before its workers start")
        self.readers.append(reader)
        return len(self.readers) - 1

    def loader(self, plan: Callable[[], Iterator[list[Request]]], batches: int) -> DataLoader:
        if self._loader is None:
            if self.workers:
                import multiprocessing

                self._reading = multiprocessing.Array("q", [-1] * (2 * self.workers), lock=False)
            # Its own generator: a DataLoader draws its workers' base seed from the global RNG each time a pass
            # starts, which would shift dropout and stochastic depth between a resumed run and an uninterrupted one
            # (the workers need no torch randomness: crops are seeded per image).
            self._loader = DataLoader(
                ReaderSet(self.readers, self._reading),
                batch_sampler=self.requests,
                collate_fn=collate,
                num_workers=self.workers,
                prefetch_factor=self.prefetch if self.workers else None,
                pin_memory=self.pin_memory,
                persistent_workers=self.workers > 0,
                generator=torch.Generator().manual_seed(self.seed),
                timeout=BATCH_TIMEOUT_SECONDS if self.workers else 0,
                worker_init_fn=start_worker,
            )
        self.requests.plan, self.requests.batches = plan, batches
        return self._loader

    def start(self) -> None:
        """Fork the workers now (a pass with no batches), while the process forking them is small: a worker
        forked late, from a process that has grown, keeps its copy of every page the parent writes afterwards."""
        if self.workers and self._loader is None:
            for _ in self.loader(lambda: iter(()), 0):
                pass

    def reading(self) -> list[str]:
        """The files the workers are reading now."""
        pairs = list(zip(self._reading[::2], self._reading[1::2])) if self._reading is not None else []
        readers = self.readers
        return [redacted(readers[source].index.location(int(position))) for source, position in pairs if position >= 0]

    def close(self) -> None:
        """Stop the workers now (they also stop when the pool is collected, or the process ends); a later pass
        starts new ones."""
        iterator = getattr(self._loader, "_iterator", None)  # the persistent pass DataLoader keeps
        if iterator is not None:
            iterator._shutdown_workers()
        self._loader = None


def start_worker(worker_id: int) -> None:
    """Each worker gives its decoded images' memory back when done with them: with the allocator settings of the
    training process (`vitlab.hardware`), which a forked worker inherits, it grew with every batch. And it leaves
    a hand-over its parent dropped to the parent to report (`quiet_dropped_handovers`)."""
    return_freed_memory()
    quiet_dropped_handovers()


def quiet_dropped_handovers() -> None:
    """A worker hands each batch's tensors to its parent as file descriptors, through a socket served by a
    thread of multiprocessing's `resource_sharer`, which prints any error it meets with `sys.excepthook`. A
    parent interrupted (Ctrl-C, SIGINT to it alone) while it took one hangs up mid-handshake, and the worker
    printed a ConnectionResetError traceback before the parent's own "interrupted" (1 run in 3 where a batch is
    many tensors, NaFlex images of their own sizes). The parent knows why it stopped and says so: here the
    connection errors of that thread are dropped; every other error is shown as before."""
    import sys

    shown = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        if issubclass(kind, (ConnectionError, EOFError)) and from_resource_sharer(trace):
            return
        shown(kind, error, trace)

    sys.excepthook = hook


def from_resource_sharer(trace: Any) -> bool:
    """Whether any frame of a traceback is in multiprocessing's resource_sharer (its serving thread's loop)."""
    from pathlib import Path

    while trace is not None:
        path = Path(trace.tb_frame.f_code.co_filename)
        if path.name == "resource_sharer.py" and path.parent.name == "multiprocessing":
            return True
        trace = trace.tb_next
    return False


def share_evaluation_workers(sources: list[StreamingSource | None], starts_with: StreamingSource) -> None:
    """One pool of workers for the evaluation passes of `sources` (validation and test), forked with the training
    workers of `starts_with`, while the training process is still small."""
    present = [source for source in sources if source is not None and source.workers]
    if present:
        first = present[0]
        pool = DecodePool(first.workers, first.prefetch, first.pin_memory, first.seed)
        for source in present:
            source.evaluation_pool, source.evaluation_slot = pool, pool.add(source.reader)
        starts_with.started_with.append(pool)


class PassRequests:
    """A batch sampler whose plan is set before each pass over a persistent loader."""

    def __init__(self) -> None:
        self.plan: Callable[[], Iterator[list[Request]]] = lambda: iter(())
        self.batches = 0

    def __iter__(self) -> Iterator[list[Request]]:
        return self.plan()

    def __len__(self) -> int:
        return self.batches
