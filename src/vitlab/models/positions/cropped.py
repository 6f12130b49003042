"""C-RADIO's cropped position embedding (CPE; Ranzinger et al. 2024, "AM-RADIO: Agglomerative Vision Foundation
Model", and C-RADIO's `patch_generator`): one learned table of M x M rows for the largest image the model takes
(M = cpe_max_size / patch), from which every grid takes its positions. For a grid of rows x cols the table is
resized (bilinear) to the square of the longer side and its top-left rows x cols kept: every size that is a multiple
of the patch works, and a non-square grid sees the same spacing along both axes. The prefix tokens get no positions
(prefix_positions False). In training C-RADIO cuts random crops of the table; vitlab takes the inference rule always.
"""

from __future__ import annotations

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.pos_embed import interpolate_patch_positions
from vitlab.models.positions.absolute import AbsoluteTable
from vitlab.models.positions.base import PositionedModel, stored


def table_side(config) -> int:
    """M: the side, in patches, of the stored square table (cpe_max_size / patch)."""
    return int(config.cpe_max_size) // config.patch_size[0]


class CroppedTable(AbsoluteTable):
    """`pos_embed` (1, M * M, D), the same whatever the image size; each grid's rows are cut from it."""

    def create(self, model: PositionedModel) -> None:
        config = model.config
        if config.prefix_positions or config.patch_size[0] != config.patch_size[1]:
            raise ConfigError(
                "a cropped position table (pos_embed 'cpe') gives positions to square patches only: set "
                f"prefix_positions=False and a square patch, got {config.patch_size} and "
                f"prefix_positions={config.prefix_positions}"
            )
        side = table_side(config)
        model.pos_embed = nn.Parameter(torch.zeros(config.num_position_tables, side * side, config.embed_dim))

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        nn.init.normal_(stored(model.pos_embed), std=0.02)

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor:
        rows, cols = grid if grid is not None else model.config.grid_size
        side = table_side(model.config)
        longer = max(rows, cols)
        # (P, M * M, D) -> (P, longer * longer, D): the whole table stretched over the longer side.
        square = interpolate_patch_positions(stored(model.pos_embed), (side, side), (longer, longer), "bilinear")
        square = square.reshape(square.shape[0], longer, longer, -1)  # (P, longer, longer, D)
        return square[:, :rows, :cols].reshape(square.shape[0], rows * cols, -1)  # (P, rows * cols, D)

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        """Nothing to resample: the table covers every size up to cpe_max_size."""
