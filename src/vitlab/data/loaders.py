"""Data sets by name: the one place that chooses between holding a data set's images in memory and streaming
them from their files, and the openers that do either.

Which format a data set is in is the registry's decision (`vitlab.data.formats`: the name given, or for `auto`
what `--data-dir` looks like); its row says whether the format may be held (`vitlab.data.datasets` decodes it
into memory), streamed (`vitlab.data.stream.splits`), or both (a folder: held while its decoded pixels fit
comfortably, streamed otherwise). Training, evaluation, few-shot, the linear probe and the export checks all open
data through `open_splits` / `open_split`, so a new format is a row of the registry and every command reads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vitlab.data import datasets, segmentation
from vitlab.data.formats import AUTO, FORMATS, DataFormat, format_named, resolve_format
from vitlab.data.images import collect_images, read_image, reason
from vitlab.data.naflex import patch_images
from vitlab.data.preprocess import InputSpec, to_unit_range
from vitlab.data.source import BatchSource, DataRequest, Splits, SplitsOpener
from vitlab.data.stream import splits as streamed
from vitlab.errors import DataError
from vitlab.model_input import PatchInput
from vitlab.preprocessing import resolved_preprocessing

MEMORY_SHARE = 0.25  # a folder is held in memory while its decoded pixels take at most this share of free memory


@dataclass(frozen=True)
class Loader:
    """How a data set is opened held in memory, streamed, or either."""

    held: SplitsOpener | None = None  # decodes every image into memory
    streamed: SplitsOpener | None = None  # reads images from their files as batches are asked for
    # With both: how many images a held copy would decode, counted without decoding (the size rule's count).
    count: Callable[[DataRequest], int] | None = None


def loader_for(data_format: DataFormat) -> Loader:
    """The openers of a registry row: `vitlab.data.datasets` holds, `vitlab.data.stream.splits` streams."""
    either = data_format.held and data_format.streamed
    return Loader(
        held=datasets if data_format.held else None,
        streamed=streamed if data_format.streamed else None,
        count=streamed.training_image_count if either else None,
    )


# The openers of every format, by name, made from the registry's rows. A data source written outside vitlab, with
# its own opener, plugs in here under its own name (the data seam's contract test, tests/data/test_loaders.py, does).
LOADERS: dict[str, Loader] = {name: loader_for(row) for name, row in FORMATS.items()}
# Segmentation data (images with a mask each, `vitlab.data.segmentation`): held in memory, their batches carry the
# label maps; only a segmentation objective trains on them.
LOADERS.update({name: Loader(held=segmentation) for name in segmentation.OPENERS})


def loader_of(dataset: str) -> Loader:
    """The openers of a data set name; an unknown name is the registry's DataError listing the known ones."""
    if dataset not in LOADERS:
        format_named(dataset)  # raises: not a format either
    return LOADERS[dataset]


def decided(request: DataRequest) -> DataRequest:
    """The request with its format decided by the registry (`resolve_format`): `auto` becomes the format its
    data_dir looks like, and a named format whose data_dir looks like another one is an error. A source plugged
    into `LOADERS` under its own name is taken as named."""
    if request.dataset != AUTO and request.dataset not in FORMATS:
        loader_of(request.dataset)
        return request
    name = resolve_format(request.dataset, request.data_dir).name
    return request if name == request.dataset else request.replace(dataset=name)


def can_stream(dataset: str) -> bool:
    """Whether the data set's images may be streamed (image files, including `auto`, which only finds image
    files; not the stored arrays of digits or CIFAR)."""
    return dataset == AUTO or (dataset in LOADERS and LOADERS[dataset].streamed is not None)


