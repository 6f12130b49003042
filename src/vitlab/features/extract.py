"""The one extraction loop: a model's outputs for every image of a collection, in order, into a `ShardedStore`,
a part every `part_images` images, continuing where a killed run's last part ended.

The model is run by the caller (`batches`: the evaluation loop with the command's forward pass, `vitlab embed`'s
pooling or `vitlab dense`'s blocks), so this loop knows nothing of models: it places each batch's images (where
they came from, their labels), hands the outputs to the store's format, writes the parts and keeps the list of
unreadable files, which is recorded before each part (a run killed between the two meets those files again) and
once more at the end (every file, also when no image could be read).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from vitlab.data.source import Batch, BatchSource, ImageFiles
from vitlab.errors import DataError, UsageError
from vitlab.features.store import ShardedStore, UnreadableFiles
from vitlab.messages import unreadable_line

# (the images to run, the progress label) -> (batch, the format's outputs for its images), in order
RunBatches = Callable[[BatchSource, str], Iterable[tuple[Batch, Any]]]


@dataclass
class Extracted:
    """What a run of `extract` did."""

    started_at: int  # the position it began at (0 unless it continued a killed run)
    read: int  # images it read and stored (this run's alone)
    stored: int  # images the store holds, over every run that wrote it
    unreadable: list[str]  # files left out, over every run ("location: why")
    seconds: float  # this run's reading and computing, from the first image to the last part written


def extract(source: BatchSource, store: ShardedStore, batches: RunBatches, part_images: int, label: str) -> Extracted:
    """Every image of `source` from where the store's last run stopped: through `batches`, into `store`, a part
    every `part_images` images. label: the progress bar's. A run that stores no image at all (every file
    unreadable) raises a DataError after recording the unreadable files. `source` is closed at the end."""
    start = store.resume_position()
    remaining = from_position(source, start)
    unreadable = UnreadableFiles(store.unreadable())
    part_format = store.format
    first = stop = start

    def met() -> list[str]:
        return getattr(remaining, "skipped", []) or []

    def flush() -> None:
        nonlocal first
        if part_format.count:
            store.record_unreadable(unreadable.now(met()))  # before the part: a rerun meets those files again
            store.write(first, stop)
        first = stop

    started, read = time.perf_counter(), 0
    try:
        if start < len(source):
            for batch, outputs in batches(remaining, label + (f" from image {start}" if start else "")):
                positions = (batch.indices + start).tolist()
                paths = locations(source, positions)
                labels = batch.labels.tolist() if batch.labels is not None else [-1] * len(positions)
                part_format.add(paths, [int(value) if value >= 0 else None for value in labels], outputs)
                unreadable.stored(paths)
                read += len(positions)
                stop = positions[-1] + 1
                if part_format.count >= part_images:
                    flush()
            stop = len(source)
            flush()
    finally:
        remaining.close()
    seconds = time.perf_counter() - started
    left_out = unreadable.now(met())
    store.record_unreadable(left_out)
    stored = store.stored_images()
    if not stored:
        why = f": {unreadable_line(left_out)}" if left_out else ""
        raise DataError(f"no image of {source.name} could be read{why}; no features written to {store.folder}")
    return Extracted(start, read, stored, left_out, seconds)


def locations(source: BatchSource, positions: list[int]) -> list[str]:
    """Where each image came from: its file (streamed sources, image files), else `<data set>/<position>`."""
    index = getattr(source, "index", None)
    if index is not None and hasattr(index, "location"):
        return [index.location(i) for i in positions]
    if isinstance(source, ImageFiles):
        return [str(source.paths[i]) for i in positions]
    return [f"{source.name}/{i}" for i in positions]


def from_position(source: BatchSource, start: int) -> BatchSource:
    """The images of `source` from position `start` on, in order (where a killed run continues)."""
    if start == 0:
        return source
    if isinstance(source, ImageFiles):
        return ImageFiles(source.paths[start:], source.image_size, source.channels, source.preprocessing, source.name)
    subset = getattr(source, "subset", None)
    if subset is None:
        raise UsageError(f"{source.name} cannot be continued part-way; delete what the killed run wrote to start over")
    return subset(torch.arange(start, len(source)), source.name)
