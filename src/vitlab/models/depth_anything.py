"""Depth Anything (Yang et al. 2024, "Depth Anything" arXiv:2401.10891 and "Depth Anything V2" arXiv:2406.09414):
monocular depth from a DINOv2 encoder and DPT's neck and head (layers/dpt.py).

    z_l = block_l(z_{l-1}),  l = 1..L                      the plain ViT encoder (models/vit.py), DINOv2's weights
    f_i = LN(z_{k_i})[patches] on the grid, i = 1..4     blocks k_i = config.dpt_layers, after the final norm
    depth = DPTHead(f_1, f_2, f_3, f_4)                   (B, H, W): relative inverse depth, or metres (metric)

It follows the Depth-Anything-V2 repository (`depth_anything_v2/dpt.py`: `DINOv2.get_intermediate_layers(x,
layers, return_class_token=True)` with the final norm, then `DPTHead`) and transformers'
`DepthAnythingForDepthEstimation` (a `Dinov2Backbone` whose `out_indices` are `dpt_layers` + 1, the embeddings
being its stage 0), whose `predicted_depth` it reproduces. The encoder keeps timm's parameter names and the head
the original's (`depth_head.*`), so every command that takes a ViT takes this model as one.
"""

from __future__ import annotations

import torch

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError
from vitlab.layers.dpt import DPTHead
from vitlab.model_input import ModelInput
from vitlab.models.vit import VisionTransformer


class DepthAnything(VisionTransformer):
    """A VisionTransformer (no classifier head) with DPT's depth head on four of its blocks."""

    def __init__(self, config: ViTConfig) -> None:
        if config.dense_head != "dpt":
            raise ConfigError(f"DepthAnything builds a config with dense_head='dpt', got {config.dense_head!r}")
        if config.num_classes:
            raise ConfigError(
                f"a Depth Anything model predicts depth, not classes: num_classes must be 0, got {config.num_classes}"
            )
        layers = list(config.dpt_layers)
        if layers != sorted(set(layers)):
            raise ConfigError(f"dpt_layers must name four different blocks, shallowest first; got {layers}")
        super().__init__(config)
        self.depth_head = DPTHead(
            config.embed_dim,
            config.dpt_neck_sizes,
            config.dpt_fusion_dim,
            config.dpt_head_dim,
            config.patch_size,
            metric=config.depth_range == "metric",
            max_depth=config.max_depth,
        )
        # Any image whose sides are whole patches: the position table is resampled to each grid (bicubic for
        # DINOv2's, config.pos_resample), as DINOv2 and transformers do.
        self.dynamic_size = True

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """images (B, C, H, W), H and W multiples of the patch -> depth (B, H, W) (transformers' `predicted_depth`)."""
        features = self.forward_intermediates(
            inputs, list(self.config.dpt_layers), norm=True, output_fmt="NCHW", intermediates_only=True, stop_early=True
        )  # four (B, D, rows, cols)
        return self.depth_head(features)
