"""Building blocks of the Vision Transformer, one concept per file.

The names below load on first use, so that importing the package does not pull in torch.
"""

from __future__ import annotations

from vitlab.lazy import lazy_exports

_EXPORTS = {
    "Attention": "vitlab.layers.attention",
    "Block": "vitlab.layers.block",
    "DropPath": "vitlab.layers.drop",
    "Mlp": "vitlab.layers.mlp",
    "PatchEmbed": "vitlab.layers.patch_embed",
    "patchify": "vitlab.layers.patch_embed",
    "unpatchify": "vitlab.layers.patch_embed",
    "patch_grid": "vitlab.patch_grid",
    "resample_pos_embed": "vitlab.layers.pos_embed",
    "sincos_2d_pos_embed": "vitlab.layers.pos_embed",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
