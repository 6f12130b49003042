"""`mnist-scenes` (vitlab.data.scenes): scenes fixed by their seed, masks that agree with the ink, each split built
from its own digits. Tiny synthetic digits stand in for MNIST (its files are not in a user's clone); the one test
that reads the real files skips when they are absent."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from paths import SHARED
from vitlab.data.carving import carve_splits
from vitlab.data.scenes import (
    IGNORE_LABEL,
    INK_THRESHOLD,
    NUM_CLASSES,
    make_scenes,
    mnist_scene_splits,
)
from vitlab.data.source import digest
from vitlab.errors import DataError

SHARED_MNIST = SHARED / "data" / "mnist"


def synthetic_digits(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` 28x28 uint8 "digits": a white bar at a random place with a grey edge, so that resizing leaves an
    anti-aliased rim like MNIST's strokes; labels cycle through 0..9."""
    generator = np.random.default_rng(seed)
    digits = np.zeros((count, 28, 28), np.uint8)
    for index in range(count):
        top, left = generator.integers(4, 12, 2)
        height, width = generator.integers(6, 14, 2)
        digits[index, top - 1 : top + height + 1, left - 1 : left + width + 1] = 90  # the grey edge
        digits[index, top : top + height, left : left + width] = 255
    return digits, np.arange(count) % 10


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_scenes():
    digits, labels = synthetic_digits(30)
    first, again = make_scenes(digits, labels, 12, seed=3), make_scenes(digits, labels, 12, seed=3)
    for name in ("images", "masks", "sources"):
        assert torch.equal(getattr(first, name), getattr(again, name))
    other = make_scenes(digits, labels, 12, seed=4)
    assert not torch.equal(first.images, other.images)
    assert not torch.equal(first.images, make_scenes(digits, labels, 12, seed=3, stream=1).images)
    # Scene i is drawn by its own generator: building fewer scenes gives the first ones unchanged.
    assert torch.equal(make_scenes(digits, labels, 5, seed=3).images, first.images[:5])


@pytest.mark.parametrize("ignore_rim", [True, False])
def test_masks_label_exactly_the_ink_above_the_threshold(ignore_rim):
    digits, labels = synthetic_digits(40)
    scenes = make_scenes(digits, labels, 20, seed=0, canvas_size=48, ignore_rim=ignore_rim)
    images, masks = scenes.images[:, 0], scenes.masks
    digit_pixels = (masks >= 1) & (masks <= 10)
    assert torch.equal(digit_pixels, images >= INK_THRESHOLD)  # every digit pixel is ink, and all ink is labelled
    if ignore_rim:
        assert torch.equal(masks == 0, images == 0)  # background has no ink at all
        assert torch.equal(masks == IGNORE_LABEL, (images > 0) & (images < INK_THRESHOLD))
        assert (masks == IGNORE_LABEL).any()  # the synthetic digits' grey edges leave a rim
    else:
        assert not (masks == IGNORE_LABEL).any()
        assert (images[masks == 0] < INK_THRESHOLD).all()
    # A scene's digit labels are those of the digits it drew (digit + 1).
    for mask, sources in zip(masks, scenes.sources):
        drawn = {int(labels[index]) + 1 for index in sources.tolist() if index >= 0}
        assert set(mask[(mask >= 1) & (mask <= 10)].unique().tolist()) <= drawn


def test_where_digits_overlap_the_top_one_labels_the_pixel():
    # Solid digits as large as the canvas cover the same pixels: the one drawn last (top) must own them all.
    digits = np.full((4, 28, 28), 255, np.uint8)
    labels = np.array([3, 5, 7, 9])
    scenes = make_scenes(digits, labels, 10, seed=1, canvas_size=28, digits_per_scene=(2, 3), digit_size=(28, 28))
    for mask, image, sources in zip(scenes.masks, scenes.images, scenes.sources):
        top = sources[sources >= 0][-1]
        assert (mask == labels[top] + 1).all()
        assert (image == 255).all()


def test_a_faint_top_digit_leaves_the_inked_digit_below_its_label():
    # Digit 0 (label 1) is a white square, digit 1 (digit 8) a grey one (below the threshold), both canvas-sized.
    digits = np.zeros((2, 28, 28), np.uint8)
    digits[0], digits[1] = 255, 60
    scenes = make_scenes(
        digits, np.array([0, 8]), 30, seed=0, canvas_size=28, digits_per_scene=(2, 2), digit_size=(28, 28)
    )
    expected = {  # (bottom, top) -> the label of every pixel
        (0, 1): 1,  # white below, grey on top: the white digit (0, label 1) owns the pixels
        (1, 0): 1,
        (0, 0): 1,
        (1, 1): IGNORE_LABEL,  # grey over grey: 60 + (1 - 60/255) * 60 = 106 < 128, a rim
    }
    seen = set()
    for mask, sources in zip(scenes.masks, scenes.sources):
        order = tuple(sources.tolist())
        assert (mask == expected[order]).all(), order
        seen.add(order)
    assert seen == set(expected)


