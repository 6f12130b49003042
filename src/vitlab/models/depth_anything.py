"""Depth Anything (Yang et al. 2024, "Depth Anything" arXiv:2401.10891 and "Depth Anything V2" arXiv:2406.09414):
monocular depth from a DINOv2 encoder and DPT's neck and head (layers/dpt.py).

    z_l = block_l(z_{l-1}),  l = 1..L                      the plain ViT encoder (models/vit.py), DINOv2's weights
    f_i = LN(z_{k_i})[patches] on the grid, i = 1..4     blocks k_i = the head's layers, after the final norm
    depth = DPTHead(f_1, f_2, f_3, f_4)                   (B, H, W): relative inverse depth, or metres (metric)

It follows the Depth-Anything-V2 repository (`depth_anything_v2/dpt.py`: `DINOv2.get_intermediate_layers(x,
layers, return_class_token=True)` with the final norm, then `DPTHead`) and transformers'
`DepthAnythingForDepthEstimation` (a `Dinov2Backbone` whose `out_indices` are the head's layers + 1, the embeddings
being its stage 0), whose `predicted_depth` it reproduces. The model holds its encoder (models/dense.py), whose
parameters keep timm's names under "encoder."; the head takes the original's (`depth_head.*`) and its settings are
the config's head part, `DPTConfig` (head_configs/dpt.py).
"""

from __future__ import annotations

import torch

from vitlab.config import ViTConfig
from vitlab.errors import ConfigError
from vitlab.head_configs import DPTConfig
from vitlab.layers.dpt import DPTHead
from vitlab.model_input import ModelInput
from vitlab.models.dense import DenseModel
from vitlab.models.vit import VisionTransformer


class DepthAnything(DenseModel):
    """An encoder (no classifier head) with DPT's depth head on four of its blocks."""

    head_parts = ("depth_head.",)

    def __init__(self, config: ViTConfig, encoder: VisionTransformer | None = None) -> None:
        """config: the model's config, its head a DPTConfig; encoder: the encoder to hold (None: a fresh one)."""
        if not isinstance(config.head, DPTConfig):
            raise ConfigError(f"DepthAnything builds a config whose head is a DPTConfig, got {config.dense_head!r}")
        settings = config.head
        super().__init__(config, encoder)
        self.settings = settings
        self.depth_head = DPTHead(
            config.embed_dim,
            settings.neck_sizes,
            settings.fusion_dim,
            settings.head_dim,
            config.patch_size,
            metric=settings.depth_range == "metric",
            max_depth=settings.max_depth,
        )
        # Any image whose sides are whole patches: the position table is resampled to each grid (bicubic for
        # DINOv2's, config.pos_resample), as DINOv2 and transformers do.
        self.dynamic_size = True

    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """images (B, C, H, W), H and W multiples of the patch -> depth (B, H, W) (transformers' `predicted_depth`)."""
        features = self.encoder.forward_intermediates(
            inputs, list(self.settings.layers), norm=True, output_fmt="NCHW", intermediates_only=True, stop_early=True
        )  # four (B, D, rows, cols)
        return self.depth_head(features)
