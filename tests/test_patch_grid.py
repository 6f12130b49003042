"""The patch grid's arithmetic and the one size every message suggests."""

import pytest

from vitlab.errors import ConfigError
from vitlab.patch_grid import patch_grid, whole_patches


def test_the_suggestion_is_the_nearest_multiple_the_smaller_on_a_tie_and_at_least_one_patch():
    assert [whole_patches(size, 2) for size in (15, 16, 17)] == [14, 16, 16]
    assert [whole_patches(size, 16) for size in (23, 24, 25, 30)] == [16, 16, 32, 32]
    assert whole_patches(3, 16) == 16


def test_a_side_that_does_not_divide_names_the_side_and_the_suggestion():
    assert patch_grid((32, 48), (16, 16)) == (2, 3)
    with pytest.raises(ConfigError, match="image width 15; use an image size of 14 "):
        patch_grid((16, 15), (2, 2))
