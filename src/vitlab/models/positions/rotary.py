"""2-D rotary positions (DINOv3's; the math is layers/rotary.py): no parameters, no table to resample. Every call
turns the patch tokens' queries and keys by angles of their coordinates, normalised on each image's own grid; a training model may move them first (DINOv3's shift, jitter and
rescale: `augment_centres`)."""

from __future__ import annotations

import torch

from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.rotary import RotaryTable, augment_centres, normalized_centres, rotary_angles
from vitlab.models.positions.base import PositionedModel, PositionKind


class Rotary2D(PositionKind):
    def rotary(self, model: PositionedModel, layout: PatchLayout, batch: int) -> RotaryTable:
        device = model.patch_embed.proj.weight.device
        if layout.coords is None:  # the whole grid, the same for every sample: one (1, N, head_dim) table
            coords, grids = layout.full_coords(device), torch.tensor([list(layout.grid)], device=device)
        else:
            coords, grids = layout.coords, layout.grids(batch, device)
        config = model.config
        centres = normalized_centres(coords, grids)
        if model.training and (config.rope_shift, config.rope_jitter, config.rope_rescale) != (None, None, None):
            centres = augment_centres(centres, config.rope_shift, config.rope_jitter, config.rope_rescale)
        angles = rotary_angles(centres, config.head_dim, config.rope_theta)
        return RotaryTable.from_angles(angles, model.config.num_prefix_tokens)
