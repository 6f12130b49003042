"""DPT's neck and depth head (Ranftl et al. 2021, "Vision Transformers for Dense Prediction", arXiv:2103.13413), as
Depth Anything V1 and V2 (Yang et al. 2024, arXiv:2401.10891 and 2406.09414) put them on a DINOv2 encoder.

The neck turns the patch tokens of four blocks into an image again, coarse to fine:

    reassemble   r_i = resize_i(project_i(tokens_i on their grid))    1x1 conv to c_i channels, then 4x, 2x, 1x, 1/2x
    into width   l_i = conv3x3_i(r_i)                                  c_i -> the fusion width F, no bias
    fuse         p_4 = fuse_4(l_4),  p_i = fuse_i(p_{i+1}, l_i)       RCU on the new map, add, RCU, upsample, 1x1 conv
    head         depth = act(conv1x1(relu(conv3x3(up(conv3x3(p_1))))))  up: to the input's pixels; act: ReLU or sigmoid

RCU is the residual convolution unit x + conv(relu(conv(relu(x)))). Every resize is bilinear with aligned corners.

Parameter names are those of the Depth-Anything-V2 repository's `DPTHead` (`depth_anything_v2/dpt.py`, module
`depth_head`): `projects.N`, `resize_layers.N`, and under `scratch` the 3x3 convs `layerN_rn`, the fusion blocks
`refinenetN` (`resConfUnit1`, `resConfUnit2`, `out_conv`) and the output convs `output_conv1`, `output_conv2.{0,2}`,
so that its own `.pth` files map onto vitlab's by renaming the encoder alone. transformers'
`DepthAnythingForDepthEstimation` computes the same function under other names (checkpoint/families/depth_anything.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# Reassemble factors of the four maps, shallowest block first: 4x, 2x, 1x and 1/2x the patch grid (Depth Anything's;
# DPT-Base/Large use the same on a ViT at patch 16, which makes them 1/4 to 1/32 of the image).
REASSEMBLE_FACTORS = (4, 2, 1, 0.5)


def reassemble_resize(channels: int, factor: float) -> nn.Module:
    """The resize of one reassembled map: a transposed conv (kernel = stride = factor) to upsample, the identity, or
    a 3x3 conv of stride 2 to halve it (the coarsest map then has ceil(grid / 2) rows and columns)."""
    if factor > 1:
        return nn.ConvTranspose2d(channels, channels, kernel_size=int(factor), stride=int(factor))
    if factor == 1:
        return nn.Identity()
    return nn.Conv2d(channels, channels, kernel_size=3, stride=int(1 / factor), padding=1)


class ResidualConvUnit(nn.Module):
    """The pre-activation residual unit of RefineNet that DPT fuses with: x + conv2(relu(conv1(relu(x))))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(dim, dim, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class FeatureFusionBlock(nn.Module):
    """One fusion step: the coarser path plus an RCU of the new map, an RCU, an upsampling to `size` (x2 without one),
    a 1x1 conv. The deepest block has no coarser path: its `resConfUnit1` exists (the original's, and transformers')
    but is never used."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.resConfUnit1 = ResidualConvUnit(dim)  # the original's names, for its checkpoints
        self.resConfUnit2 = ResidualConvUnit(dim)
        self.out_conv = nn.Conv2d(dim, dim, kernel_size=1)

    def forward(
        self, path: torch.Tensor, skip: torch.Tensor | None = None, size: Sequence[int] | None = None
    ) -> torch.Tensor:
        """path (B, F, h, w) [+ RCU(skip (B, F, h, w))] -> (B, F, *size), or (B, F, 2h, 2w) without a size."""
        if skip is not None:
            path = path + self.resConfUnit1(skip)
        path = self.resConfUnit2(path)
        if size is None:
            path = F.interpolate(path, scale_factor=2, mode="bilinear", align_corners=True)
        else:
            path = F.interpolate(path, size=tuple(size), mode="bilinear", align_corners=True)
        return self.out_conv(path)


class DPTScratch(nn.Module):
    """What the original calls `scratch`: the 3x3 convs into the fusion width (`layerN_rn`), the four fusion blocks
    (`refinenetN`, N = 1 the finest) and the head's convolutions (`output_conv1`, `output_conv2`)."""

    def __init__(self, neck_sizes: Sequence[int], fusion_dim: int, head_dim: int, output_activation: nn.Module) -> None:
        super().__init__()
        for index, channels in enumerate(neck_sizes, start=1):
            setattr(self, f"layer{index}_rn", nn.Conv2d(channels, fusion_dim, kernel_size=3, padding=1, bias=False))
        for index in range(1, len(neck_sizes) + 1):
            setattr(self, f"refinenet{index}", FeatureFusionBlock(fusion_dim))
        self.output_conv1 = nn.Conv2d(fusion_dim, fusion_dim // 2, kernel_size=3, padding=1)
        self.output_conv2 = nn.Sequential(
            nn.Conv2d(fusion_dim // 2, head_dim, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(head_dim, 1, kernel_size=1),
            output_activation,
        )


class DPTHead(nn.Module):
    """DPT's neck and the depth head: the patch grids of four blocks -> one depth per input pixel.

    embed_dim: the encoder's width D; neck_sizes: the four reassembled maps' channels c_i; fusion_dim: F; head_dim:
    the channels of the head's last hidden conv; patch_size: the encoder's (the output is the grid times the patch);
    metric: sigmoid x max_depth (metric depth in metres) instead of ReLU x max_depth (relative inverse depth, where
    max_depth is 1; transformers multiplies in both cases)."""

    def __init__(
        self,
        embed_dim: int,
        neck_sizes: Sequence[int],
        fusion_dim: int,
        head_dim: int,
        patch_size: tuple[int, int],
        metric: bool = False,
        max_depth: float = 1.0,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.max_depth = max_depth
        self.projects = nn.ModuleList(nn.Conv2d(embed_dim, channels, kernel_size=1) for channels in neck_sizes)
        self.resize_layers = nn.ModuleList(
            reassemble_resize(channels, factor) for channels, factor in zip(neck_sizes, REASSEMBLE_FACTORS)
        )
        self.scratch = DPTScratch(neck_sizes, fusion_dim, head_dim, nn.Sigmoid() if metric else nn.ReLU())

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """features: four (B, D, rows, cols) patch grids, shallowest block first -> depth (B, rows * P, cols * P)."""
        rows, cols = features[0].shape[-2:]
        scratch = self.scratch
        # Reassemble: (B, D, rows, cols) -> (B, c_i, rows * s_i, cols * s_i), s_i = 4, 2, 1, 1/2; then width F.
        maps = [resize(project(x)) for x, project, resize in zip(features, self.projects, self.resize_layers)]
        layer_1, layer_2, layer_3, layer_4 = (
            conv(x)
            for conv, x in zip((scratch.layer1_rn, scratch.layer2_rn, scratch.layer3_rn, scratch.layer4_rn), maps)
        )
        # Fuse from the coarsest map up, each path upsampled to the next map's size, the finest one x2.
        path_4 = scratch.refinenet4(layer_4, size=layer_3.shape[-2:])
        path_3 = scratch.refinenet3(path_4, layer_3, size=layer_2.shape[-2:])
        path_2 = scratch.refinenet2(path_3, layer_2, size=layer_1.shape[-2:])
        path_1 = scratch.refinenet1(path_2, layer_1)  # (B, F, 8 rows, 8 cols)
        depth = scratch.output_conv1(path_1)  # (B, F/2, 8 rows, 8 cols)
        pixels = (rows * self.patch_size[0], cols * self.patch_size[1])
        depth = F.interpolate(depth, size=pixels, mode="bilinear", align_corners=True)
        depth = scratch.output_conv2(depth) * self.max_depth  # (B, 1, H, W)
        return depth.squeeze(1)
