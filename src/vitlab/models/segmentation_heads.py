"""Two plain segmentation heads on a ViT's last patch tokens, the baselines EoMT is compared with
(`vitlab.objectives.segmentation`, `--set segmentation.head=linear|upsampling`):

- `LinearSegmenter` (head kind "linear"): a 1x1 convolution from the patch grid (after the final norm)
  to K class logits, upsampled bilinearly to the input's pixels: the linear head of the dense probes, trained
  with the encoder.
- `UpsamplingSegmenter` ("upsampling"): SETR-PUP (Zheng et al. 2021, "Rethinking Semantic Segmentation from a
  Sequence-to-Sequence Perspective"): stages of a 3x3 convolution, a norm, ReLU and a x2 bilinear upsampling until
  the grid is at least the input's size (log2(patch) stages, rounded up: SETR's four for 16-pixel patches), then a
  1x1 convolution to K logits, resized to the input's pixels. GroupNorm stands where SETR has synchronised
  BatchNorm, so the head behaves the same on one process and many.

Both hold an encoder and one module on top (`segmentation_head`), as EoMT and Depth Anything do (models/dense.py),
so every command that takes a ViT takes them and `load_model` reads them back; the encoder keeps timm's names
(under "encoder.") and has no classification head. Their settings are the config's head part
(head_configs/segmentation.py). `forward(inputs) -> (B, K, H, W)` logits at the input's pixel size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError
from vitlab.head_configs import HeadConfig, LinearSegmentationConfig, UpsamplingSegmentationConfig
from vitlab.model_input import ModelInput
from vitlab.models.dense import DenseModel, copy_encoder_weights, headless
from vitlab.models.vit import VisionTransformer

GROUPS = 8  # GroupNorm's groups in the upsampling stages (as many as divide the channels, at most this)


class LinearSegmenter(DenseModel):
    head_parts = ("segmentation_head.",)

    def __init__(self, config: ViTConfig, encoder: VisionTransformer | None = None) -> None:
        if not isinstance(config.head, LinearSegmentationConfig):
            raise ConfigError(f"LinearSegmenter builds a config whose head is 'linear', got {config.dense_head!r}")
        super().__init__(config, encoder)  # the encoder has no image-level classifier: the classes are per pixel
        self.segmentation_head = nn.Conv2d(config.embed_dim, config.num_classes, kernel_size=1)

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """images (B, C, H, W) -> class logits (B, K, H, W)."""
        grid = self.encoder.forward_intermediates(inputs, 1, norm=True, intermediates_only=True)[0]  # (B, D, h, w)
        return F.interpolate(self.segmentation_head(grid), size=inputs.shape[-2:], mode="bilinear")


class UpsamplingSegmenter(DenseModel):
    head_parts = ("segmentation_head.",)

    def __init__(self, config: ViTConfig, encoder: VisionTransformer | None = None) -> None:
        if not isinstance(config.head, UpsamplingSegmentationConfig):
            raise ConfigError(
                f"UpsamplingSegmenter builds a config whose head is 'upsampling', got {config.dense_head!r}"
            )
        super().__init__(config, encoder)
        stages = max(1, math.ceil(math.log2(max(config.patch_size))))
        width = config.head.channels
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
        grid = self.encoder.forward_intermediates(inputs, 1, norm=True, intermediates_only=True)[0]  # (B, D, h, w)
        logits = self.segmentation_head(grid)  # (B, K, h * 2**stages, w * 2**stages)
        return F.interpolate(logits, size=inputs.shape[-2:], mode="bilinear")


SEGMENTERS: dict[str, type[DenseModel]] = {"linear": LinearSegmenter, "upsampling": UpsamplingSegmenter}


def segmenter_from_backbone(
    backbone: VisionTransformer,
    head: str,
    num_classes: int,
    class_names: list[str] | None = None,
    upsampling_dim: int = 256,
) -> DenseModel:
    """A `head` ("linear" or "upsampling") segmenter on any vitlab encoder: the backbone's encoder weights copied,
    the head fresh. As `vitlab.models.eomt.eomt_from_backbone`: the backbone's image head and pooling are dropped,
    and a final norm that sat on the pooled vector (fc_norm) goes to every token."""
    settings: HeadConfig = (
        LinearSegmentationConfig() if head == "linear" else UpsamplingSegmentationConfig(channels=upsampling_dim)
    )
    config = headless(backbone.config).replace(head=settings, num_classes=num_classes, class_names=class_names)
    model = SEGMENTERS[head](config).to(backbone.patch_embed.proj.weight.device)
    copy_encoder_weights(backbone, model.encoder, f"a {head} segmenter")
    model.dynamic_size = backbone.dynamic_size
    return model
