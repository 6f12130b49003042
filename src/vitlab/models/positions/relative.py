"""Relative attention (the paper's Table 8 "relative" row): no table on the tokens; every block's attention holds
a learned key per 1-D token offset (`blocks.N.attn.rel_pos_keys`, layers/relative_position.py)."""

from __future__ import annotations

import torch
from torch import nn

from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.relative_position import resample_relative_keys
from vitlab.models.positions.base import PositionedModel, PositionKind, replaced, stored


class RelativeOffsets(PositionKind):
    def relative_tokens(self, model: PositionedModel) -> int:
        return model.config.num_tokens

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        for block in model.blocks:
            nn.init.normal_(stored(block.attn.rel_pos_keys), std=0.02)

    def stretches_relative(self, layout: PatchLayout) -> bool:
        return layout.resample

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        # An approximation for a new grid: see layers/relative_position.py.
        for block in model.blocks:
            keys = stored(block.attn.rel_pos_keys)
            block.attn.rel_pos_keys = replaced(keys, resample_relative_keys(keys, new_config.num_tokens))