def test_sizes_counts_and_label_ranges():
    digits, labels = synthetic_digits(25)
    scenes = make_scenes(
        torch.from_numpy(digits).unsqueeze(1),
        labels,
        16,
        canvas_size=(40, 72),
        digits_per_scene=(2, 3),
        digit_size=(12, 20),
    )
    assert scenes.images.shape == (16, 1, 40, 72) and scenes.images.dtype == torch.uint8
    assert scenes.masks.shape == (16, 40, 72) and scenes.masks.dtype == torch.uint8
    assert scenes.sources.shape == (16, 3) and scenes.sources.dtype == torch.int64
    drawn = (scenes.sources >= 0).sum(1)
    assert drawn.min() >= 2 and drawn.max() <= 3 and set(drawn.tolist()) == {2, 3}
    assert (scenes.sources[:, :2] >= 0).all() and scenes.sources.max() < len(digits)
    values = set(scenes.masks.unique().tolist())
    assert values <= set(range(NUM_CLASSES)) | {IGNORE_LABEL} and 0 in values
    assert len(scenes) == 16


@pytest.mark.parametrize(
    "asked, complaint",
    [
        (dict(digits_per_scene=(0, 2)), "digits_per_scene"),
        (dict(digit_size=(20, 80)), "digit_size"),
        (dict(ink_threshold=0), "ink_threshold"),
    ],
)
def test_settings_that_cannot_work_are_refused(asked, complaint):
    digits, labels = synthetic_digits(5)
    with pytest.raises(DataError, match=complaint):
        make_scenes(digits, labels, 2, canvas_size=64, **asked)


def test_digits_that_are_not_digits_are_refused():
    digits, labels = synthetic_digits(5)
    with pytest.raises(DataError, match="0..9"):
        make_scenes(digits, labels + 6, 2)  # 6..10
    with pytest.raises(DataError, match="uint8"):
        make_scenes(digits.astype(np.float32), labels, 2)


def write_idx(path: Path, array: np.ndarray) -> None:
    """`array` (uint8) as a gzipped IDX file, the format of MNIST's files."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.tobytes()))


def test_each_split_draws_its_own_digits(tmp_path):
    # A stand-in for MNIST's files: 200 training digits of every class, 30 test digits that are all 7s.
    train_digits, train_labels = synthetic_digits(200, seed=1)
    test_digits, _ = synthetic_digits(30, seed=2)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train_digits)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", train_labels.astype(np.uint8))
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", test_digits)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(30, 7, np.uint8))
    splits = mnist_scene_splits(
        tmp_path, 40, 20, 20, seed=0, validation_digits=50, allow_download=False, canvas_size=32
    )
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [40, 20, 20]
    train_used = set(splits.train.sources[splits.train.sources >= 0].tolist())
    validation_used = set(splits.validation.sources[splits.validation.sources >= 0].tolist())
    assert not train_used & validation_used  # validation digits are held out of the training scenes
    assert len(validation_used) <= 50 and max(train_used | validation_used) < 200
    # Sources index MNIST's own split: the masks carry the labels of those digits.
    for mask, sources in zip(splits.train.masks, splits.train.sources):
        drawn = {int(train_labels[index]) + 1 for index in sources.tolist() if index >= 0}
        assert set(mask[(mask >= 1) & (mask <= 10)].unique().tolist()) <= drawn
    # Test scenes use the test digits alone: only 7s (label 8) appear.
    assert set(splits.test.masks.unique().tolist()) <= {0, 8, IGNORE_LABEL}
    assert splits.test.sources.max() < 30
    # The held-out digits are those a recipe with val_size 50 and seed 0 holds out for validation.
    carving = carve_splits(torch.from_numpy(train_labels.astype(np.int64)), 50, seed=0)
    assert validation_used <= set(carving.validation.tolist()) and train_used <= set(carving.train.tolist())


# digest of (images, masks) of the first 64 scenes of each split, built from the real MNIST files with seed 0.
REAL_PINS = {"train": "55e00ec36f2410b5", "validation": "cb4ea3bded5d1c86", "test": "c30709dafc94a594"}


def test_the_real_mnist_scenes_are_the_pinned_ones():
    """The scenes that benchmark figures are measured on stay the same bytes: a change here changes them all."""
    if not SHARED_MNIST.is_dir():
        pytest.skip(f"the MNIST files are not in {SHARED_MNIST}")
    splits = mnist_scene_splits(SHARED_MNIST, 64, 64, 64, seed=0, allow_download=False)
    pins = {}
    for name in REAL_PINS:
        part = getattr(splits, name)
        pins[name] = digest(part.images.numpy().tobytes() + part.masks.numpy().tobytes())
    assert pins == REAL_PINS
