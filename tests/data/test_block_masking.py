"""iBOT's block-wise masks (data/block_masking.py): each view masks exactly the share it drew, within the range
asked, with the probability asked; the masked patches lie in blocks; and a process draws the rows of one process's
masks."""

import torch

from vitlab.data.block_masking import block_masks, masked_counts
from vitlab.data.transforms import Draws

GRID = (8, 8)


def draws(batch, seed=0, shard=None):
    return Draws(torch.Generator().manual_seed(seed), batch, shard)


def test_each_view_masks_the_share_it_drew_within_the_range_with_the_probability_asked():
    images, patches = 512, GRID[0] * GRID[1]
    rows = draws(images)
    counts = masked_counts(rows, 2, patches, (0.1, 0.5), 0.5)
    masks = block_masks(rows, counts, GRID)
    assert masks.shape == (images, 2, patches) and masks.dtype == torch.bool
    assert torch.equal(masks.sum(-1), counts)  # exactly the count drawn, every view
    masked = counts > 0
    assert (counts[masked] >= int(0.1 * patches)).all() and (counts[masked] <= int(0.5 * patches)).all()
    # 1,024 views each masked with probability 1/2: the share's standard error is 0.016; 4 of them
    assert abs(masked.float().mean().item() - 0.5) < 0.063
    every = masked_counts(draws(64), 2, patches, (0.25, 0.25), 1.0)
    assert torch.equal(every, torch.full((64, 2), 16))  # a fixed share: floor(0.25 * 64) each, both references'


def test_the_masked_patches_lie_in_blocks():
    """Of the masked patches, the share with a masked neighbour (up, down, left or right): near 1 for blocks; for
    16 of 64 patches scattered uniformly it is about 1 - (3/4)^3.5, 0.63."""
    counts = torch.full((256, 1), 16)
    masks = block_masks(draws(256, seed=1), counts, GRID).view(256, *GRID)
    padded = torch.nn.functional.pad(masks, (1, 1, 1, 1))
    neighbour = padded[:, :-2, 1:-1] | padded[:, 2:, 1:-1] | padded[:, 1:-1, :-2] | padded[:, 1:-1, 2:]
    assert (neighbour & masks).sum() / masks.sum() > 0.9


def test_a_process_draws_the_rows_of_one_process_masks():
    def masks(rows):
        return block_masks(rows, masked_counts(rows, 2, 64, (0.1, 0.5), 0.5), GRID)

    whole = masks(draws(6, seed=3))
    assert torch.equal(masks(draws(6, seed=3, shard=slice(3, 6))), whole[3:])  # process 1 of 2
