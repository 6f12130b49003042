"""Dense features of a collection on disk: memory-mapped NumPy shards and a small index beside each.

Why this format: the features of a collection are large (B/16 at 224 px: 196 patches x 768 floats, 0.6 MB an image
in float32, 6 GB for 10,000 photos), are written once in order and read many times in any order (a probe's epochs,
a picture of one photo). A `.npy` file is one header and the raw array, so `np.load(mmap_mode="r")` hands out any
image's rows without reading the rest, in every language NumPy's format has a reader for; Parquet (what `vitlab
embed` writes for one vector per image) would read and decode whole row groups, and safetensors files cannot be
appended to. Shards, rather than one file, let a killed run keep what it wrote: each shard is written whole under a
temporary name, synced and moved into place (`files.atomic_write_bytes`), its index first, so a shard on disk is
complete, and a run that starts again with the same
settings continues after the last one (`DenseWriter.resume_position`).

The folder:

    settings.json                  the model, layers, norm, dtype, data and channel count, checked on resume
    part-<first>-<stop>.npy        (tokens, channels): the patch tokens of images first..stop-1, row-major per image
    part-<first>-<stop>.json       per image: path, label, rows, cols, the offset of its first row in the shard
    unreadable.json                images that could not be read (left out)
    complete.json                  written last: the image count; a folder without it is still being written
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitlab.errors import DataError, UsageError
from vitlab.files import atomic_write_bytes

DTYPES = ("float32", "float16")


@dataclass
class DenseImage:
    """One image's entry in the index of its shard."""

    path: str
    label: int | None
    rows: int
    cols: int
    offset: int  # the row of the shard's array where its patch tokens start


class DenseWriter:
    """The shards of one extraction run (see the module docstring)."""

    def __init__(self, folder: str | Path, settings: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.settings = settings
        if settings["dtype"] not in DTYPES:
            raise UsageError(f"dtype {settings['dtype']!r}: choose one of {', '.join(DTYPES)}")

    def complete(self) -> bool:
        return (self.folder / "complete.json").is_file()

    def resume_position(self) -> int:
        """Where the run continues: the end of the last shard written with the same settings (0: a new run)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "settings.json"
        if path.is_file():
            before = json.loads(path.read_text())
            changed = sorted(
                key for key in set(before) | set(self.settings) if before.get(key) != self.settings.get(key)
            )
            if changed:
                raise UsageError(
                    f"{self.folder} holds dense features written with other settings ({', '.join(changed)} "
                    "differ); delete it to start over, or write to another folder"
                )
        else:
            atomic_write_bytes(path, json.dumps(self.settings, indent=1, sort_keys=True).encode())
        return max((stop for _, stop in shard_spans(self.folder)), default=0)

    def write(self, first: int, stop: int, images: list[DenseImage], tokens: np.ndarray) -> None:
        """One shard: images first..stop-1 (those readable), their tokens (rows, channels) in order, written from
        the array's own memory (a .npy header, then its bytes: no copy of the shard is made)."""
        name = f"part-{first:012d}-{stop:012d}"
        tokens = np.ascontiguousarray(tokens.astype(self.settings["dtype"], copy=False))
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(tokens))
        atomic_write_bytes(self.folder / f"{name}.json", json.dumps([entry.__dict__ for entry in images]).encode())
        # Last: the shard counts from here.
        atomic_write_bytes(self.folder / f"{name}.npy", [header.getvalue(), memoryview(tokens).cast("B")])

    def unreadable(self) -> list[str]:
        path = self.folder / "unreadable.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def record_unreadable(self, entries: list[str]) -> None:
        atomic_write_bytes(self.folder / "unreadable.json", json.dumps(entries).encode())

    def finish(self, images: int) -> None:
        atomic_write_bytes(self.folder / "complete.json", json.dumps({"images": images}).encode())


class ShardBuffer:
    """The tokens of the shard being gathered, in one array kept from shard to shard (grown when a shard needs more
    rows, never shrunk): memory holds one shard's tokens once, in the stored dtype, whatever the number of images."""

    def __init__(self, channels: int, dtype: str) -> None:
        self.array = np.empty((0, channels), dtype)
        self.rows = 0

    def add(self, grid: Any) -> int:
        """One image's grid, a tensor (channels, rows, cols), appended row-major; returns its first row."""
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

    def taken(self) -> np.ndarray:
        """The rows gathered so far (a view, valid until the next `add` after `clear`)."""
        return self.array[: self.rows]

    def clear(self) -> None:
        self.rows = 0


def shard_spans(folder: Path) -> list[tuple[int, int]]:
    """(first, stop) of every complete shard, in order."""
    spans = []
    for path in folder.glob("part-*-*.npy"):
        _, first, stop = path.stem.split("-")
        if (folder / f"{path.stem}.json").is_file():
            spans.append((int(first), int(stop)))
    return sorted(spans)


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
        for first, stop in shard_spans(self.folder):
            name = f"part-{first:012d}-{stop:012d}"
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
