"""Patch embedding, paper eq. 1: cut the image into P x P patches, flatten each, project it linearly to D.

A stride-P convolution with a P x P kernel is exactly that linear map applied to every patch, and it is the
fast way to compute it; `patchify` is the same cut written out, for data code and for teaching, and
`PatchEmbed.linear_weight` gives the projection as the paper's (P^2 C) x D matrix E.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitlab.model_input import PatchInput
from vitlab.patch_grid import patch_grid


def patchify(images: torch.Tensor, patch_size: int | tuple[int, int]) -> torch.Tensor:
    """Cut images into non-overlapping patches and flatten each one.

    images: (B, C, H, W). Returns (B, N, P_h * P_w * C) with N = (H / P_h) * (W / P_w) patches in row-major
    order, each flattened pixel by pixel with the channels innermost (the paper's x_p^i, and the layout of
    the official code's NHWC patches).
    """
    patch_h, patch_w = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    batch, channels, height, width = images.shape
    rows, cols = patch_grid((height, width), (patch_h, patch_w))
    patches = images.reshape(batch, channels, rows, patch_h, cols, patch_w)
    patches = patches.permute(0, 2, 4, 3, 5, 1)  # (B, rows, cols, P_h, P_w, C)
    return patches.reshape(batch, rows * cols, patch_h * patch_w * channels)


def unpatchify(patches: torch.Tensor, patch_size: int | tuple[int, int], grid_size: tuple[int, int]) -> torch.Tensor:
    """Inverse of `patchify`: (B, N, P_h * P_w * C) back to images (B, C, H, W)."""
    patch_h, patch_w = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    rows, cols = grid_size
    batch, num_patches, dim = patches.shape
    channels = dim // (patch_h * patch_w)
    images = patches.reshape(batch, rows, cols, patch_h, patch_w, channels)
    images = images.permute(0, 5, 1, 3, 2, 4)  # (B, C, rows, P_h, cols, P_w)
    return images.reshape(batch, channels, rows * patch_h, cols * patch_w)


def cut_patches(images: torch.Tensor, patch_size: int | tuple[int, int]) -> PatchInput:
    """A pixel batch (B, C, H, W) as a PatchInput: every patch of the grid, row-major, all valid."""
    patch_h, patch_w = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    patches = patchify(images, (patch_h, patch_w))
    rows, cols = images.shape[-2] // patch_h, images.shape[-1] // patch_w
    y, x = torch.meshgrid(
        torch.arange(rows, device=images.device), torch.arange(cols, device=images.device), indexing="ij"
    )
    coords = torch.stack([y.flatten(), x.flatten()], dim=-1)[None].expand(images.shape[0], -1, -1)
    valid = torch.ones(patches.shape[:2], dtype=torch.bool, device=images.device)
    return PatchInput(patches, coords, valid)


class PatchEmbed(nn.Module):
    """x_p E + b for every patch x_p, as a stride-P convolution. On the hybrid, `backbone` (a ResNet stem) runs
    first and the patches are cut from its feature map (the paper uses P = 1 there)."""

    def __init__(
        self,
        patch_size: tuple[int, int],
        in_chans: int,
        embed_dim: int,
        backbone: nn.Module | None = None,
        backbone_channels: int | None = None,
        bias: bool = True,
        norm_layer: Callable[[int], nn.Module] | None = None,
    ) -> None:
        """norm_layer: width -> a norm applied to every embedded patch (AIMv2's; timm's `patch_embed.norm`)."""
        super().__init__()
        self.patch_size = patch_size
        self.backbone = backbone
        proj_in = backbone_channels if backbone is not None else in_chans
        self.proj = nn.Conv2d(proj_in, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> tokens (B, N, D), patches in row-major order."""
        return self.norm(self.project(images).flatten(2).transpose(1, 2))  # (B, rows * cols, D)

    def project(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> the projected patches on their grid (B, D, rows, cols)."""
        features = images if self.backbone is None else self.backbone(images)
        patch_grid(tuple(features.shape[-2:]), self.patch_size)
        return self.proj(features)

    def embed_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """Already-cut patches (B, N, P_h * P_w * C), in `patchify`'s layout -> tokens (B, N, D): the same map as the
        convolution, written as the paper's x_p E + b (equal to float rounding)."""
        weight = self.proj.weight  # (D, C, P_h, P_w)
        matrix = weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)  # (D, P_h * P_w * C)
        return self.norm(torch.nn.functional.linear(patches, matrix, self.proj.bias))

    def linear_weight(self) -> torch.Tensor:
        """The projection E as a (P_h * P_w * C, D) matrix acting on `patchify` output."""
        weight = self.proj.weight  # (D, C, P_h, P_w)
        return weight.permute(2, 3, 1, 0).reshape(-1, weight.shape[0])
