"""Native aspect ratio under a patch budget (NaFlex, SigLIP 2; Dehghani et al. 2023's NaViT): each image is resized,
keeping its aspect ratio, to the largest grid of whole patches that holds at most `max_patches` of them, cut into
those patches, and a batch pads every image's patches to one length with a mask of the real ones
(`vitlab.PatchInput`). A 4:3 photo at 256 patches of 16 pixels becomes 14 x 18 patches (224 x 288 pixels) instead
of a 16 x 16 square.

The grid is the one SigLIP 2's image processor finds (transformers' `get_image_size_for_max_num_patches`, a
bisection over the scale): the largest scale s with ceil(H s / P) * ceil(W s / P) <= max_patches, each side at
least one patch. Both counts are step functions of s that rise just after s = k P / H (or k P / W), so that largest
scale is one of those steps: the candidates are tried from the largest down, exactly, instead of bisected.

That largest scale enlarges an image smaller than the budget: SigLIP 2's processor makes the 8x8 digits 256 patches
of 2x2 (32 x 32 pixels) where their own grid is 16. Without `upscale` (vitlab's input=naflex default) an image
whose own grid, its sides rounded up to whole patches, fits the budget keeps it: scale 1 at most.
"""

from __future__ import annotations

import math

import torch

from vitlab.errors import UsageError
from vitlab.model_input import PatchInput


def naflex_grid(height: int, width: int, patch_size: int, max_patches: int, upscale: bool = True) -> tuple[int, int]:
    """(rows, cols) of patches for an image of `height` x `width` pixels under the budget (see the module).
    upscale False: an image whose own grid (its sides rounded up to whole patches) fits keeps it instead of being
    enlarged to the largest grid that fits (8x8 digits in 2x2 patches: 4x4, not 16x16 at a budget of 256)."""
    if max_patches < 1:
        raise UsageError(f"--max-patches {max_patches}: at least one patch per image")
    if height < 1 or width < 1:
        raise UsageError(f"an image of {height} x {width} pixels has nothing to cut into patches")
    own = math.ceil(height / patch_size), math.ceil(width / patch_size)
    if not upscale and own[0] * own[1] <= max_patches:
        return own

    def grid(scale: float) -> tuple[int, int]:
        # The small tolerance keeps k P / H * H / P == k from rounding up to k + 1.
        rows = max(1, math.ceil(height * scale / patch_size - 1e-9))
        cols = max(1, math.ceil(width * scale / patch_size - 1e-9))
        return rows, cols

    steps = {k * patch_size / height for k in range(1, max_patches + 1)}
    steps |= {k * patch_size / width for k in range(1, max_patches + 1)}
    for scale in sorted(steps, reverse=True):
        rows, cols = grid(scale)
        if rows * cols <= max_patches:
            return rows, cols
    return 1, 1  # a sliver thinner than 1 / max_patches of its length: one patch


def naflex_pixel_size(
    height: int, width: int, patch_size: int, max_patches: int, upscale: bool = True
) -> tuple[int, int]:
    """The (height, width) in pixels an image of `height` x `width` is resized to: its NaFlex grid of patches."""
    rows, cols = naflex_grid(height, width, patch_size, max_patches, upscale)
    return rows * patch_size, cols * patch_size


def pad_patch_inputs(images: list[torch.Tensor], patch_size: int, length: int | None = None) -> PatchInput:
    """Images on their own grids ((C, rows * P, cols * P) each) -> one PatchInput: each image's patches in
    row-major order with their (row, col) coordinates, padded with zeros at coordinate (0, 0) to `length` (default:
    the longest) and masked out."""
    from vitlab.layers.patch_embed import cut_patches

    cut = [cut_patches(image[None], patch_size) for image in images]
    longest = max(len(part.patches[0]) for part in cut)
    length = longest if length is None else length
    if length < longest:
        raise UsageError(f"a batch padded to {length} patches holds an image of {longest}")
    dim = cut[0].patches.shape[-1]
    patches = torch.zeros(len(cut), length, dim, dtype=cut[0].patches.dtype)
    coords = torch.zeros(len(cut), length, 2, dtype=torch.long)
    valid = torch.zeros(len(cut), length, dtype=torch.bool)
    for row, part in enumerate(cut):
        count = part.patches.shape[1]
        patches[row, :count] = part.patches[0]
        coords[row, :count] = part.coords[0]
        valid[row, :count] = True
    return PatchInput(patches, coords, valid)


def patch_images(inputs: PatchInput, patch_size: int) -> list[torch.Tensor]:
    """The inverse of `pad_patch_inputs`: each image (C, rows * P, cols * P) back from its real patches, which a
    padded batch holds first, its whole grid in row-major order."""
    from vitlab.layers.patch_embed import unpatchify

    images = []
    for patches, coords, valid in zip(inputs.patches, inputs.coords, inputs.valid):
        count = int(valid.sum())
        rows, cols = (int(side) + 1 for side in coords[:count].amax(dim=0))
        images.append(unpatchify(patches[None, :count], patch_size, (rows, cols))[0])
    return images
