"""dense/pictures.py: the colours are the principal components, signed and stretched; the object is the minority
side of the first; similarity is cosine."""

import pytest
import torch

from vitlab.dense.pictures import foreground_mask, patch_similarity, pca_rgb, principal_directions


def two_part_grid() -> torch.Tensor:
    """(8, 4, 5) features: a 2 x 2 object of one kind of patch on a background of another, with a little noise."""
    generator = torch.Generator().manual_seed(0)
    background, object_ = torch.randn(8, generator=generator), torch.randn(8, generator=generator) * 3
    grid = background[:, None, None].repeat(1, 4, 5)
    grid[:, 1:3, 2:4] = object_[:, None, None]
    return grid + 0.01 * torch.randn(8, 4, 5, generator=generator)


def test_the_colours_are_the_first_three_components_stretched_and_signed_the_same_each_time():
    grid = two_part_grid()
    colours = pca_rgb(grid)
    assert colours.shape == (4, 5, 3) and colours.min() >= 0 and colours.max() <= 1
    tokens = grid.reshape(8, 20).T
    mean, directions = principal_directions(tokens)
    first = (tokens - mean) @ directions[:, 0]
    expected = (first - first.min()) / (first.max() - first.min())
    torch.testing.assert_close(colours[..., 0].flatten(), expected)
    assert torch.equal(pca_rgb(grid), colours) and torch.equal(pca_rgb(-grid)[..., 0], colours[..., 0])  # sign rule


def test_the_object_is_the_minority_side_of_the_first_component():
    mask = foreground_mask(two_part_grid())
    expected = torch.zeros(4, 5, dtype=torch.bool)
    expected[1:3, 2:4] = True
    assert torch.equal(mask, expected)
    colours = pca_rgb(two_part_grid(), foreground=True)
    assert torch.equal(colours[~expected], torch.zeros(16, 3))  # background black


def test_similarity_is_one_at_the_picked_patch_and_cosine_elsewhere():
    grid = two_part_grid()
    similarity = patch_similarity(grid, 1, 2)
    assert similarity[1, 2] == pytest.approx(1.0) and similarity[2, 3] > 0.99 and similarity[0, 0] < similarity[2, 3]
    a, b = grid[:, 1, 2], grid[:, 0, 0]
    assert similarity[0, 0] == pytest.approx(float(a @ b / (a.norm() * b.norm())), abs=1e-6)
    with pytest.raises(ValueError, match="outside the 4 x 5 grid"):
        patch_similarity(grid, 4, 0)
