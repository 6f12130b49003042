"""A tiny mnist-scenes for the segmentation tests: stand-in MNIST files (bars of random size and place, so the
scenes have ink with an anti-aliased rim) and split sizes small enough to build in milliseconds."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray) -> None:
    """`array` (uint8) as a gzipped IDX file, the format of MNIST's files."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.tobytes()))


def bars(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` 28x28 "digits": a white bar at a random place; labels cycle through 0..9."""
    generator = np.random.default_rng(seed)
    digits = np.zeros((count, 28, 28), np.uint8)
    for index in range(count):
        top, left = generator.integers(4, 12, 2)
        height, width = generator.integers(6, 14, 2)
        digits[index, top : top + height, left : left + width] = 255
    return digits, (np.arange(count) % 10).astype(np.uint8)


def write_mnist_files(folder: Path) -> Path:
    """MNIST's four IDX files (200 training, 40 test "digits") in `folder`; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count, seed in (("train", 200, 1), ("t10k", 40, 2)):
        images, labels = bars(count, seed)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


def tiny_scenes(monkeypatch, train: int = 64, validation: int = 16, test: int = 16) -> None:
    """mnist-scenes' splits at these sizes (validation digits: 50 of the 200)."""
    from vitlab.data import segmentation

    counts = dict(train=train, validation=validation, test=test, validation_digits=50)
    monkeypatch.setattr(segmentation, "SCENE_COUNTS", counts)
