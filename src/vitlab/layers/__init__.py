"""Building blocks of the Vision Transformer, one concept per file."""

from vitlab.layers.attention import Attention
from vitlab.layers.block import Block
from vitlab.layers.drop import DropPath
from vitlab.layers.mlp import Mlp
from vitlab.layers.patch_embed import PatchEmbed, patchify, unpatchify
from vitlab.layers.pos_embed import resample_pos_embed, sincos_2d_pos_embed

__all__ = [
    "Attention", "Block", "DropPath", "Mlp", "PatchEmbed", "patchify", "unpatchify",
    "resample_pos_embed", "sincos_2d_pos_embed",
]
