"""Turning stored pixels into model input: scale to [0, 1], match the model's size and channels, normalise.

Augmentation runs between `to_unit_range` and `normalize`, on [0, 1] images.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from vitlab.errors import DataError


class InputSpec(Protocol):
    """What preprocessing needs to know of a model's input, and nothing else: its size, channels and the
    per-channel statistics it was trained with. A `ViTConfig` is one; so is any object with these fields."""

    image_size: tuple[int, int]
    in_chans: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]


def to_unit_range(images: torch.Tensor, max_value: float, spec: InputSpec) -> torch.Tensor:
    """uint8 / float images (B, C, H, W) with values in [0, max_value] -> float32 in [0, 1] at the model's image
    size (bilinear, antialiased when shrinking) and channel count (grey repeated to RGB, RGB averaged to grey)."""
    images = images.float() / max_value
    if images.shape[1] != spec.in_chans:
        if images.shape[1] == 1:
            images = images.expand(-1, spec.in_chans, -1, -1)
        elif spec.in_chans == 1:
            images = images.mean(dim=1, keepdim=True)
        else:
            raise DataError(f"cannot turn {images.shape[1]}-channel images into the model's {spec.in_chans} "
                            "channels; give 1- or 3-channel images, or a model made for these")
    if tuple(images.shape[-2:]) != spec.image_size:
        shrink = images.shape[-2] > spec.image_size[0] or images.shape[-1] > spec.image_size[1]
        images = F.interpolate(images, size=spec.image_size, mode="bilinear", align_corners=False, antialias=shrink)
    return images.contiguous()


def normalize(images: torch.Tensor, spec: InputSpec) -> torch.Tensor:
    """[0, 1] images -> (x - mean) / std with the model's statistics."""
    mean = torch.tensor(spec.image_mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(spec.image_std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (images - mean) / std


def prepare(images: torch.Tensor, max_value: float, spec: InputSpec) -> torch.Tensor:
    """Stored pixels -> model input, without augmentation (evaluation, prediction)."""
    return normalize(to_unit_range(images, max_value, spec), spec)
