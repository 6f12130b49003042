"""Weight-standardised convolution with TensorFlow-style 'SAME' padding, as in the official hybrid's ResNet.

Weight standardisation (Qiao et al. 2019; used by BiT and the ViT hybrids) normalises each output filter's
kernel to zero mean and unit standard deviation before every convolution: (w - mean) / (std + eps) over
(in, kh, kw), exactly as the official code writes it. 'SAME' padding puts the odd pixel at the bottom / right,
which symmetric PyTorch padding cannot express, so it is computed per input size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) padding of one axis so the output has ceil(size / stride) positions."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int], value: float = 0.0) -> torch.Tensor:
    """Pad (B, C, H, W) for a 'SAME' convolution or pooling."""
    top, bottom = same_padding(x.shape[-2], kernel[0], stride[0])
    left, right = same_padding(x.shape[-1], kernel[1], stride[1])
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2dSame(nn.Conv2d):
    """Conv2d without bias whose kernel is standardised per output filter on every call."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1, eps: float = 1e-5) -> None:
        super().__init__(in_chans, out_chans, kernel_size, stride=stride, padding=0, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        mean = weight.mean(dim=(1, 2, 3), keepdim=True)
        std = weight.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
        weight = (weight - mean) / (std + self.eps)
        x = pad_same(x, self.kernel_size, self.stride)
        return F.conv2d(x, weight, None, self.stride)


class MaxPool2dSame(nn.Module):
    """Max pooling with 'SAME' padding; padded positions never win (they hold -inf)."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.kernel_size = (kernel_size, kernel_size)
        self.stride = (stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=float("-inf"))
        return F.max_pool2d(x, self.kernel_size, self.stride)
