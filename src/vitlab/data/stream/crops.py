"""Per-image crops for streamed training, done in the loader's worker processes on the decoded (or DCT-down-
scaled) image, before it is ever held at full size in a batch:

- `inception`: the pre-training crop of the paper's code (big_vision `decode_jpeg_and_inception_crop`, the
  "random resized crop" of Szegedy et al. 2015): a box of 5-100% of the area and aspect ratio 3/4-4/3, resized
  to the input size.
- `resize_small_crop`: the paper's transfer crop (big_vision `resize_small(448)|random_crop(384)`): the shorter
  side to `resize_small`, then a random box of the input size.
- horizontal flip with probability 1/2, where the data allow it.

Every random number comes from a generator seeded with (seed, epoch, image index) alone, so an image is cropped
the same way whatever the number of workers or processes, and a resumed run crops as an uninterrupted one.

JPEG files are decoded in draft mode (Pillow's `draft`: the decoder scales by 1/2, 1/4 or 1/8 in the DCT domain)
when the crop needs far fewer pixels than the file has, which is most of a photo's decode time saved.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from vitlab.data.preprocess import convert_mode, decoding

CROPS = ("inception", "resize_small_crop")


@dataclass(frozen=True)
class TrainCrop:
    """The recipe's per-image training crop (see the module docstring)."""

    kind: str = "inception"  # one of CROPS
    min_area: float = 0.05  # inception: smallest share of the image's area a box may cover
    max_area: float = 1.0
    min_ratio: float = 3 / 4  # inception: aspect ratios (width / height) drawn log-uniformly in this range
    max_ratio: float = 4 / 3
    resize_small: int = 0  # resize_small_crop: the shorter side before the crop (0: the paper's 448 for 384)
    hflip: bool = True
    resample: str = "bicubic"  # the resize kernel (the model's preprocessing contract names it)
    grey: str = "luma"  # how a one-channel model sees colour images (the contract's `grey`)


def transfer_resize_small(size: tuple[int, int]) -> int:
    """The shorter side the paper's transfer crop resizes to before cropping `size`: 448 for 384 (big_vision's
    transfer configs), the same ratio at other sizes."""
    return int(round(max(size) * 448 / 384))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one image's augmentation in one epoch."""
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF, index & 0xFFFFFFFF])


def inception_box(width: int, height: int, rng: np.random.Generator, crop: TrainCrop) -> tuple[int, int, int, int]:
    """(left, top, box width, box height): up to 10 tries at a box of the drawn area and ratio that fits, else the
    largest centred box within the ratio range (as torchvision and big_vision do)."""
    area = width * height
    log_ratios = (math.log(crop.min_ratio), math.log(crop.max_ratio))
    for _ in range(10):
        target = area * rng.uniform(crop.min_area, crop.max_area)
        ratio = math.exp(rng.uniform(*log_ratios))
        box_width = int(round(math.sqrt(target * ratio)))
        box_height = int(round(math.sqrt(target / ratio)))
        if 0 < box_width <= width and 0 < box_height <= height:
            left = int(rng.integers(0, width - box_width + 1))
            top = int(rng.integers(0, height - box_height + 1))
            return left, top, box_width, box_height
    ratio = width / height
    if ratio < crop.min_ratio:
        box_width, box_height = width, int(round(width / crop.min_ratio))
    elif ratio > crop.max_ratio:
        box_width, box_height = int(round(height * crop.max_ratio)), height
    else:
        box_width, box_height = width, height
    return (width - box_width) // 2, (height - box_height) // 2, box_width, box_height


def small_side_box(
    width: int, height: int, size: tuple[int, int], resize_small: int, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """(left, top, box width, box height) of the original image that `resize the shorter side to resize_small,
    then a random crop of size` keeps (sub-pixel: Pillow resizes from a float box)."""
    scale = resize_small / min(width, height)
    box_width, box_height = min(width, size[1] / scale), min(height, size[0] / scale)
    return rng.uniform(0, width - box_width), rng.uniform(0, height - box_height), box_width, box_height


def crop_image(
    data: bytes,
    size: tuple[int, int],
    channels: int,
    crop: TrainCrop,
    rng: np.random.Generator,
    flip_allowed: bool = True,
    grid: Callable[[int, int], tuple[int, int]] | None = None,
) -> np.ndarray:
    """Encoded image bytes -> uint8 (H, W, C) at `size` after the training crop and flip. `grid`: instead of
    `size`, the size the box itself is resized to ((box height, box width) -> (H, W); NaFlex's own grid of the
    box, so a crop keeps its aspect ratio). A bad file is a DataError in the words `decode_image` uses (the loader
    turns it into a skipped sample)."""
    from PIL import Image, ImageOps

    with decoding(data), warnings.catch_warnings(), Image.open(io.BytesIO(data)) as image:
        # Pillow only warns between 1x and 2x its pixel limit; a decompression bomb is refused here as
        # everywhere else vitlab decodes (`decode_image`).
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        rotated = image.getexif().get(0x0112, 1) != 1
        if rotated:  # boxes are drawn on the image as it is shown, so turn it first (and decode it whole)
            image = ImageOps.exif_transpose(image)
        width, height = image.size
        if crop.kind == "inception":
            # On its own grid (NaFlex) a crop's aspect ratio is drawn around the image's, not around a square's.
            aspect = width / height if grid is not None else 1.0
            native = replace(crop, min_ratio=crop.min_ratio * aspect, max_ratio=crop.max_ratio * aspect)
            left, top, box_width, box_height = inception_box(width, height, rng, native)
        else:
            resize_small = crop.resize_small or transfer_resize_small(size)
            left, top, box_width, box_height = small_side_box(width, height, size, resize_small, rng)
        flip = crop.hflip and flip_allowed and rng.uniform() < 0.5
        if grid is not None:
            size = grid(max(1, round(box_height)), max(1, round(box_width)))
        # DCT-domain down-scaling: ask for the whole image at the scale that still gives the box at least the
        # output's resolution; the decoder picks 1/1, 1/2, 1/4 or 1/8 at or above it.
        scale = min(box_width / size[1], box_height / size[0])
        if not rotated and image.format == "JPEG" and scale >= 2:
            # libjpeg's grey is luma; a contract whose grey is the channel mean drafts in colour and averages.
            mode = "L" if channels == 1 and crop.grey == "luma" else "RGB"
            image.draft(mode, (math.ceil(width / scale), math.ceil(height / scale)))
            factor_x, factor_y = image.size[0] / width, image.size[1] / height
            left, box_width = left * factor_x, box_width * factor_x
            top, box_height = top * factor_y, box_height * factor_y
        image = convert_mode(image, channels, crop.grey)
        resample = Image.Resampling.BICUBIC if crop.resample == "bicubic" else Image.Resampling.BILINEAR
        out = image.resize((size[1], size[0]), resample, box=(left, top, left + box_width, top + box_height))
        if flip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        array = np.array(out, dtype=np.uint8)  # its own writable copy: torch takes it without another
    return array[:, :, None] if array.ndim == 2 else array
