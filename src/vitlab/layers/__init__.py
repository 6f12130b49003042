"""Building blocks of the Vision Transformer, one concept per file.

The names below load on first use, so that `vitlab.config` can import the torch-free `layers.patch_grid`
without this package pulling in torch (`vitlab models` runs without it).
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
    "patch_grid": "vitlab.layers.patch_grid",
    "resample_pos_embed": "vitlab.layers.pos_embed",
    "sincos_2d_pos_embed": "vitlab.layers.pos_embed",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
