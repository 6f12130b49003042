"""2-D rotary positions (the math is layers/rotary.py). DINOv3's ("rope"): no parameters, no table to resample;
every call turns the patch tokens' queries and keys by angles of their coordinates, normalised on each image's own
grid; a training model may move them first (DINOv3's shift, jitter and rescale: `augment_centres`). Perception
Encoder's ("pe_rope"): its learned table, and a rotation by each patch's integer coordinates."""

from __future__ import annotations

import torch

from vitlab.layers.patch_layout import PatchLayout, constant
from vitlab.layers.rotary import (
    RotaryTable,
    augment_centres,
    interleaved_angles,
    normalized_centres,
    rotary_angles,
)
from vitlab.models.positions.absolute import LearnedTable
from vitlab.models.positions.base import PositionedModel, PositionKind


class Rotary2D(PositionKind):
    def rotary(self, model: PositionedModel, layout: PatchLayout, batch: int) -> RotaryTable:
        device = model.patch_embed.proj.weight.device
        if layout.coords is None:  # the whole grid, the same for every sample: one (1, N, head_dim) table
            coords, grids = layout.full_coords(device), layout.grids(1, device)
        else:
            coords, grids = layout.coords, layout.grids(batch, device)
        config = model.config
        centres = normalized_centres(coords, grids)
        if model.training and (config.rope_shift, config.rope_jitter, config.rope_rescale) != (None, None, None):
            centres = augment_centres(centres, config.rope_shift, config.rope_jitter, config.rope_rescale)
        angles = rotary_angles(centres, config.head_dim, config.rope_theta)
        return RotaryTable.from_angles(angles, model.config.num_prefix_tokens)


class PerceptionRotary(LearnedTable):
    """Perception Encoder's positions: the paper's learned table, and rotary positions turned besides it: each
    patch's integer (column, row), plus 1 when a class token sits at 0, rescaled to the model's own grid when the
    input's differs (timm's ref_feat_shape), in interleaved channel pairs."""

    def rotary(self, model: PositionedModel, layout: PatchLayout, batch: int) -> RotaryTable:
        device = model.patch_embed.proj.weight.device
        config = model.config
        if layout.coords is None:
            coords, grids = layout.full_coords(device), layout.grids(1, device)
        else:
            coords, grids = layout.coords, layout.grids(batch, device)
        own = constant(tuple(config.grid_size), device, torch.float32)
        offset = 1.0 if config.class_token else 0.0
        positions = (coords.float() + offset) * own / grids[:, None, :].float()  # (B, N, 2) rows, cols
        angles = interleaved_angles(positions.flip(-1), config.head_dim, config.rope_theta)  # (x, y)
        return RotaryTable.from_angles(angles, config.num_prefix_tokens, interleaved=True)
