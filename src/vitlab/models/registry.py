"""Build models by variant name ("B/16", "R50+B/16", "digits-8") or from a config."""

from __future__ import annotations

from typing import Any

import torch

from vitlab.config import ViTConfig, variant_config
from vitlab.models.vit import VisionTransformer


def create_model(variant: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """A freshly initialised VisionTransformer for a variant name or a ViTConfig, with config fields overridden."""
    config = variant if isinstance(variant, ViTConfig) else variant_config(variant, **overrides)
    if isinstance(variant, ViTConfig) and overrides:
        config = config.replace(**overrides)
    return VisionTransformer(config)


def model_stats(config: ViTConfig) -> tuple[int, float]:
    """(parameter count, GFLOPs of one image's forward pass) for a config, computed on the meta device so
    even ViT-H costs no memory. FLOPs count a multiply-add as 2, as torch's FlopCounterMode does."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = VisionTransformer(config)
        images = torch.empty(1, config.in_chans, *config.image_size)
    num_params = sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return num_params, counter.get_total_flops() / 1e9
