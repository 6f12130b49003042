"""Patch-feature grids as memory-mapped NumPy shards, a small index beside each: the format of `vitlab dense`.

Why this format: the features of a collection are large (B/16 at 224 px: 196 patches x 768 floats, 0.6 MB an image
in float32, 6 GB for 10,000 photos), are written once in order and read many times in any order (a probe's epochs,
a picture of one photo). A `.npy` file is one header and the raw array, so `np.load(mmap_mode="r")` hands out any
image's rows without reading the rest, in every language NumPy's format has a reader for; Parquet (what `vitlab
embed` writes for one vector per image, vectors.py) would read and decode whole row groups, and safetensors files
cannot be appended to. The folder is the sharded store's (store.py), read as it is:

    settings.json                  the model, layers, norm, dtype, data and channel count, checked on resume
    part-<first>-<stop>.json       per image: path, label, rows, cols, the offset of its first row in the shard
    part-<first>-<stop>.npy        (tokens, channels): the patch tokens of images first..stop-1, row-major per image
                                   (written after its index: the shard counts from here)
    unreadable.json                images that could not be read (left out)
    complete.json                  written last: the count of images stored; a folder without it is being written
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.errors import DataError
from vitlab.features.store import Encoded, part_name, part_spans


@dataclass
class DenseImage:
    """One image's entry in the index of its shard."""

    path: str
    label: int | None
    rows: int
    cols: int
    offset: int  # the row of the shard's array where its patch tokens start


class GridParts:
    """The `PartFormat` of patch grids: the tokens of the shard being gathered, in one array kept from shard to shard
    (grown when a shard needs more rows, never shrunk): memory holds one shard's tokens once, in the stored dtype,
    whatever the number of images."""

    holds = "dense features"
    target = "folder"
    suffixes: tuple[str, ...] = (".json", ".npy")

    def __init__(self, channels: int, dtype: str) -> None:
        self.array = np.empty((0, channels), dtype)
        self.rows = 0
        self.images: list[DenseImage] = []

    @property
    def count(self) -> int:
        return len(self.images)

    def add(self, paths: list[str], labels: list[int | None], outputs: Any) -> None:
        """outputs: each image's grid, a tensor (channels, rows, cols), appended row-major."""
        for path, label, grid in zip(paths, labels, outputs, strict=True):
            offset = self.add_grid(grid.cpu())
            self.images.append(DenseImage(path, label, grid.shape[1], grid.shape[2], offset))

    def add_grid(self, grid: Any) -> int:
        """One grid (channels, rows, cols) appended row-major; returns its first row."""
        import torch

        channels, rows, cols = grid.shape
        count, offset = rows * cols, self.rows
        if offset + count > len(self.array):
            grown = np.empty((max(offset + count, 2 * len(self.array)), channels), self.array.dtype)
            grown[:offset] = self.array[:offset]
            self.array = grown
        torch.from_numpy(self.array[offset : offset + count]).copy_(grid.permute(1, 2, 0).reshape(count, channels))
        self.rows += count
        return offset

    def encoded(self) -> list[Encoded]:
        """The index, then the shard written from the array's own memory (a .npy header, then its bytes: no copy of
        the shard is made)."""
        tokens = self.array[: self.rows]
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(tokens))
        index = json.dumps([entry.__dict__ for entry in self.images]).encode()
        return [index, [header.getvalue(), tokens.data.cast("B")]]

    def clear(self) -> None:
        self.rows = 0
        self.images = []

    def images_in(self, part: Path) -> int:
        return len(json.loads(part.with_name(part.name + ".json").read_text()))


class DenseFeatureFile:
    """A folder of dense features read back: `len`, and `[i]` the i-th stored image's grid (channels, rows, cols),
    read from its memory-mapped shard; `entries[i]` says where it came from."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not (self.folder / "settings.json").is_file():
            raise DataError(f"{self.folder} is not a folder of dense features (no settings.json)")
        self.settings = json.loads((self.folder / "settings.json").read_text())
        self.complete = (self.folder / "complete.json").is_file()
        self.entries: list[DenseImage] = []
        self.shard_of: list[int] = []
        self.shards: list[Path] = []
        for first, stop in part_spans(self.folder, GridParts.suffixes):
            name = part_name(first, stop)
            self.shards.append(self.folder / f"{name}.npy")
            for entry in json.loads((self.folder / f"{name}.json").read_text()):
                self.entries.append(DenseImage(**entry))
                self.shard_of.append(len(self.shards) - 1)
        self._open: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> np.ndarray:
        entry = self.entries[index]
        shard = self.shard_of[index]
        if shard not in self._open:
            self._open[shard] = np.load(self.shards[shard], mmap_mode="r", allow_pickle=False)
        rows = self._open[shard][entry.offset : entry.offset + entry.rows * entry.cols]  # (rows * cols, channels)
        return rows.reshape(entry.rows, entry.cols, -1).transpose(2, 0, 1)  # (channels, rows, cols), a view
