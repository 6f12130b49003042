"""The patch grid: how many P x P patches fit an image, or why they do not.

It is the shape arithmetic of the patch embedding, and it lives here, free of torch, because the model config
needs it too (`ViTConfig.grid_size`) and `vitlab models` must answer without importing torch: it sits at the
bottom of the package order, beside the config, and layers/patch_embed.py reads it from there.
"""

from __future__ import annotations

from vitlab.errors import ConfigError


def patch_grid(image_size: tuple[int, int], patch_size: tuple[int, int], stride: int = 1) -> tuple[int, int]:
    """(rows, columns) of P x P patches of an image, seen through a stem of this stride (the hybrid's ResNet;
    1 without one), or a ConfigError saying which side does not divide and what size would."""
    grid = []
    for axis, image, patch in zip(("height", "width"), image_size, patch_size):
        if image % stride:
            raise ConfigError(
                f"image {axis} {image} is not a multiple of the ResNet stem's stride {stride}; "
                f"use an image size such as {max(stride, image // stride * stride)}"
            )
        image //= stride
        if image % patch:
            suggestion = whole_patches(image, patch) * stride
            raise ConfigError(
                f"patch size {patch} does not divide image {axis} {image * stride}"
                + (f" (feature map {image} after the stem)" if stride > 1 else "")
                + f"; use an image size of {suggestion} or a patch size that divides {image}"
            )
        grid.append(image // patch)
    return grid[0], grid[1]


def whole_patches(size: int, patch: int) -> int:
    """The multiple of `patch` nearest to `size` (the smaller one on a tie), at least one patch: the size every
    message suggests for a side that is not a whole number of patches (15 pixels at patch 2: 14)."""
    whole, rest = divmod(size, patch)
    return max(1, whole + (2 * rest > patch)) * patch
