import pytest
import torch
import torch.nn.functional as F

from vitlab.errors import ConfigError
from vitlab.layers.pos_embed import resample_pos_embed, sincos_2d_pos_embed


def test_resampling_to_the_same_grid_is_the_identity():
    table = torch.randn(1, 1 + 16, 8)
    assert torch.equal(resample_pos_embed(table, (4, 4)), table)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_resampling_keeps_the_class_row_and_reaches_the_new_grid(mode):
    table = torch.randn(1, 1 + 4 * 6, 8)
    resampled = resample_pos_embed(table, (6, 9), old_grid=(4, 6), num_prefix_tokens=1, mode=mode)
    assert resampled.shape == (1, 1 + 54, 8)
    assert torch.equal(resampled[:, 0], table[:, 0])


def test_resampling_a_constant_table_keeps_it_constant_and_a_ramp_stays_monotonic():
    ramp = torch.arange(4.0).repeat(4, 1)  # value = column index
    table = torch.cat([torch.zeros(1, 1, 1), ramp.reshape(1, 16, 1)], dim=1)
    resampled = resample_pos_embed(table, (8, 8))[0, 1:, 0].reshape(8, 8)
    assert torch.all(resampled[:, 1:] >= resampled[:, :-1])
    assert torch.allclose(resampled[0], resampled[5])  # rows are alike, as in the input


def test_sincos_table_resampled_to_a_finer_grid_stays_close_to_that_grids_table():
    # Build the 8x8 table on a coarse coordinate system, so the 16x16 grid spans the same image.
    coarse = sincos_2d_pos_embed((8, 8), 64, temperature=10000.0)
    fine = resample_pos_embed(coarse[None], (16, 16), num_prefix_tokens=0)[0]
    # Reference: the continuous embedding sampled at the fine grid's centres in coarse units.
    quarter = 16
    omega = 1.0 / 10000.0 ** (torch.arange(quarter) / quarter)
    centres = (torch.arange(16) + 0.5) / 2 - 0.5
    y, x = torch.meshgrid(centres, centres, indexing="ij")
    ya, xa = y.flatten()[:, None] * omega, x.flatten()[:, None] * omega
    reference = torch.cat([ya.sin(), ya.cos(), xa.sin(), xa.cos()], dim=1)
    inner = reference.reshape(16, 16, 64)[1:-1, 1:-1]  # borders are clamped by interpolation
    similarity = F.cosine_similarity(fine.reshape(16, 16, 64)[1:-1, 1:-1], inner, dim=-1)
    assert similarity.min() > 0.98


def test_sincos_rejects_width_not_divisible_by_four():
    with pytest.raises(ConfigError, match="divisible by 4"):
        sincos_2d_pos_embed((2, 2), 30)


def test_non_square_old_grid_must_be_given():
    with pytest.raises(ConfigError, match="not a square"):
        resample_pos_embed(torch.randn(1, 1 + 6, 4), (4, 4))