def available_memory() -> int:
    """Bytes of memory available to new allocations (MemAvailable), or all of it where that is unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def streaming_choice(request: DataRequest, processes: int = 1) -> tuple[bool | None, str]:
    """(stream?, why) for the request; `request.stream` (a recipe's, or a run's recorded choice) wins where the
    data set can go either way. None for data sets only ever held (the stored arrays). `processes`: how many
    processes on this machine would each hold the decoded pixels. A folder's files are listed (not decoded) to
    count them when the choice is left to their size."""
    request = decided(request)
    loader = loader_of(request.dataset)
    if loader.streamed is None:
        return None, f"{request.dataset} is held in memory"
    if loader.held is None:
        if request.stream is False:
            raise DataError(f"{request.dataset} data are always streamed; drop --set stream=false")
        return True, f"{request.dataset} data are read lazily"
    naflex = request.preprocessing is not None and request.preprocessing.mode == "naflex"
    if naflex and request.stream is False:
        raise DataError(
            "a NaFlex contract keeps each image at its own size, which only streaming reads; drop stream=false"
        )
    if naflex:
        return True, "NaFlex images each keep their own size (streamed)"
    if request.stream is not None:
        return request.stream, f"--set stream={str(request.stream).lower()}"
    if request.image_size is None or loader.count is None:
        return False, "the model's input size is not known"
    count = loader.count(request)
    decoded = count * request.channels * request.image_size[0] * request.image_size[1]
    free = available_memory() // max(1, processes)
    if decoded > MEMORY_SHARE * free:
        return True, (
            f"its {count} images would take {decoded / 2**30:.1f} GiB decoded, more than "
            f"{MEMORY_SHARE:.0%} of the {free / 2**30:.1f} GiB free per process"
        )
    return False, f"its {count} images take {decoded / 2**20:.0f} MiB decoded"


def opener_for(request: DataRequest) -> SplitsOpener:
    """The opener that reads the request's (decided) data set: held or streamed, as `streaming_choice` says."""
    loader = loader_of(request.dataset)
    stream, _ = streaming_choice(request)
    if stream is None and request.stream:
        raise DataError(f"{request.dataset} is held in memory (its stored arrays are small); drop --set stream=true")
    opener = loader.streamed if stream else loader.held
    assert opener is not None  # streaming_choice streams only what can be streamed, and holds only what can be held
    return opener


def open_splits(request: DataRequest) -> Splits:
    """Train, validation and test of the request's data set as a training run uses them (validation official or
    carved by `request.val_size` and `request.seed`), held in memory or streamed as `streaming_choice` says."""
    request = decided(request)
    return opener_for(request).open_splits(request)


def open_split(request: DataRequest, split: str) -> BatchSource | None:
    """One split of the request's data set without opening the others: "train" (every training image, nothing
    carved off), "val" (official, or carved as `open_splits` carves it; None when there is none and
    `request.val_size` is 0) or "test"."""
    if split not in ("train", "val", "test"):
        raise DataError(f"split must be 'train', 'val' or 'test', got {split!r}")
    request = decided(request)
    return opener_for(request).open_split(request, split)


def gather_images(
    spec: Sequence[str],
    config: InputSpec,
    data_dir: str | None,
    limit: int,
    skipped: list[dict[str, str]] | None = None,
    split: str = "test",
    shuffle_seed: int | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], list[str] | None, list[str]]:
    """([0, 1] images at the model's size (N, C, H, W), or under a NaFlex contract each on its own grid (a list
    where their sizes differ), labels or None, names) from a data set name (its `split`:
    the first `limit` images, or a random `limit` of them with `shuffle_seed`: the first batch of an epoch in
    that seed's order) or from image files and folders. An unreadable file is left out and noted in `skipped`
    ({"path", "error"}), as `vitlab predict` does; none readable is an error."""
    if len(spec) == 1 and spec[0] in LOADERS and not Path(spec[0]).exists():  # a data set's name, not a path
        data = open_split(DataRequest.for_model(config, spec[0], data_dir=data_dir), split)
        if data is None:
            raise DataError(f"{spec[0]} has no {split} split; use the train or test split")
        try:
            count = min(limit, len(data))
            batches = (
                data.evaluation_batches(count) if shuffle_seed is None else data.training_batches(shuffle_seed, count)
            )
            batch = next(iter(batches))
        finally:
            data.close()
        if isinstance(batch.images, PatchInput):  # NaFlex: each image back on its own grid
            cut = to_unit_range(batch.images, batch.max_value, config)
            images = same_size_stacked(patch_images(cut, resolved_preprocessing(config, "files").patch))
        else:
            images = to_unit_range(batch.images, batch.max_value, config)
        labels = None
        if batch.labels is not None and data.class_names:
            labels = [data.class_names[int(label)] for label in batch.labels]
        return images, labels, [f"{spec[0]} {split} #{int(i)}" for i in batch.indices]
    pixels: list[torch.Tensor] = []
    names: list[str] = []
    for path in collect_images(spec):
        if len(pixels) == limit:
            break
        try:
            pixels.append(
                read_image(
                    path, config.image_size, config.in_chans, preprocessing=resolved_preprocessing(config, "files")
                )
            )
            names.append(path.name)
        except DataError as error:
            if skipped is not None:
                skipped.append({"path": str(path), "error": reason(error, path)})
    if not pixels:
        raise DataError(
            f"none of {', '.join(spec)} holds a readable image"
            + (f" ({skipped[0]['path']}: {skipped[0]['error']})" if skipped else "")
        )
    return same_size_stacked([to_unit_range(image[None], 255.0, config)[0] for image in pixels]), None, names


def same_size_stacked(images: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """Images stacked into one batch when they share a size; a list when they do not (NaFlex: each at its own
    aspect ratio)."""
    if len({tuple(image.shape) for image in images}) == 1:
        return torch.stack(images)
    return images
