"""Absolute positions: a table E_pos of one row per token, added to the tokens (paper eq. 1) or before every block
(Table 8's other columns), sampled at each patch's coordinates.

Three kinds of table: the paper's learned 1-D table ("learned", one row per token, interpolated in 2-D for another
grid), learned row and column halves ("learned_2d", Appendix D.4), and fixed 2-D sine-cosine ("sincos2d"). For
the whole grid of a pixel batch the table is used as it is; for tokens at coordinates (MAE's kept patches, NaFlex
patches whose images each have their own grid) every sample's rows are gathered from the table of its own grid.
"""

from __future__ import annotations

import torch
from torch import nn

from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.pos_embed import (
    axial_pos_embed,
    interpolate_1d_positions,
    interpolate_patch_positions,
    resample_pos_embed,
    sincos_2d_pos_embed,
)
from vitlab.models.positions.base import PositionedModel, PositionKind, replaced, stored


class AbsoluteTable(PositionKind):
    """What the three tables share: sampling at coordinates, and the tables of other grids kept while nothing trains
    them. A subclass says how the table of a grid is made."""

    def __init__(self) -> None:
        # grid -> (the table of that grid, copies of the stored tables it was made from), on the CPU only.
        self.kept: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def tables(self, model: PositionedModel, layout: PatchLayout, batch: int) -> torch.Tensor | None:
        own = None if not layout.resample else layout.grid
        if layout.coords is None:
            return self.table_of_grid(model, own)
        prefix = model.config.num_position_prefix
        coords = layout.coords
        grids = layout.grids(batch, coords.device)
        gathered = None
        for grid in layout.distinct_grids():  # one table per distinct grid (one, except for NaFlex)
            full = self.table_of_grid(model, grid if layout.resample or layout.sample_grids is not None else None)
            rows, cols = grid
            index = coords[..., 0].clamp(0, rows - 1) * cols + coords[..., 1].clamp(0, cols - 1)  # (B, N)
            patch_rows = full[:, prefix:][:, index]  # (P, B, N, D); padding tokens read some row, unused
            sampled = torch.cat([full[:, None, :prefix].expand(-1, batch, -1, -1), patch_rows], dim=2)
            if gathered is None:
                gathered = sampled
            else:
                mine = (grids[:, 0] == rows) & (grids[:, 1] == cols)  # (B,)
                gathered = torch.where(mine[None, :, None, None], sampled, gathered)
        return gathered

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor:
        raise NotImplementedError  # each table kind makes its own

    def table_of_grid(self, model: PositionedModel, grid: tuple | None) -> torch.Tensor:
        """`table(model, grid)`, made once per grid while the stored tables hold what it was made from: a model of
        dynamic size sees the same few sizes over and over (serving, dense features of a photo collection), and
        resampling B/16's table to a 64 x 64 grid costs more than comparing the stored one (150k numbers) with a
        copy. The comparison is of content, since an optimiser's fused step writes a table in place without moving
        its version counter. Only on the CPU, in an evaluating model without autograd: on an accelerator the
        comparison would make the host wait for the device, and resampling there is quick anyway."""
        sources = [table for table in (model.pos_embed, model.pos_embed_row, model.pos_embed_col) if table is not None]
        if (
            grid is None
            or model.training
            or torch.is_grad_enabled()
            or tracing()
            or not plain_ints(grid)
            or any(source.device.type != "cpu" for source in sources)
        ):
            return self.table(model, grid)
        key = (tuple(grid), tuple(model.config.grid_size), model.config.pos_resample)
        entry = self.kept.get(key)
        if entry is not None and all(
            kept.dtype == source.dtype and torch.equal(kept, source) for kept, source in zip(entry[1], sources)
        ):
            return entry[0]
        if len(self.kept) >= 16:  # a few sizes are the use; a stream of new ones is not kept for ever
            self.kept.clear()
        table = self.table(model, grid)
        self.kept[key] = (table, [source.detach().clone() for source in sources])
        return table

    def prefixed(self, model: PositionedModel, patch_rows: torch.Tensor) -> torch.Tensor:
        """The prefix tokens' rows (stored in `pos_embed`) before a grid's patch rows."""
        prefix = model.config.num_position_prefix
        if not prefix:
            return patch_rows
        prefix_rows = stored(model.pos_embed)[:, :prefix]
        return torch.cat([prefix_rows.expand(patch_rows.shape[0], -1, -1), patch_rows], dim=1)

    def table_shape(self, model: PositionedModel) -> tuple[int, int, int]:
        """(P, prefix + rows * cols, D) of a table stored for the model's grid."""
        config = model.config
        return config.num_position_tables, config.num_position_prefix + config.num_patches, config.embed_dim


