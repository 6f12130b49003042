"""Pictures of a photo's patch features: the first three principal components as colours (DINOv2's and DINOv3's
figure), and how similar every patch is to one chosen patch.

The principal components are those of the photo's own patches (or of a set of photos' patches together, so that a
colour means the same thing across them). A component's sign is arbitrary, so each is turned to make its largest
value positive (scikit-learn's `svd_flip` rule): the same features always give the same colours. Each component is
then stretched to [0, 1] over the patches shown. With `foreground`, the patches on the minority side of the first
component count as the object (DINOv2's figures threshold that component; an object usually covers less than half
a photo, which is the guess here: pass a mask of your own where it is wrong) and the three components are taken
again from the object's patches alone, the background left black.
"""

from __future__ import annotations

import torch


def principal_directions(tokens: torch.Tensor, count: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (N, C) -> (their mean (C,), the first `count` principal directions (C, count)), each direction's sign
    turned so that the token farthest along it lies on its positive side."""
    mean = tokens.mean(dim=0)
    centred = tokens - mean
    _, _, directions = torch.linalg.svd(centred, full_matrices=False)  # rows: directions, by variance
    directions = directions[:count].T  # (C, count)
    projected = centred @ directions
    farthest = projected.abs().argmax(dim=0)
    signs = projected[farthest, torch.arange(directions.shape[1])].sign()
    signs[signs == 0] = 1
    return mean, directions * signs


def stretched(values: torch.Tensor) -> torch.Tensor:
    """(N, K) -> each column stretched to [0, 1] (a constant column: 0.5)."""
    low, high = values.min(dim=0).values, values.max(dim=0).values
    span = high - low
    return torch.where(span > 0, (values - low) / span.clamp_min(1e-12), torch.full_like(values, 0.5))


def foreground_mask(grid: torch.Tensor) -> torch.Tensor:
    """grid (C, rows, cols) -> (rows, cols) bool: the patches on the minority side of the first principal component
    (see the module docstring for why the minority)."""
    channels, rows, cols = grid.shape
    tokens = grid.reshape(channels, rows * cols).T.float()
    mean, direction = principal_directions(tokens, 1)
    side = ((tokens - mean) @ direction)[:, 0] > 0
    minority = side if side.sum() <= (~side).sum() else ~side
    return minority.reshape(rows, cols)


def pca_rgb(grid: torch.Tensor, foreground: bool | torch.Tensor = False) -> torch.Tensor:
    """grid (C, rows, cols) of one photo's patch features -> (rows, cols, 3) colours in [0, 1]: the first three
    principal components. foreground: True to colour only the patches `foreground_mask` finds (black elsewhere),
    or a (rows, cols) bool mask of your own."""
    channels, rows, cols = grid.shape
    if channels < 3 or rows * cols < 3:
        raise ValueError(f"three principal components need 3 channels and 3 patches, got {tuple(grid.shape)}")
    tokens = grid.reshape(channels, rows * cols).T.float()  # (N, C)
    mask = None
    if foreground is True:
        mask = foreground_mask(grid).flatten()
    elif isinstance(foreground, torch.Tensor):
        mask = foreground.to(torch.bool).flatten()
    chosen = tokens if mask is None else tokens[mask]
    if len(chosen) < 3:
        chosen, mask = tokens, None  # too few patches on the object to fit three components: the whole photo
    mean, directions = principal_directions(chosen)
    colours = torch.zeros(rows * cols, 3)
    fitted = stretched((chosen - mean) @ directions)
    if mask is None:
        colours = fitted
    else:
        colours[mask] = fitted
    return colours.reshape(rows, cols, 3)


def patch_similarity(grid: torch.Tensor, row: int, col: int) -> torch.Tensor:
    """grid (C, rows, cols) -> (rows, cols): the cosine similarity of every patch's features to patch (row, col)."""
    channels, rows, cols = grid.shape
    if not (0 <= row < rows and 0 <= col < cols):
        raise ValueError(f"patch ({row}, {col}) is outside the {rows} x {cols} grid")
    tokens = torch.nn.functional.normalize(grid.reshape(channels, rows * cols).T.float(), dim=1)
    return (tokens @ tokens[row * cols + col]).reshape(rows, cols)
