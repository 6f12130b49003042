"""Image files: which names are images, how one is read at a model's size, and how a bad one is named.

The ground floor of the data package: every batch source that reads files (an image folder held in memory, a
streamed folder, the files named on a command line) and the commands that read single files (predict, serve,
analyze, the export checks) take these from here, so none of them has to import another source for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from vitlab.data.preprocess import decode_image
from vitlab.errors import DataError
from vitlab.preprocessing import Preprocessing

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
# One stated limit for image files held in memory and streamed: above this share of unreadable files the data
# are taken as damaged and the run stops.
MAX_BAD_FRACTION = 0.1


def refuse_damaged(unreadable: Sequence[str], files: int, name: str, max_fraction: float = MAX_BAD_FRACTION) -> None:
    """Stop (DataError, one line) when the `unreadable` files ("location: why" each) are more than `max_fraction`
    of `files`, the files the data were read from, readable or not: the data are damaged."""
    if len(unreadable) > max_fraction * files:
        raise DataError(
            f"{len(unreadable)} of {files} images of {name} are unreadable, more than {max_fraction:.0%}: the data "
            f"are damaged (first: {unreadable[0]}); repair or remove them"
        )


def collect_images(inputs: Iterable[str | Path]) -> list[Path]:
    """Image files named directly, plus every image file below each named folder (sorted)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not found:
                raise DataError(f"folder {path} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    return files


def read_image(
    path: Path | bytes,
    image_size: tuple[int, int],
    channels: int = 3,
    name: str | None = None,
    preprocessing: Preprocessing | None = None,
) -> torch.Tensor:
    """One image file (or its bytes, e.g. an upload; `name` is what messages call it) as uint8 (C, H, W) at
    `image_size`, under the preprocessing contract (default `Preprocessing.image_files()`: EXIF rotation applied,
    converted to RGB (or luma grey), the shorter side resized bicubic to fit and the centre cropped). Unreadable
    files and decompression bombs are a DataError; see `vitlab.data.preprocess.decode_image`, which does the work.
    """
    return decode_image(path, image_size, channels, preprocessing, name)


def reason(error: Exception, path: Path | str) -> str:
    """What is wrong with a file, without the file's name in front (for lists that name it already: a predict row,
    a skipped file's entry), so a message never reads "broken.png: broken.png: ...")."""
    message, prefix = str(error), f"{path}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
