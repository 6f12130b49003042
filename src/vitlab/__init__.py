"""vitlab: build, train, fine-tune, understand and ship the Vision Transformer (Dosovitskiy et al. 2020).

The public names below load on first use, so `import vitlab` and `vitlab --help` do not pay for torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ViTConfig": "vitlab.config",
    "variant_config": "vitlab.variants",
    "variant_names": "vitlab.variants",
    "VisionTransformer": "vitlab.models.vit",
    "create_model": "vitlab.models.registry",
    "model_stats": "vitlab.models.registry",
    "PatchInput": "vitlab.model_input",
    "cut_patches": "vitlab.layers.patch_embed",
    "load_model": "vitlab.checkpoint.formats",
    "read_checkpoint": "vitlab.checkpoint.formats",
    "export_checkpoint": "vitlab.checkpoint.formats",
    "resolve_checkpoint": "vitlab.checkpoint.resolve",
    "save_model": "vitlab.checkpoint.io",
    "VitlabError": "vitlab.errors",
    "UsageError": "vitlab.errors",
    "ConfigError": "vitlab.errors",
    "CheckpointError": "vitlab.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
