"""The ResNet stem of the paper's hybrid models (section 3.1, "Hybrid Architecture"; official `models_resnet.py`).

A BiT-style ResNet v1.5 without its head: a 7x7/2 weight-standardised conv, GroupNorm, ReLU and a 3x3/2 max-pool,
then stages of bottleneck units (conv-GroupNorm-ReLU x3, projection shortcut on the first unit, ReLU after the
sum). Only the first stage keeps the resolution; each later one halves it. Its output feature map is what
`PatchEmbed` cuts into 1x1 "patches". Parameter names follow timm's ResNetV2 (`stem.conv`, `stages.0.blocks.0.conv1`).
"""

from __future__ import annotations

import torch
from torch import nn

from vitlab.layers.std_conv import MaxPool2dSame, StdConv2dSame
from vitlab.models import checkpointing


def group_norm(channels: int) -> nn.GroupNorm:
    # Flax's GroupNorm defaults, which the official checkpoints were trained with: 32 groups, eps 1e-6.
    return nn.GroupNorm(32, channels, eps=1e-6)


class Stem(nn.Module):
    def __init__(self, in_chans: int, width: int) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chans, width, kernel_size=7, stride=2)
        self.norm = group_norm(width)
        self.pool = MaxPool2dSame(kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.norm(self.conv(x))))


class Downsample(nn.Module):
    """The projection shortcut: a 1x1 conv (strided where the unit is) and GroupNorm."""

    def __init__(self, in_chans: int, out_chans: int, stride: int) -> None:
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, kernel_size=1, stride=stride)
        self.norm = group_norm(out_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (strided) -> 1x1 with 4x expansion; the 3x3 carries the stride, as in ResNet v1.5."""

    def __init__(self, in_chans: int, width: int, stride: int) -> None:
        super().__init__()
        out_chans = 4 * width
        needs_projection = in_chans != out_chans or stride != 1
        self.downsample = Downsample(in_chans, out_chans, stride) if needs_projection else None
        self.conv1 = StdConv2dSame(in_chans, width, kernel_size=1)
        self.norm1 = group_norm(width)
        self.conv2 = StdConv2dSame(width, width, kernel_size=3, stride=stride)
        self.norm2 = group_norm(width)
        self.conv3 = StdConv2dSame(width, out_chans, kernel_size=1)
        self.norm3 = group_norm(out_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = torch.relu(self.norm1(self.conv1(x)))
        y = torch.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return torch.relu(shortcut + y)


class ResNetStage(nn.Module):
    def __init__(self, in_chans: int, width: int, num_units: int, stride: int) -> None:
        super().__init__()
        units = [Bottleneck(in_chans, width, stride)]
        units += [Bottleneck(4 * width, width, 1) for _ in range(num_units - 1)]
        self.blocks = nn.Sequential(*units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetStem(nn.Module):
    """images (B, C, H, W) -> feature map (B, out_channels, H / stride, W / stride)."""

    def __init__(self, in_chans: int, stage_units: tuple[int, ...], width_factor: float = 1.0) -> None:
        super().__init__()
        width = int(64 * width_factor)
        self.stem = Stem(in_chans, width)
        stages, channels = [], width
        for index, num_units in enumerate(stage_units):
            stage_width = width * 2**index
            stages.append(ResNetStage(channels, stage_width, num_units, stride=1 if index == 0 else 2))
            channels = 4 * stage_width
        self.stages = nn.Sequential(*stages)
        self.out_channels = channels
        self.grad_checkpointing = False  # see `set_grad_checkpointing`

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Checkpoint each stage's activations while training (models/checkpointing.py), as the encoder's blocks."""
        self.grad_checkpointing = enable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        checkpoints = self.grad_checkpointing and self.training
        for stage in self.stages:
            x = checkpointing.run(checkpoints, stage, x)
        return x
