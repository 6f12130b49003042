"""2-D rotary position embedding (RoPE, Su et al. 2021, in the axial 2-D form of DINOv3, Simeoni et al. 2025).

Instead of adding a position vector to a token, every block turns each patch token's query and key by angles that
depend on where the patch is: channel pairs of the first half of a head turn with the row coordinate, those of the
second half with the column, at frequencies theta^(-4i / head_dim). The product q . k then depends on the two
patches' offset only. Coordinates are the patch centres normalised to [-1, 1] on each image's own grid, so a
grid of any size and aspect ratio has its positions with nothing to resample. Prefix tokens (class, registers,
distillation) are never turned.

    angles(r, c) = 2 pi [y * f; x * f; y * f; x * f],  y = 2 (r + 0.5) / rows - 1,  x = 2 (c + 0.5) / cols - 1
    rotate(q) = q * cos(angles) + rotate_half(q) * sin(angles)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def rotary_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """(head_dim / 4,) the frequencies f_i = theta^(-4i / head_dim), one per channel pair and axis."""
    return 1.0 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)


def normalized_centres(coords: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    """coords (B, N, 2) integer (row, col), grids (B, 2) each sample's (rows, cols) -> (B, N, 2) float32 patch
    centres in [-1, 1]."""
    return 2.0 * (coords.float() + 0.5) / grids[:, None, :].float() - 1.0


def augment_centres(
    centres: torch.Tensor, shift: float | None = None, jitter: float | None = None, rescale: float | None = None
) -> torch.Tensor:
    """DINOv3's training-time augmentation of normalised patch centres (B, N, 2), one draw for the batch: a shift
    of both axes by U(-shift, shift) each, a stretch of each axis by exp(U(-log jitter, log jitter)), a zoom of
    both by exp(U(-log rescale, log rescale)). The model then cannot rely on absolute coordinates, only on the
    layout of patches (and sees grids larger and smaller than the training one)."""
    if shift is not None:
        centres = centres + torch.empty(2, device=centres.device).uniform_(-shift, shift)
    if jitter is not None:
        centres = centres * torch.empty(2, device=centres.device).uniform_(-math.log(jitter), math.log(jitter)).exp()
    if rescale is not None:
        spread = math.log(rescale)
        centres = centres * torch.empty(1, device=centres.device).uniform_(-spread, spread).exp()
    return centres


def rotary_angles(centres: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """centres (B, N, 2) in [-1, 1] -> angles (B, N, head_dim): [rows; cols] angles, the whole repeated twice, so
    that `rotate_half` pairs channel i with i + head_dim / 2 at the same frequency and axis."""
    frequencies = rotary_frequencies(head_dim, theta, centres.device)
    angles = 2 * math.pi * centres[..., None] * frequencies  # (B, N, 2, head_dim / 4)
    return angles.flatten(-2).tile(2)  # (B, N, head_dim)


def interleaved_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Perception Encoder's form (timm's RotaryEmbeddingCat): positions (B, N, 2) as (x, y), unnormalised ->
    angles (B, N, head_dim): [x f_0, x f_0, x f_1, x f_1, ..., y f_0, y f_0, ...], each angle on a channel pair
    (2i, 2i + 1), no factor 2 pi."""
    frequencies = rotary_frequencies(head_dim, theta, positions.device)
    angles = positions.float()[..., None] * frequencies  # (B, N, 2, head_dim / 4)
    return angles.flatten(-2).repeat_interleave(2, dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]: each adjacent channel pair turned by 90 degrees."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1; x2] -> [-x2; x1] along the last axis."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


@dataclass(eq=False)
class RotaryTable:
    """The rotation of one forward pass: cos and sin (B or 1, 1, N, head_dim) of the N patch tokens' angles, and
    how many prefix tokens come before them unturned."""

    cos: torch.Tensor
    sin: torch.Tensor
    num_prefix_tokens: int
    interleaved: bool = False  # channel pairs (2i, 2i + 1), Perception Encoder's; else (i, i + head_dim / 2)

    @classmethod
    def from_angles(cls, angles: torch.Tensor, num_prefix_tokens: int, interleaved: bool = False) -> RotaryTable:
        return cls(angles.cos()[:, None], angles.sin()[:, None], num_prefix_tokens, interleaved)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Queries or keys (B, heads, prefix + N, head_dim) -> the same with the patch tokens turned."""
        prefix = self.num_prefix_tokens
        patches = x[..., prefix:, :]
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        turned = patches * cos + (rotate_pairs if self.interleaved else rotate_half)(patches) * sin
        return torch.cat([x[..., :prefix, :], turned], dim=-2) if prefix else turned
