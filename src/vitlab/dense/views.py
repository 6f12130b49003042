"""How a dense probe sizes an image and its target: a square crop for training, the whole image for evaluation.

DINOv3's segmentation evaluation trains its linear head on 512-pixel crops and evaluates on the whole image with
its shorter side resized to 512, sliding 512-pixel windows over it; the logits are upsampled to the mask's own
size, so the metric counts the mask's own pixels. Here the training view is deterministic (the shorter side
resized to `side`, the centre `side` x `side` cut), because the probe trains on features computed once, and the
evaluation view keeps the aspect ratio with both sides whole patches. A target (mask or depth map) follows its
image's training view by nearest-neighbour resampling: labels and "no measurement" zeros must not be blended.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from vitlab.data.preprocess import crop_box, resize_unit_images, resized_size
from vitlab.errors import UsageError
from vitlab.preprocessing import Preprocessing

COVER_AND_CROP = Preprocessing(mode="crop", resize="bilinear")  # shorter side to the crop, then the centre cut


def training_view(image: torch.Tensor, target: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """image (C, H, W) in [0, 1], target (H, W) -> both with the shorter side resized to `side` and the centre
    `side` x `side` cut: (C, side, side) and (side, side). An image already that size is returned as it is."""
    if image.shape[-2:] != target.shape[-2:]:
        raise UsageError(f"image {tuple(image.shape[-2:])} and target {tuple(target.shape)} differ in size")
    if tuple(image.shape[-2:]) == (side, side):
        return image, target
    square = (side, side)
    view = resize_unit_images(image[None].float(), square, COVER_AND_CROP)[0]
    height, width = resized_size(image.shape[-2], image.shape[-1], square, COVER_AND_CROP)
    top, left = crop_box((height, width), square)
    resized = F.interpolate(target[None, None].float(), size=(height, width), mode="nearest-exact")[0, 0]
    return view, resized[top : top + side, left : left + side].to(target.dtype)


def evaluation_size(height: int, width: int, side: int, patch: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of an image's evaluation view: the shorter side resized to `side`, the aspect ratio kept,
    each side rounded to whole patches (at least one)."""
    scale = side / min(height, width)
    return (
        max(patch[0], round(height * scale / patch[0]) * patch[0]),
        max(patch[1], round(width * scale / patch[1]) * patch[1]),
    )


def evaluation_view(image: torch.Tensor, side: int, patch: tuple[int, int]) -> torch.Tensor:
    """image (C, H, W) in [0, 1] -> (C, h, w), its shorter side `side` and both sides whole patches
    (`evaluation_size`); an image already that size is returned as it is."""
    size = evaluation_size(image.shape[-2], image.shape[-1], side, patch)
    if tuple(image.shape[-2:]) == size:
        return image
    return resize_unit_images(image[None].float(), size, Preprocessing(mode="stretch", resize="bilinear"))[0]
