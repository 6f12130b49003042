"""Build models by variant name ("B/16", "R50+B/16", "digits-8") or from a config."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from vitlab.config import ViTConfig
from vitlab.models.dense import DenseModel, VitlabModel
from vitlab.models.vit import VisionTransformer
from vitlab.variants import variant_config

# The model of each head kind (`ViTConfig.dense_head`, the kind of `config.head`): an encoder and the head
# (models/dense.py). Named, not imported: the dense modules import torch-heavy layers that a plain ViT needs not.
DENSE_MODELS: dict[str, str] = {
    "none": "vitlab.models.vit:VisionTransformer",
    "eomt": "vitlab.models.eomt:EoMT",
    "dpt": "vitlab.models.depth_anything:DepthAnything",
    "linear": "vitlab.models.segmentation_heads:LinearSegmenter",
    "upsampling": "vitlab.models.segmentation_heads:UpsamplingSegmenter",
}


def model_class(config: ViTConfig) -> type[VisionTransformer] | type[DenseModel]:
    """The class that builds `config`: the plain VisionTransformer, or the model of its dense head."""
    module, name = DENSE_MODELS[config.dense_head].split(":")
    return getattr(importlib.import_module(module), name)


def create_model(variant: str | ViTConfig, **overrides: Any) -> VitlabModel:
    """A freshly initialised model for a variant name or a ViTConfig, with config fields overridden: a
    VisionTransformer, or the dense model of its head's kind (`DENSE_MODELS`: an encoder and the head)."""
    config = variant if isinstance(variant, ViTConfig) else variant_config(variant, **overrides)
    if isinstance(variant, ViTConfig) and overrides:
        config = config.replace(**overrides)
    return model_class(config)(config)


def model_stats(config: ViTConfig) -> tuple[int, float]:
    """(parameter count, GFLOPs of one image's forward pass) for a config, computed on the meta device so
    even ViT-H costs no memory. FLOPs count a multiply-add as 2, as torch's FlopCounterMode does."""
    from torch.utils.flop_counter import FlopCounterMode

    def count(depth: int) -> tuple[int, int]:
        with torch.device("meta"):
            model = VisionTransformer(config.replace(depth=depth))
            images = torch.empty(1, config.in_chans, *config.image_size)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            # Every token through every block, the model's nominal work (forward skips the last block's tokens
            # that a class-token head does not read: models/fast_paths.py).
            model.forward_analysis(images, attention_layers=None, hidden_states=False)
        return sum(p.numel() for p in model.parameters()), counter.get_total_flops()

    if config.dense_head != "none":
        return dense_model_stats(config)
    # Every block has the same shapes, so counting depths 1 and 2 and extrapolating is exact, and it keeps
    # `vitlab models` fast (counting dispatches every op in Python).
    params_1, flops_1 = count(1)
    params_2, flops_2 = count(2)
    extra_blocks = config.depth - 1
    return params_1 + extra_blocks * (params_2 - params_1), (flops_1 + extra_blocks * (flops_2 - flops_1)) / 1e9


def dense_model_stats(config: ViTConfig) -> tuple[int, float]:
    """`model_stats` of a model with a dense head, counted whole: its blocks differ (EoMT's last ones carry the
    queries) and its head's work depends on the image size, so depths 1 and 2 do not extrapolate."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = model_class(config)(config)
        images = torch.empty(1, config.in_chans, *config.image_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(images)
    return sum(p.numel() for p in model.parameters()), counter.get_total_flops() / 1e9
