"""Synthetic data files in the exact formats of the real data sets, for tests (no downloads here)."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file: zero, zero, type 0x08 (unsigned byte), ndim, big-endian sizes, then the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_set(
    folder: Path, count: int = 20, size: int = 28, label_max: int = 10, seed: int = 0
) -> dict[str, bytes]:
    """The four MNIST-layout .gz files; returns name -> gzipped bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 256, size=(count, size, size), dtype=np.uint8)
        labels = np.arange(count) % label_max
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte.gz"
            files[name] = gzip.compress(idx_bytes(array))
            (folder / name).write_bytes(files[name])
    return files


def cifar_tarball(path: Path, classes: int = 10, per_batch: int = 6, payload: object | None = None) -> bytes:
    """A cifar-10/100-python.tar.gz lookalike: pickled dicts of bytes keys and uint8 arrays (protocol 2, as
    the originals). `payload` replaces the first batch with an arbitrary pickled object (for attacks)."""
    rng = np.random.default_rng(0)
    cifar10 = classes == 10
    root = "cifar-10-batches-py" if cifar10 else "cifar-100-python"
    members = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"] if cifar10 else ["train", "test"]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:

        def add(name: str, obj: object) -> None:
            data = pickle.dumps(obj, protocol=2)
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))

        for index, member in enumerate(members):
            labels = [int(v) for v in rng.integers(0, classes, per_batch)]
            batch = {
                b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                b"labels" if cifar10 else b"fine_labels": labels,
                b"filenames": [b"x.png"] * per_batch,
            }
            add(member, payload if (payload is not None and index == 0) else batch)
        names = [f"class{i}".encode() for i in range(classes)]
        add("batches.meta" if cifar10 else "meta", {b"label_names" if cifar10 else b"fine_label_names": names})
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()
