"""Position embeddings: the fixed 2-D sine-cosine table, the learned 2-D (row and column) table of the paper's
Appendix D.4, and resampling a learned table to a new patch grid.

Resampling is how the paper fine-tunes at a higher resolution (section 3.2): the patch size stays, so the grid
grows, and the pre-trained embeddings are 2-D interpolated "according to their location in the original image".
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vitlab.errors import ConfigError


def sincos_2d_pos_embed(grid_size: tuple[int, int], embed_dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding (as in MoCo v3 / big_vision's "sincos2d"), shape (rows * cols, D).

    A quarter of the channels each carry sin(y w), cos(y w), sin(x w), cos(x w) for frequencies w spaced
    geometrically from 1 to 1/temperature.
    """
    if embed_dim % 4:
        raise ConfigError(f"the sin-cos position embedding needs embed_dim divisible by 4, got {embed_dim}")
    rows, cols = grid_size
    y, x = torch.meshgrid(
        torch.arange(rows, dtype=torch.float32), torch.arange(cols, dtype=torch.float32), indexing="ij"
    )
    quarter = embed_dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    y_angles = y.flatten()[:, None] * omega[None, :]  # (N, D/4)
    x_angles = x.flatten()[:, None] * omega[None, :]
    return torch.cat([y_angles.sin(), y_angles.cos(), x_angles.sin(), x_angles.cos()], dim=1)


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    mode: str = "bilinear",
) -> torch.Tensor:
    """Interpolate the patch rows of a position embedding to a new grid; prefix (class token) rows are kept.

    pos_embed: (P, num_prefix_tokens + rows * cols, D), P tables (1, or one per block). old_grid defaults to a
    square grid. mode: "bilinear" (as the official code) or "bicubic". Returns (P, num_prefix_tokens + new_rows *
    new_cols, D).
    """
    if mode not in ("bilinear", "bicubic"):
        raise ConfigError(f"resampling mode must be 'bilinear' or 'bicubic', got {mode!r}")
    prefix, patch_rows = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    num_old = patch_rows.shape[1]
    if old_grid is None:
        side = math.isqrt(num_old)
        if side * side != num_old:
            raise ConfigError(
                f"cannot infer the grid of a position embedding with {num_old} patch rows (not a square); "
                "give old_grid=(rows, cols)"
            )
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != num_old:
        raise ConfigError(f"old grid {old_grid} does not match the {num_old} patch rows of the embedding")
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    return torch.cat([prefix, interpolate_patch_positions(patch_rows, old_grid, new_grid, mode)], dim=1)


def interpolate_patch_positions(
    patch_rows: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple, mode: str = "bilinear"
) -> torch.Tensor:
    """(P, old_rows * old_cols, D) -> (P, new_rows * new_cols, D) by 2-D interpolation, with no branch on the sizes,
    so it also traces with symbolic grid sizes (ONNX export with a dynamic image size). To the same grid it is
    exact: with align_corners=False every sample falls on a source point with weight 1.
    """
    tables, dim = patch_rows.shape[0], patch_rows.shape[-1]
    grid = patch_rows.reshape(tables, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)  # (P, D, rows, cols)
    # Interpolate in float32: bicubic is not implemented for every low-precision dtype.
    # "bilinear_antialias" (SigLIP 2's): bilinear that widens its kernel when shrinking, so every source row counts.
    antialias = mode == "bilinear_antialias"
    grid = F.interpolate(
        grid.float(),
        size=(new_grid[0], new_grid[1]),
        mode="bilinear" if antialias else mode,
        align_corners=False,
        antialias=antialias,
    )
    return grid.permute(0, 2, 3, 1).reshape(tables, -1, dim).to(patch_rows.dtype)  # (P, new_rows * new_cols, D)


def interpolate_1d_positions(table: torch.Tensor, length) -> torch.Tensor:
    """(P, n, C) -> (P, length, C) by linear interpolation along the positions; exact for length == n (as the
    2-D case), and traceable with a symbolic length."""
    resized = F.interpolate(table.transpose(1, 2).float(), size=length, mode="linear", align_corners=False)
    return resized.transpose(1, 2).to(table.dtype)


def axial_pos_embed(row_table: torch.Tensor, column_table: torch.Tensor) -> torch.Tensor:
    """The paper's 2-D position embedding (Appendix D.4): patch (r, c) gets [row_table[r]; column_table[c]].

    row_table (P, rows, D/2), column_table (P, cols, D/2) -> (P, rows * cols, D), in the patch order of the
    sequence (row-major)."""
    tables, rows, half = row_table.shape
    cols = column_table.shape[1]
    row_part = row_table[:, :, None, :].expand(tables, rows, cols, half)
    column_part = column_table[:, None, :, :].expand(tables, rows, cols, column_table.shape[-1])
    return torch.cat([row_part, column_part], dim=-1).reshape(tables, rows * cols, -1)
