"""Segmentation data for the training loop: images with a class for every pixel, as a batch source whose batches
carry their label maps (`Batch.label_maps`, int64 (B, H, W), 255 = left out of the loss and the metrics), and the
augmentation that moves an image and its mask together.

Two data sets, each one row of `vitlab.data.loaders.LOADERS` (held in memory; this module is their `SplitsOpener`):

- `mnist-scenes` (`vitlab.data.scenes`), built from the MNIST files in `--data-dir` (or the download cache) at the
  model's input size: its own three splits. The scenes are always those of seed 0 (`SCENE_SEED`), whatever the
  run's seed, so that every run, and the dense probe (`vitlab dense-probe --dataset mnist-scenes`), is measured
  on the same validation and test scenes. Training scenes: 10,000, or `max_train_images`; validation scenes:
  1,000, or `val_size` where it is a count (0: none); test scenes: 2,000.
- `segmentation`: a dense layout on disk (`--data-dir`: Pascal VOC, ADE20K or an image + mask manifest;
  `vitlab.data.dense_sets`), split as the dense probe splits it (`vitlab.data.probe_data.open_probe_data`: the
  official val split is the test split where there is no test split, validation carved from the training pairs
  by `val_size` and `seed`). Every pair is resized to the model's input size when read (the image bilinear,
  the mask nearest), so the figures are measured at that size, not at each image's own.

Augmentation (`augment_pairs`): one random scale jitter and crop per image (a zoom in `scale_range`, a random
position; zooming out pads the image with black and the mask with the ignore label), and a horizontal flip where
the data set allows one (photos: yes; digits: no), one affine warp that samples the image bilinearly and the mask
by its nearest pixel, so image and mask stay aligned to the pixel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from vitlab.data.preprocess import match_channels
from vitlab.data.probe_data import open_probe_data
from vitlab.data.source import Batch, BatchSource, DataRequest, InMemoryDataset, Splits, digest
from vitlab.data.transforms import Draws, on
from vitlab.errors import DataError
from vitlab.preprocessing import Preprocessing

IGNORE_LABEL = 255  # as vitlab.data.dense_sets, vitlab.data.scenes and vitlab.metrics.segmentation
SCENES = "mnist-scenes"
LAYOUTS = "segmentation"  # --dataset segmentation --data-dir VOC|ADE20K|MANIFEST
SCENE_SEED = 0  # mnist-scenes' scenes, the same for every run (see the module docstring)
# mnist-scenes' split sizes: those the dense probe's figures are measured on (BENCHMARKS.md); the validation scenes
# come from the MNIST training digits the MNIST recipes hold out (5,000).
SCENE_COUNTS = {"train": 10_000, "validation": 1_000, "test": 2_000, "validation_digits": 5_000}
DEFAULT_CANVAS = 56  # mnist-scenes without a model size (the dense probe's canvas)


@dataclass
class SegmentationDataset(InMemoryDataset):
    """Images and their label maps, held in memory: the batch source of segmentation data (`vitlab.data.source`).
    Its batches carry `label_maps`; its `labels` (one per image) are None."""

    images: torch.Tensor  # uint8 (N, C, H, W)
    label_maps: torch.Tensor  # uint8 (N, H, W): classes 0..K-1, 255 ignored
    class_names: list[str]
    name: str
    hflip: bool = False  # whether a horizontal flip keeps a scene's meaning (photos yes, digits no)
    max_value: float = 255.0
    ignore_label: int = IGNORE_LABEL
    skipped: list[str] = field(default_factory=list)  # pairs that could not be read, "location: why"
    preprocessing: Preprocessing = field(default_factory=Preprocessing.in_memory)
    labels: torch.Tensor | None = None  # no label per image

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.label_maps.shape != (len(self.images), *self.images.shape[-2:]):
            raise DataError(
                f"data set {self.name!r}: label maps {tuple(self.label_maps.shape)} do not fit images "
                f"{tuple(self.images.shape)}; each image needs a mask of its own size"
            )

    def batch(self, rows: torch.Tensor | slice, indices: torch.Tensor, **placing) -> Batch:
        """The images at `rows` with their label maps (int64), and no label per image."""
        return Batch(
            self.images[rows], None, indices, self.max_value, label_maps=self.label_maps[rows].long(), **placing
        )

    def fingerprint(self) -> dict[str, object]:
        """The count and hashes of the pixels and of the masks, which a saved run records."""
        return {
            "count": len(self),
            "content": digest(memoryview(self.images.contiguous().numpy()).cast("B")),
            "masks": digest(memoryview(self.label_maps.contiguous().numpy()).cast("B")),
        }

    def subset(self, indices: torch.Tensor) -> SegmentationDataset:
        return SegmentationDataset(
            self.images[indices],
            self.label_maps[indices],
            self.class_names,
            self.name,
            self.hflip,
            self.max_value,
            self.ignore_label,
            self.skipped,
            self.preprocessing,
        )


# ------------------------------------------------------------------------------------------------ augmentation
def augment_pairs(
    images: torch.Tensor,
    label_maps: torch.Tensor,
    draws: Draws,
    scale_range: tuple[float, float] = (1.0, 1.0),
    hflip: bool = False,
    ignore_label: int = IGNORE_LABEL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """images float (B, C, H, W), label_maps int64 (B, H, W) -> both warped alike, at their size: each image
    zoomed by a factor drawn uniformly from `scale_range` (> 1 enlarges: a random crop of 1/zoom of the image;
    < 1 shrinks it into a random place on a black canvas, its mask padded with `ignore_label`), and with `hflip`
    mirrored with probability 1/2. The image is sampled bilinearly, the mask by its nearest pixel, on one grid."""
    low, high = scale_range
    zoom = draws.uniform(low=low, high=high)
    side = 1.0 / zoom  # of the sampled window, in units of the image (normalised coordinates span 2)
    shift = draws.uniform(2, low=-1.0, high=1.0) * (1.0 - side).abs()[:, None]
    mirror = torch.where(draws.uniform() < 0.5, -1.0, 1.0) if hflip else torch.ones(len(zoom))
    zeros = torch.zeros_like(side)
    theta = torch.stack(
        [torch.stack([side * mirror, zeros, shift[:, 0]], 1), torch.stack([zeros, side, shift[:, 1]], 1)], 1
    )  # (B, 2, 3): output coordinates -> input coordinates
    grid = F.affine_grid(on(theta, images).to(images.dtype), list(images.shape), align_corners=False)
    warped = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    # Labels + 1 so that the zeros sampled from outside the mask become the ignore label, not class 0.
    shifted = (label_maps + 1).unsqueeze(1).to(grid.dtype)
    sampled = F.grid_sample(shifted, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    sampled = sampled.squeeze(1).round().long()
    return warped, torch.where(sampled == 0, ignore_label, sampled - 1)


# ------------------------------------------------------------------------------------------------ opening
def square_side(request: DataRequest) -> int:
    """The canvas of mnist-scenes: the model's input side (square), else DEFAULT_CANVAS."""
    if request.image_size is None:
        return DEFAULT_CANVAS
    height, width = request.image_size
    if height != width:
        raise DataError(f"mnist-scenes are square; the model takes {height}x{width}: fine-tune at --set image_size=N")
    return int(height)