def tracing() -> bool:
    """Whether the forward pass is being traced (torch.compile, torch.export, ONNX export), where a table must be
    computed in the graph rather than taken from a dictionary."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def plain_ints(grid: tuple) -> bool:
    """Whether a grid is two Python ints (not symbolic sizes of a trace, nor tensors)."""
    return all(type(side) is int for side in grid)


class LearnedTable(AbsoluteTable):
    """The paper's learned 1-D table, `pos_embed` (P, prefix + N, D), timm's name and shape for P = 1."""

    def create(self, model: PositionedModel) -> None:
        model.pos_embed = nn.Parameter(torch.zeros(*self.table_shape(model)))

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        nn.init.normal_(stored(model.pos_embed), std=0.02)

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor:
        if grid is None:
            return stored(model.pos_embed)  # stored for this grid
        prefix = model.config.num_position_prefix
        patch_rows = stored(model.pos_embed)[:, prefix:]
        resized = interpolate_patch_positions(patch_rows, model.config.grid_size, grid, model.config.pos_resample)
        return self.prefixed(model, resized)

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        table = stored(model.pos_embed)
        model.pos_embed = replaced(
            table,
            resample_pos_embed(
                table.data, new_config.grid_size, model.config.grid_size, model.config.num_position_prefix, mode
            ),
        )


class SinCosTable(AbsoluteTable):
    """Fixed 2-D sine-cosine rows for the patches (`pos_embed`, not trained), with learned-looking prefix rows
    kept as they are (zero for a fresh model)."""

    def create(self, model: PositionedModel) -> None:
        model.pos_embed = nn.Parameter(torch.zeros(*self.table_shape(model)), requires_grad=False)

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        stored(model.pos_embed).copy_(self.table(model, model.config.grid_size))

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor:
        if grid is None:
            return stored(model.pos_embed)  # stored for this grid
        rows = sincos_2d_pos_embed(grid, model.config.embed_dim)
        if model.config.sincos_order == "columns_first":  # AIMv2's native models: the column half first
            rows = torch.cat(rows.chunk(2, dim=-1)[::-1], dim=-1)
        return self.prefixed(model, rows[None].to(stored(model.pos_embed)))

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        model.pos_embed = replaced(stored(model.pos_embed), self.table(model, new_config.grid_size))


class AxialTable(AbsoluteTable):
    """The paper's 2-D learned embedding (Appendix D.4): `pos_embed_row` (P, rows, D/2) and `pos_embed_col`
    (P, cols, D/2), concatenated per patch; the prefix tokens' rows in `pos_embed` (P, prefix, D)."""

    def create(self, model: PositionedModel) -> None:
        config = model.config
        tables, prefix, (rows, cols), dim = (
            config.num_position_tables,
            config.num_position_prefix,
            config.grid_size,
            config.embed_dim,
        )
        if prefix:
            model.pos_embed = nn.Parameter(torch.zeros(tables, prefix, dim))
        model.pos_embed_row = nn.Parameter(torch.zeros(tables, rows, dim // 2))
        model.pos_embed_col = nn.Parameter(torch.zeros(tables, cols, dim // 2))

    @torch.no_grad()
    def initialise(self, model: PositionedModel) -> None:
        for table in (model.pos_embed, model.pos_embed_row, model.pos_embed_col):
            if table is not None:
                nn.init.normal_(table, std=0.02)

    def table(self, model: PositionedModel, grid: tuple | None = None) -> torch.Tensor:
        rows, cols = grid if grid is not None else model.config.grid_size
        return self.prefixed(
            model,
            axial_pos_embed(
                interpolate_1d_positions(stored(model.pos_embed_row), rows),
                interpolate_1d_positions(stored(model.pos_embed_col), cols),
            ),
        )

    @torch.no_grad()
    def resample(self, model: PositionedModel, new_config, mode: str = "bilinear") -> None:
        rows, cols = new_config.grid_size
        row_table, column_table = stored(model.pos_embed_row), stored(model.pos_embed_col)
        model.pos_embed_row = replaced(row_table, interpolate_1d_positions(row_table, rows))
        model.pos_embed_col = replaced(column_table, interpolate_1d_positions(column_table, cols))
