"""EoMT's upscaling block (Kerssies et al. 2025, tue-mps/eomt `ScaleBlock`): a patch grid twice as fine per call.

    x -> ConvTranspose2d(k=2, s=2) -> GELU -> depthwise Conv2d(k=3, no bias) -> LayerNorm over channels

The transposed convolution doubles rows and columns; the depthwise 3x3 convolution mixes each channel with its
neighbours so the four children of a patch need not stay copies of one another. Parameter names are tue-mps's
(`conv1`, `conv2`, `norm`); transformers' `EomtScaleLayer` names the norm `layernorm2d`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map (timm's LayerNorm2d): each pixel normalised on its own."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__(channels, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C): the channels last, where layer_norm normalises
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)  # (B, C, H, W)


class ScaleBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels, bias=False)
        self.norm = LayerNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C, H, W) -> (B, C, 2H, 2W)."""
        return self.norm(self.conv2(self.act(self.conv1(x))))
