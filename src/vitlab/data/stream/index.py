"""The sample index of a streaming data source: where each sample's encoded image bytes are, and its label.

Everything per sample lives in numpy arrays, never in Python lists of strings: a DataLoader sends the index to
its worker processes, and touching a Python object there writes its reference count, which copies the page it
sits on into the worker (copy-on-access, pytorch/pytorch#13246), so a list of a million path strings slowly
becomes one copy per worker. A numpy array is one object whatever its length. Paths are kept as their bytes in
one uint8 array with int64 offsets (`PackedStrings`).

The index says where the bytes are; a store of one kind per format knows how to read them: `FileStore` here
(folders, manifests), `TarStore` (shards.py), `HFStore` (hf.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from vitlab.data.source import digest
from vitlab.data.stream.remote import is_remote, join_url, read_remote_bytes, redacted
from vitlab.errors import DataError


class PackedStrings:
    """Many strings (file paths, tar member names) as one uint8 array of their bytes and int64 offsets (N+1,):
    string i is data[offsets[i]:offsets[i+1]]. Encoded with the file system's encoding (os.fsencode), so any
    name a directory listing returns comes back unchanged."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data = data  # uint8 (total bytes,)
        self.offsets = offsets  # int64 (N+1,)

    @classmethod
    def from_strings(cls, strings: list[str] | list[bytes]) -> PackedStrings:
        encoded = [os.fsencode(s) for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return os.fsdecode(self.data[self.offsets[i] : self.offsets[i + 1]].tobytes())

    def take(self, indices: np.ndarray) -> PackedStrings:
        """The strings at `indices` (any order, repeats allowed), packed anew."""
        starts, ends = self.offsets[indices], self.offsets[np.asarray(indices) + 1]
        lengths = ends - starts
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Each output byte's source position: its string's start plus its place within the string.
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return PackedStrings(self.data[positions], offsets)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.offsets.nbytes


class SampleStore(Protocol):
    """Where one format keeps its samples' bytes; see the module docstring."""

    def __len__(self) -> int: ...

    def location(self, i: int) -> str: ...

    def read_bytes(self, i: int) -> bytes: ...

    def locations_digest(self) -> str: ...

    def take(self, indices: np.ndarray) -> SampleStore: ...

    @property
    def nbytes(self) -> int: ...


class FileStore:
    """One file per sample: paths relative to `root` (kept once, so 100,000 paths under a long root cost only
    their own bytes). An absolute path in a manifest stays absolute (os.path.join keeps it)."""

    def __init__(self, root: str, paths: PackedStrings) -> None:
        self.root = root
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def location(self, i: int) -> str:
        path = self.paths[i]
        if is_remote(path):  # a URL stands as it is
            return path
        return join_url(self.root, path) if is_remote(self.root) else os.path.join(self.root, path)

    def read_bytes(self, i: int) -> bytes:
        path = self.location(i)
        if is_remote(path):  # a manifest in object storage: one request per image
            try:
                return read_remote_bytes(path)
            except FileNotFoundError:
                raise DataError(
                    f"{redacted(path)}: cannot read the image (no such object); the manifest names a file that is "
                    "not there, or it was moved or deleted after the index was built"
                ) from None
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as error:
            raise DataError(
                f"{path}: cannot read the image ({error.strerror or error}); the file was moved or "
                "deleted after the index was built, or the manifest names a file that is not there"
            ) from None

    def locations_digest(self) -> str:
        # Relative paths only: the same files under another mount point are the same data.
        return digest(self.paths.data.tobytes(), self.paths.offsets.tobytes())

    def take(self, indices: np.ndarray) -> FileStore:
        return FileStore(self.root, self.paths.take(indices))

    @property
    def nbytes(self) -> int:
        return self.paths.nbytes


@dataclass
class SampleIndex:
    """The samples of a streaming source, without their pixels; see the module docstring."""

    name: str  # e.g. "folder:photos", "manifest:train.csv", "shards:train-{000..015}.tar", "hf:/path"
    class_names: list[str] | None  # None for unlabeled data
    labels: np.ndarray  # int64 (N,); -1 where a sample has no label
    store: SampleStore  # where each sample's encoded bytes are (FileStore, TarStore or HFStore)

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if len(self.labels) != len(self.store):
            raise DataError(f"index {self.name!r}: {len(self.store)} samples but {len(self.labels)} labels")
        if self.class_names is not None and len(self.labels) and self.labels.max() >= len(self.class_names):
            index = int(np.argmax(self.labels >= len(self.class_names)))
            raise DataError(
                f"index {self.name!r}: label {int(self.labels[index])} of {self.location(index)} is "
                f"out of range 0..{len(self.class_names) - 1} ({len(self.class_names)} class names)"
            )

    def __len__(self) -> int:
        return len(self.labels)

    def location(self, i: int) -> str:
        """Where sample i is, for people: a file path, "shard.tar:member" or "hf:NAME[row]"."""
        return self.store.location(i)

    def read_bytes(self, i: int) -> bytes:
        """Sample i's encoded image (JPEG, PNG, ...), undecoded. A sample that cannot be read is a DataError
        naming its location, so a loader can skip it and say which."""
        return self.store.read_bytes(i)

    def fingerprint(self) -> dict[str, object]:
        """What a saved run records of its data: the count, a hash of the locations (relative paths; tar
        member names and sizes; a HF dataset's own fingerprint and rows) and a hash of the labels and class
        names."""
        names = "\n".join(self.class_names) if self.class_names is not None else ""
        return {
            "count": len(self),
            "locations": self.store.locations_digest(),
            "labels": digest(self.labels.tobytes(), names),
        }

    def subset(self, indices: np.ndarray, name: str | None = None) -> SampleIndex:
        """The samples at `indices` (int array, or a bool mask of length N), e.g. a train/val carving."""
        indices = np.asarray(indices)
        if indices.dtype == bool:
            indices = np.flatnonzero(indices)
        indices = indices.astype(np.int64, copy=False)
        return SampleIndex(name or self.name, self.class_names, self.labels[indices], self.store.take(indices))

    @property
    def shard_ids(self) -> np.ndarray | None:
        """int32 (N,): each sample's shard (an index into `shard_paths`), for sources stored in shards; None for
        the others. A loader gives each rank and worker whole shards, so each reads its files front to back."""
        return getattr(self.store, "shard_ids", None)

    @property
    def shard_paths(self) -> list[str] | None:
        return getattr(self.store, "shard_paths", None)

    def shard_of(self, i: int) -> int | None:
        """Sample i's shard (see `shard_ids`), or None for a source not stored in shards."""
        shard_ids = self.shard_ids
        return None if shard_ids is None else int(shard_ids[i])

    @property
    def nbytes(self) -> int:
        """Memory the index holds per sample: its arrays' bytes (a HF dataset's memory-mapped Arrow not counted)."""
        return self.labels.nbytes + self.store.nbytes


def labels_from_names(names: list[str]) -> tuple[list[str], np.ndarray]:
    """Class names (sorted unique) and int64 labels for per-sample class name strings."""
    class_names, labels = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)
    return [str(n) for n in class_names], labels.astype(np.int64)


def labels_from_integers(values: list[int]) -> tuple[list[str], np.ndarray]:
    """Class names "0".."max" and int64 labels for per-sample integer class indices."""
    labels = np.asarray(values, dtype=np.int64)
    return [str(i) for i in range(int(labels.max()) + 1)], labels