def scene_splits(request: DataRequest) -> Splits:
    """mnist-scenes' three splits at the model's input size (see the module docstring for their sizes)."""
    from vitlab.data.scenes import CLASS_NAMES, mnist_scene_splits

    refuse_classes(request)
    val_size = request.val_size
    validation_count = 0 if val_size == 0 else int(val_size) if val_size >= 1 else SCENE_COUNTS["validation"]
    built = mnist_scene_splits(
        request.data_dir,
        request.max_train_images or SCENE_COUNTS["train"],
        max(validation_count, 1),
        SCENE_COUNTS["test"],
        seed=SCENE_SEED,
        validation_digits=SCENE_COUNTS["validation_digits"],
        allow_download=request.allow_download,
        canvas_size=square_side(request),
    )

    def source(split: str) -> SegmentationDataset:
        scenes = getattr(built, split)
        images = scenes.images if request.channels == 1 else scenes.images.expand(-1, request.channels, -1, -1)
        return SegmentationDataset(images.contiguous(), scenes.masks, list(CLASS_NAMES), f"{SCENES}:{split}")

    validation = source("validation") if validation_count else None
    return Splits(source("train"), validation, source("test"), "official" if validation else "none")


def layout_splits(request: DataRequest) -> Splits:
    """A dense layout's three splits (VOC, ADE20K, a manifest in `request.data_dir`), split as the dense probe
    splits it, every pair resized to the model's input size."""
    refuse_classes(request)
    if request.data_dir is None:
        raise DataError("--dataset segmentation reads a VOC or ADE20K folder or an image + mask manifest: --data-dir")
    if request.image_size is None:
        raise DataError("segmentation data are resized to the model's input size, which is not known here")
    fraction = request.val_size if 0 < request.val_size < 1 else 0.1
    data = open_probe_data(str(request.data_dir), None, None, "segmentation", fraction, seed=request.seed)
    if data.task != "segmentation":
        raise DataError(f"{request.data_dir} holds depth maps; segmentation fine-tuning needs masks")
    num_classes = data.num_classes or 0
    names = list(data.class_names) if data.class_names else [str(label) for label in range(num_classes)]

    def held(examples, split: str) -> SegmentationDataset:
        images, masks = [], []
        for example in examples:  # a pair whose mask does not fit is noted in data.skipped and left out
            image = match_channels(example.image[None], request.channels, "mean")
            images.append(F.interpolate(image, size=request.image_size, mode="bilinear", antialias=True)[0])
            mask = example.target[None, None].float()
            masks.append(F.interpolate(mask, size=request.image_size, mode="nearest")[0, 0])
        if not images:
            raise DataError(
                f"{request.data_dir}: no readable pair in its {split} split ({'; '.join(data.skipped[:2])})"
            )
        pixels = (torch.stack(images).clamp(0, 1) * 255).round().to(torch.uint8)
        return SegmentationDataset(
            pixels, torch.stack(masks).to(torch.uint8), names, f"{data.name}:{split}", hflip=True, skipped=data.skipped
        )

    train = held(data.train, "train")
    if request.max_train_images and request.max_train_images < len(train):
        keep = np.random.default_rng(request.seed).permutation(len(train))[: request.max_train_images]
        train = train.subset(torch.from_numpy(np.sort(keep)))
    validation = held(data.validation, "validation") if request.val_size else None
    return Splits(train, validation, held(data.test, "test"), "carved" if validation else "none")


def refuse_classes(request: DataRequest) -> None:
    if request.classes is not None:
        raise DataError("segmentation data keep every class of their masks; drop --set classes")


OPENERS = {SCENES: scene_splits, LAYOUTS: layout_splits}


def open_splits(request: DataRequest) -> Splits:
    """Train, validation and test of a segmentation data set (the `SplitsOpener` of `mnist-scenes` and
    `segmentation`)."""
    if request.dataset not in OPENERS:
        raise DataError(f"{request.dataset!r} is not a segmentation data set; choose {' or '.join(OPENERS)}")
    return OPENERS[request.dataset](request)


def open_split(request: DataRequest, split: str) -> BatchSource | None:
    """One split (see `SplitsOpener.open_split`); "train" is every training image (no `max_train_images`)."""
    splits = open_splits(request.replace(max_train_images=None) if split == "train" else request)
    return {"train": splits.train, "val": splits.validation, "test": splits.test}[split]
