"""Two plain segmentation heads on a ViT's last patch tokens, the baselines EoMT is compared with
(`vitlab.objectives.segmentation`, `--set segmentation.head=linear|upsampling`):

- `LinearSegmenter` (ViTConfig.dense_head "linear"): a 1x1 convolution from the patch grid (after the final norm)
  to K class logits, upsampled bilinearly to the input's pixels: the linear head of the dense probes, trained
  with the encoder.
- `UpsamplingSegmenter` ("upsampling"): SETR-PUP (Zheng et al. 2021, "Rethinking Semantic Segmentation from a
  Sequence-to-Sequence Perspective"): stages of a 3x3 convolution, a norm, ReLU and a x2 bilinear upsampling until
  the grid is at least the input's size (log2(patch) stages, rounded up: SETR's four for 16-pixel patches), then a
  1x1 convolution to K logits, resized to the input's pixels. GroupNorm stands where SETR has synchronised
  BatchNorm, so the head behaves the same on one process and many.

Both are a VisionTransformer with one module on top (`segmentation_head`), as EoMT and Depth Anything are, so
every command that takes a ViT takes them and `load_model` reads them back; the encoder keeps timm's names and
has no classification head. `forward(inputs) -> (B, K, H, W)` logits at the input's pixel size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.model_input import ModelInput
from vitlab.models.eomt import BACKBONE_HEADS
from vitlab.models.vit import VisionTransformer

GROUPS = 8  # GroupNorm's groups in the upsampling stages (as many as divide the channels, at most this)


class LinearSegmenter(VisionTransformer):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        self.head = nn.Identity()  # no image-level classifier: the classes are per pixel
        self.segmentation_head = nn.Conv2d(config.embed_dim, config.num_classes, kernel_size=1)

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """images (B, C, H, W) -> class logits (B, K, H, W)."""
        grid = self.forward_intermediates(inputs, 1, norm=True, intermediates_only=True)[0]  # (B, D, h, w)
        return F.interpolate(self.segmentation_head(grid), size=inputs.shape[-2:], mode="bilinear")


class UpsamplingSegmenter(VisionTransformer):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        self.head = nn.Identity()
        stages = max(1, math.ceil(math.log2(max(config.patch_size))))
        width = config.upsampling_dim
        layers: list[nn.Module] = []
        for stage in range(stages):
            layers += [
                nn.Conv2d(config.embed_dim if stage == 0 else width, width, kernel_size=3, padding=1),
                nn.GroupNorm(math.gcd(GROUPS, width), width),
                nn.ReLU(),
                nn.Upsample(scale_factor=2, mode="bilinear"),
            ]
        layers.append(nn.Conv2d(width, config.num_classes, kernel_size=1))
        self.segmentation_head = nn.Sequential(*layers)

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """images (B, C, H, W) -> class logits (B, K, H, W)."""
        grid = self.forward_intermediates(inputs, 1, norm=True, intermediates_only=True)[0]  # (B, D, h, w)
        logits = self.segmentation_head(grid)  # (B, K, h * 2**stages, w * 2**stages)
        return F.interpolate(logits, size=inputs.shape[-2:], mode="bilinear")


SEGMENTERS: dict[str, type[VisionTransformer]] = {"linear": LinearSegmenter, "upsampling": UpsamplingSegmenter}


def segmenter_from_backbone(
    backbone: VisionTransformer,
    head: str,
    num_classes: int,
    class_names: list[str] | None = None,
    upsampling_dim: int = 256,
) -> VisionTransformer:
    """A `head` ("linear" or "upsampling") segmenter on any vitlab encoder: the backbone's encoder weights copied,
    the head fresh. As `vitlab.models.eomt.eomt_from_backbone`: the backbone's image head and pooling are dropped,
    and a final norm that sat on the pooled vector (fc_norm) goes to every token."""
    config = backbone.config.replace(
        dense_head=head,
        num_classes=num_classes,
        class_names=class_names,
        upsampling_dim=upsampling_dim,
        classifier="token" if backbone.config.class_token else "gap",
        representation_size=None,
        projection=False,
        fc_norm=False,
        final_norm=True,
        pool_heads=None,
        pool_mlp_dim=None,
    )
    model = SEGMENTERS[head](config).to(backbone.patch_embed.proj.weight.device)
    state = {name: value for name, value in backbone.state_dict().items() if not name.startswith(BACKBONE_HEADS)}
    if backbone.config.fc_norm:
        state.update({f"norm.{name}": value for name, value in backbone.fc_norm.state_dict().items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    encoder_missing = [name for name in missing if not name.startswith(("segmentation_head.", "norm."))]
    if encoder_missing or unexpected:
        raise UsageError(
            f"the backbone's encoder does not fit a {head} segmenter of its config: missing {encoder_missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.dynamic_size = backbone.dynamic_size
    return model
