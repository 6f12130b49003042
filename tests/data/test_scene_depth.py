"""Depth maps of mnist-scenes (vitlab.data.scene_depth): each digit a card at depth k / size, the wall behind,
nothing measured on the rim; and the digit sizes and instances the scenes now carry, which the depths read."""

import numpy as np
import pytest
import torch

from vitlab.data.scene_depth import WALL_DEPTH, scene_depths
from vitlab.data.scenes import IGNORE_LABEL, Scenes, make_scenes
from vitlab.errors import DataError


def bar_digits(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` 28x28 uint8 "digits": a white bar with a grey edge (so resizing leaves a rim); labels 0..9."""
    generator = np.random.default_rng(seed)
    digits = np.zeros((count, 28, 28), np.uint8)
    for index in range(count):
        top, left = generator.integers(4, 12, 2)
        height, width = generator.integers(8, 14, 2)
        digits[index, top - 1 : top + height + 1, left - 1 : left + width + 1] = 90
        digits[index, top : top + height, left : left + width] = 255
    return digits, np.arange(count) % 10


def test_digits_are_cards_at_scale_over_size_in_front_of_the_wall_and_the_rim_is_unmeasured():
    digits, labels = bar_digits(30)
    scenes = make_scenes(digits, labels, 24, seed=0, canvas_size=64)
    depths = scene_depths(scenes)
    assert depths.shape == (24, 64, 64) and depths.dtype == torch.float32
    masks = scenes.masks
    digit_pixels = (masks >= 1) & (masks <= 10)
    assert torch.equal(digit_pixels, scenes.instances > 0)
    assert (depths[masks == 0] == WALL_DEPTH).all()
    assert (depths[masks == IGNORE_LABEL] == 0).all() and (masks == IGNORE_LABEL).any()
    assert (depths[digit_pixels] > 0).all() and (depths[digit_pixels] < WALL_DEPTH).all()
    # Every digit pixel has its card's depth 1.5 * 64 / size (the default depth scale): 16-40 px -> 2.4-6 m.
    for scene in range(24):
        for place in scenes.instances[scene].unique().tolist():
            if place == 0:
                continue
            size = int(scenes.sizes[scene, place - 1])
            on_card = scenes.instances[scene] == place
            torch.testing.assert_close(depths[scene][on_card], torch.full_like(depths[scene][on_card], 96 / size))
            # The mask's label there is that digit's.
            assert (masks[scene][on_card] == labels[scenes.sources[scene, place - 1]] + 1).all()
    assert 2.4 - 1e-6 <= depths[digit_pixels].min() and depths[digit_pixels].max() <= 6 + 1e-6
    assert torch.equal(scene_depths(make_scenes(digits, labels, 24, seed=0, canvas_size=64)), depths)


def test_a_larger_digit_is_nearer():
    # One solid digit per scene, drawn at every size 16..40: depth falls as size grows.
    digits = np.full((1, 28, 28), 255, np.uint8)
    scenes = make_scenes(digits, np.array([4]), 40, seed=2, canvas_size=64, digits_per_scene=(1, 1))
    depths = scene_depths(scenes)
    sizes = scenes.sizes[:, 0]
    card = torch.stack([depths[scene][scenes.instances[scene] == 1][0] for scene in range(40)])
    order = sizes.argsort()
    assert len(set(sizes.tolist())) > 5
    assert (card[order].diff() <= 0).all() and (card[order][-1] < card[order][0])


def test_scenes_record_sizes_in_the_asked_range_aligned_with_their_sources():
    digits, labels = bar_digits(20)
    scenes = make_scenes(digits, labels, 16, canvas_size=48, digits_per_scene=(1, 3), digit_size=(14, 22))
    assert scenes.sizes.shape == scenes.sources.shape and scenes.sizes.dtype == torch.int64
    assert torch.equal(scenes.sizes >= 0, scenes.sources >= 0)
    drawn = scenes.sizes[scenes.sizes >= 0]
    assert drawn.min() >= 14 and drawn.max() <= 22
    assert scenes.instances.shape == scenes.masks.shape and int(scenes.instances.max()) <= 3


def test_a_digit_behind_the_wall_and_scenes_without_sizes_are_refused():
    digits, labels = bar_digits(5)
    small = make_scenes(digits, labels, 4, canvas_size=64, digit_size=(8, 10))  # 96 / 8 = 12 m, behind 8 m
    with pytest.raises(DataError, match="larger than 12 px"):
        scene_depths(small)
    assert scene_depths(small, wall_depth=20.0).max() == 20.0
    with pytest.raises(DataError, match="make_scenes"):
        scene_depths(Scenes(small.images, small.masks, small.sources))
