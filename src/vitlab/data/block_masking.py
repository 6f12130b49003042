"""Block-wise masks of a patch grid, as iBOT draws them for its student's global views (Zhou et al. 2022, "iBOT:
Image BERT Pre-Training with Online Tokenizer", arXiv:2111.07832, section 3 and Appendix; bytedance/ibot
`ImageFolderMask`, after BEiT's masking generator; facebookresearch/dinov2 `data/masking.py` and `collate.py`).

Per image and view: with `probability` the view is masked, a share of its patches drawn uniformly from
`ratio_range` (iBOT's ViT recipe and DINOv2: probability 0.5, 10-50%), the count floor(share * N) as both
references take it. The masked patches are laid down as rectangles: each attempt draws an area between the
smallest block (iBOT's (min(rows, cols) // 3)^2 patches) and the patches still to mask, an aspect ratio from 0.3 to
1/0.3 (log-uniform), and a place where the block fits inside the grid (each side shorter than the grid's); a block
is kept when it masks at least one new patch and no more than are still to mask. Where the attempts leave a view
short of its count (the references then stop short), the rest are single patches drawn uniformly among the
unmasked ones, so every view masks exactly its count.

Every random number comes from `Draws`: drawn for the global batch in a fixed number per image (the attempts are
a fixed number too, made for every image at once), so N processes draw one process's masks, and a resumed run
draws what an uninterrupted one would.
"""

from __future__ import annotations

import math

import torch

from vitlab.data.transforms import Draws

LOG_ASPECT = (math.log(0.3), math.log(1 / 0.3))  # iBOT's and BEiT's block aspect ratios
BLOCK_ATTEMPTS = 32  # blocks tried per view; the references try until 10 in a row fail


def masked_counts(
    draws: Draws, views: int, patches: int, ratio_range: tuple[float, float], probability: float
) -> torch.Tensor:
    """How many of its `patches` each view of each image masks: (B, views) int64, 0 for the views left whole."""
    chosen = draws.uniform(views) < probability
    share = draws.uniform(views, low=ratio_range[0], high=ratio_range[1])
    return torch.where(chosen, (share * patches).floor().long(), 0)


def block_masks(draws: Draws, counts: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """counts (B, V) patches to mask per image and view -> masks (B, V, rows * cols) bool, row-major on `grid`,
    each view with exactly its count masked, in blocks (see the module)."""
    rows, cols = grid
    batch, views = counts.shape
    masks = torch.zeros(batch, views, rows, cols, dtype=torch.bool)
    row_index = torch.arange(rows).view(1, 1, rows, 1)
    col_index = torch.arange(cols).view(1, 1, 1, cols)
    smallest = max(1, (min(rows, cols) // 3) ** 2)
    for _ in range(BLOCK_ATTEMPTS):
        area_draw, aspect_draw, top_draw, left_draw = draws.uniform(views, 4).unbind(-1)  # (B, V) each
        left_to_mask = counts - masks.flatten(2).sum(-1)
        # uniform between the smallest block and what is left, in whichever order they are (random.uniform's)
        # (at least 1: a view already done has nothing left, and its block is not kept)
        area = (smallest + area_draw * (left_to_mask - smallest)).clamp(min=1)
        aspect = torch.exp(LOG_ASPECT[0] + aspect_draw * (LOG_ASPECT[1] - LOG_ASPECT[0]))
        height = (area * aspect).sqrt().round().long().clamp(min=1)
        width = (area / aspect).sqrt().round().long().clamp(min=1)
        fits = (height < rows) & (width < cols)
        top = (top_draw * (rows - height + 1).clamp(min=1)).floor().long()[..., None, None]
        left = (left_draw * (cols - width + 1).clamp(min=1)).floor().long()[..., None, None]
        block = (
            (row_index >= top)
            & (row_index < top + height[..., None, None])
            & (col_index >= left)
            & (col_index < left + width[..., None, None])
        )  # (B, V, rows, cols)
        new = (block & ~masks).flatten(2).sum(-1)
        kept = fits & (new > 0) & (new <= left_to_mask)
        masks |= block & kept[..., None, None]
    masks = masks.flatten(2)  # (B, V, N)
    # The rest, one patch at a time: the unmasked patches in a random order, the first `short` of them.
    short = counts - masks.sum(-1)
    order = torch.where(masks, 2.0, draws.uniform(views, rows * cols)).argsort(dim=-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(rows * cols).expand_as(order))
    return masks | (rank < short[..., None])
