"""Synthetic data for tests: files in the exact formats of the real data sets (no downloads here), photo folders
and tar shards, and small in-memory batch sources."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitlab.data.datasets import scan_folder
from vitlab.data.source import Batch, DataRequest, Splits, epoch_order, evaluation_share, rank_shard, steps_per_epoch
from vitlab.preprocessing import Preprocessing


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


CLASSES = ["cat", "dog", "fish"]


def folder_rows(root: Path) -> list[tuple[str, str]]:
    """(path relative to root, class name) of the folder's images, in scan_folder's order."""
    classes, found = scan_folder(root)
    return [(str(path.relative_to(root)), classes[label]) for path, label in found]


def write_shards(root: Path, folder: Path, count: int = 2) -> list[Path]:
    """WebDataset-style shards of the folder's images (KEY.png|jpg + KEY.cls) and classes.txt beside them."""
    root.mkdir(parents=True, exist_ok=True)
    rows = folder_rows(folder)
    paths = [root / f"train-{n:03d}.tar" for n in range(count)]
    for shard, path in enumerate(paths):
        with tarfile.open(path, "w") as archive:
            for number, (relative, class_name) in enumerate(rows):
                if number % count != shard:
                    continue
                key = f"sample{number:04d}"
                for name, data in (
                    (key + Path(relative).suffix, (folder / relative).read_bytes()),
                    (key + ".cls", str(CLASSES.index(class_name)).encode()),
                ):
                    member = tarfile.TarInfo(name)
                    member.size = len(data)
                    archive.addfile(member, io.BytesIO(data))
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return paths


def write_photos(root, per_class=24, classes=("cats", "dogs"), size=(40, 30), seed=0):
    generator = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            pixels = generator.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{index:03d}.jpg", quality=90)
    return root


def write_bad_image(path: Path, kind: str) -> Path:
    """One unreadable image file of a kind users meet: "corrupt" (a JPEG's first bytes, then noise), "truncated"
    (the first half of a JPEG), "empty", "text" (text named .jpg) or "bomb" (a PNG whose header claims 20000 x 20000
    pixels, over Pillow's limit: refused from the header, before any pixel is decoded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    photo = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(photo, "JPEG")
    jpeg = photo.getvalue()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)  # width, height, 8-bit grey
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(20001)))
        + chunk(b"IEND", b"")
    )
    contents = {
        "corrupt": jpeg[:20] + bytes(range(256)) * 2,
        "truncated": jpeg[: len(jpeg) // 2],
        "empty": b"",
        "text": b"these are notes, not a photo",
        "bomb": bomb,
    }
    path.write_bytes(contents[kind])
    return path


def three_shapes(folder):
    """Noise photos 300x100, 90x240 and 120x120 (width x height) as PNGs in `folder`: their paths."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (width, height) in {"wide": (300, 100), "tall": (90, 240), "square": (120, 120)}.items():
        pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8).numpy()
        paths.append(folder / f"{name}.png")
        Image.fromarray(pixels).save(paths[-1])
    return paths


class Stripes:
    """A batch source of synthetic 8x8 RGB images: class k has a bright horizontal stripe at row 2k, so a model
    can learn it. Everything callers read of a source is here; nothing is inherited from vitlab's own sources."""

    def __init__(self, name: str, count: int, seed: int, opened: list) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.name = name
        self.class_names = ["top", "middle", "bottom"]
        self.max_value = 255.0
        self.hflip = True  # a horizontal stripe flipped is the same stripe
        self._labels = torch.arange(count) % len(self.class_names)
        self._images = torch.randint(0, 60, (count, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator)
        for index, label in enumerate(self._labels.tolist()):
            self._images[index, :, 2 * label + 1] = 250
        self.closed = 0
        opened.append(self)

    def __len__(self) -> int:
        return len(self._images)

    @property
    def channels(self) -> int:
        return 3

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_size(self) -> tuple[int, int]:
        return SIZE, SIZE

    @property
    def preprocessing(self) -> Preprocessing:
        return Preprocessing.in_memory()

    @property
    def labels(self) -> torch.Tensor:
        return self._labels

    @property
    def skipped(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed += 1

    def training_batches(self, epoch_seed, batch_size, start_step=0, rank=0, world_size=1):
        order, shard = epoch_order(len(self), epoch_seed), rank_shard(batch_size, rank, world_size)
        for step in range(start_step, steps_per_epoch(len(self), batch_size)):
            rows = order[step * batch_size : (step + 1) * batch_size][shard]
            yield Batch(self._images[rows], self._labels[rows], rows, self.max_value, batch_size, shard)

    def evaluation_batches(self, batch_size, rank=0, world_size=1):
        share = evaluation_share(len(self), rank, world_size)
        for first in range(share.start, share.stop, batch_size):
            rows = torch.arange(first, min(first + batch_size, share.stop))
            yield Batch(self._images[rows], self._labels[rows], rows, self.max_value)

    def fingerprint(self) -> dict[str, object]:
        return {"count": len(self), "name": self.name}


class StripesData:
    """The opener (what a data-source module offers the loader table): 96 training and 48 test images; the
    validation split is carved as the request asks."""

    def __init__(self) -> None:
        self.requests: list[DataRequest] = []
        self.opened: list[Stripes] = []

    def open_splits(self, request: DataRequest) -> Splits:
        self.requests.append(request)
        held = int(request.val_size * 96) if request.val_size < 1 else int(request.val_size)
        train = Stripes("stripes", 96 - held, seed=request.seed, opened=self.opened)
        validation = Stripes("stripes validation", held, seed=request.seed + 1, opened=self.opened) if held else None
        return Splits(train, validation, self.test(), "carved" if held else "none")

    def open_split(self, request: DataRequest, split: str):
        self.requests.append(request)
        if split == "val":
            return self.open_splits(request).validation
        return Stripes("stripes", 96, seed=request.seed, opened=self.opened) if split == "train" else self.test()

    def test(self) -> Stripes:
        return Stripes("stripes test", 48, seed=99, opened=self.opened)


SIZE = 8  # the default recipe's model (digits-8) takes 8x8 images
