"""Where the patch tokens of a batch sit: each token's (row, column) on its image's patch grid.

Positions are keyed by these coordinates, not by a token's index in the sequence, so that one encoder serves
every way its tokens arrive: the whole grid of a pixel batch (row-major, the paper's order, no coordinates
stored), the kept patches of a masked batch (MAE), or already-cut patches of images of different shapes, padded
to one length (NaFlex), where each sample has its own grid and some tokens are padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitlab.model_input import patch_grids


@dataclass(eq=False)
class PatchLayout:
    grid: tuple  # (rows, cols): every sample's grid, or (with sample_grids) the largest of them
    coords: torch.Tensor | None = None  # (B, N, 2) int64 (row, col) of each patch token; None: the whole grid, in order
    valid: torch.Tensor | None = None  # (B, N) bool, False for padding; None: every token is a patch
    sample_grids: torch.Tensor | None = None  # (B, 2) int64 each sample's own (rows, cols); None: all are `grid`
    # The positions follow this grid on every call (a dynamic image size, or patches of any shape), instead of
    # being the tables stored for the model's own grid (equal values there; the distinction keeps a traced
    # export free of branches on the image size).
    resample: bool = False
    # sample_grids as the host knows them (patches cut there: `PatchInput.grids`), so that choosing the tables of
    # the batch's grids reads nothing back from a GPU; None: read from sample_grids where needed.
    host_grids: torch.Tensor | None = None

    @classmethod
    def of_patches(cls, coords: torch.Tensor, valid: torch.Tensor, grids: torch.Tensor | None = None) -> PatchLayout:
        """The layout of already-cut patches: each sample's grid is the bounding box of its valid coordinates
        (`grids`, the host's copy of them, where the patches were cut on the host)."""
        sample_grids = patch_grids(coords, valid)  # (B, 2), made where the coordinates are: no copy
        largest = (grids if grids is not None else sample_grids).amax(dim=0)
        return cls((int(largest[0]), int(largest[1])), coords, valid, sample_grids, True, grids)

    def full_coords(self, device: torch.device | None = None) -> torch.Tensor:
        """(1, rows * cols, 2) the coordinates of the whole grid in row-major order, the tokens of a pixel batch."""
        rows, cols = self.grid
        y, x = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
        return torch.stack([y.flatten(), x.flatten()], dim=-1)[None]

    def token_coords(self, batch: int, device: torch.device | None = None) -> torch.Tensor:
        """(B, N, 2) every token's coordinates, stored or of the whole grid."""
        if self.coords is not None:
            return self.coords
        return self.full_coords(device).expand(batch, -1, -1)

    def grids(self, batch: int, device: torch.device | None = None) -> torch.Tensor:
        """(B, 2) each sample's own grid."""
        if self.sample_grids is not None:
            return self.sample_grids
        return constant(self.grid, device)[None].expand(batch, -1)

    def distinct_grids(self) -> list[tuple[int, int]]:
        """The samples' distinct grids (one, except for patches of images of several shapes), from the host's
        copy where there is one; else read from the device."""
        if self.sample_grids is None:
            return [tuple(self.grid)]
        known = self.host_grids if self.host_grids is not None else self.sample_grids
        return [tuple(grid) for grid in torch.unique(known, dim=0).tolist()]

    def keep(self, indices: torch.Tensor) -> PatchLayout:
        """The layout of the tokens at `indices` (B, K), in that order (MAE's kept patches)."""
        coords = self.token_coords(indices.shape[0], indices.device)
        kept = torch.gather(coords, 1, indices[..., None].expand(-1, -1, 2))
        valid = None if self.valid is None else torch.gather(self.valid, 1, indices)
        return PatchLayout(self.grid, kept, valid, self.sample_grids, self.resample, self.host_grids)


def constant(values: tuple, device: torch.device | None, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A few numbers as a tensor on `device`, filled there: `torch.tensor(values, device=gpu)` copies them from the
    host and waits for the device, once per forward pass here; a fill waits for nothing, and traces."""
    return torch.stack([torch.full((), value, dtype=dtype, device=device) for value in values])
