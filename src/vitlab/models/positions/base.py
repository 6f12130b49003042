"""The position-kind seam: how the encoder learns where each patch is, asked of one object per model.

A kind keys positions by patch coordinates (`layers.patch_layout.PatchLayout`), so every way tokens arrive (the
whole grid of a pixel batch, MAE's kept patches, NaFlex's padded patches of any shape) gets its positions from the
same code. Per call it may give absolute tables to add to the tokens (`tables`), a rotation of the queries and keys
(`rotary`), or ask relative attention to stretch its offsets (`stretches_relative`); once it creates and
initialises its parameters, and it resamples them when the model's image size changes (`resample`).

Parameters stay where timm's key schema puts them (`pos_embed`, `pos_embed_row`, `pos_embed_col` on the model;
`blocks.N.attn.rel_pos_keys`), so a kind is a strategy over the model rather than a module of its own: it creates
them on the model and reads them from there. Adding a kind: a module here and one row in POSITION_KINDS
(positions/__init__.py), and its name in `vitlab.config.POSITION_EMBEDDINGS`.

`PositionKind` itself is the kind "none": the paper's Table 8 row without positional information.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from vitlab.config import ViTConfig
from vitlab.layers.attention import Attention
from vitlab.layers.patch_embed import PatchEmbed
from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.rotary import RotaryTable


class HasAttention(Protocol):
    attn: Attention


class PositionedModel(Protocol):
    """What a position kind reads and writes of its model (a VisionTransformer): the config, the absolute tables
    under timm's names (None where the kind has none), the blocks (relative attention's keys are in their
    attention) and the patch embedding (whose device the positions are made on)."""

    config: ViTConfig
    training: bool  # rotary positions augment coordinates in training only
    pos_embed: nn.Parameter | None
    pos_embed_row: nn.Parameter | None
    pos_embed_col: nn.Parameter | None
    blocks: Sequence[HasAttention]
    patch_embed: PatchEmbed


class PositionKind:
    """No positional information (and the defaults every kind inherits). A kind holds no state: it reads the
    model's config and parameters, so it follows every change of them (`set_image_size`, a new head)."""

    def relative_tokens(self, model: PositionedModel) -> int:
        """The length of the offset table every block's attention holds (relative attention); 0 for none."""
        return 0

    def create(self, model: PositionedModel) -> None:
        """Register the kind's parameters on `model` under timm's names (called once, from its constructor)."""

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        """The official code's initialisation of the kind's parameters."""

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor | None:
        """E_pos (P, prefix + rows * cols, D) for the whole of a grid (default: the model's own, as stored), or None
        without absolute positions."""
        return None

    def tables(self, model: PositionedModel, layout: PatchLayout, batch: int) -> torch.Tensor | None:
        """The absolute positions of this call's tokens: (P, prefix + N, D) for the whole grid in order, or (P, B,
        prefix + N, D) at per-sample coordinates; None without absolute positions."""
        return None

    def rotary(self, model: PositionedModel, layout: PatchLayout, batch: int) -> RotaryTable | None:
        """The rotation of this call's patch tokens' queries and keys; None without rotary positions."""
        return None

    def stretches_relative(self, layout: PatchLayout) -> bool:
        """Whether relative attention stretches its offset table to this call's length."""
        return False

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        """Follow a change of the model's image size (the patch size kept): the paper's fine-tuning at a higher
        resolution, section 3.2."""


def stored(table: nn.Parameter | None) -> nn.Parameter:
    """A table the kind created (`create`), typed as present."""
    if table is None:
        raise RuntimeError("the position table is missing: the model was not built by its position kind")
    return table


def replaced(parameter: nn.Parameter, values: torch.Tensor) -> nn.Parameter:
    """A new Parameter of `values`, on the old one's device and dtype and as trainable as it was."""
    return nn.Parameter(values.to(parameter), requires_grad=parameter.requires_grad)
