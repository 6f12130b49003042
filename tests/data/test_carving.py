"""The splits vitlab carves, pinned: the train / validation / test images a recipe gets for a given data set, seed,
val_size, classes and max_train_images, held in memory or streamed. The values were taken from the carving code
before it became one function (`vitlab.data.carving`); a run resumed on its data, and the digits and MNIST recipes,
must go on getting exactly these images. A change here changes every carved split: don't update the pins, fix the
carving."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from paths import SHARED
from vitlab.data.carving import TEST_FRACTION, carve_splits
from vitlab.data.datasets import load_splits
from vitlab.data.source import digest
from vitlab.data.stream.splits import stream_splits
from vitlab.errors import DataError

SHARED_MNIST = SHARED / "data" / "mnist"

# (images, hash of the labels, hash of the pixels) of train, validation and test.
HELD = {
    "digits 0.1/0": [
        (1294, "5e563024452be8aa", "45c07a19e68e140a"),
        (144, "b46887ae2e18adc5", "77f413d90e1c9bdc"),
        (359, "e2bbb53814af9015", "2433b021523323e6"),
    ],
    "digits 0.1/5": [
        (1294, "e40b6004de5588f2", "bd553d8e35e1aa76"),
        (144, "f674777cffaff269", "bfc2b154c572c2ca"),
        (359, "e2bbb53814af9015", "2433b021523323e6"),
    ],
    "digits 100/3 max300": [
        (300, "6c3b4444cb4df2d3", "93f7f9adf21fcaf5"),
        (100, "3d8a94b2c0effdb0", "868d7c5a216dbd13"),
        (359, "e2bbb53814af9015", "2433b021523323e6"),
    ],
    "digits 0.2/1 classes975": [
        (346, "86a2e7604061c1e8", "7f6519608508ec59"),
        (87, "39ac727b54542818", "5f66c5428dced1bc"),
        (108, "1b0a90e66b0dfdb1", "3e078c1190e6acf2"),
    ],
    "digits 0": [(1438, "db757c9dd389d088", "165c59636fcb875a"), None, (359, "e2bbb53814af9015", "2433b021523323e6")],
    "mnist 0.1/0": [
        (54000, "4ba16cc0a561a967", "be5958dcedfa903f"),
        (6000, "8a1cf21392f044f8", "60607ec974de1cc0"),
        (10000, "2fd8de6bdb8d1178", "6d87418db22cc802"),
    ],
    "mnist 5000/42 max1000": [
        (1000, "9f696d503d1c7f1e", "e2957ccf7b583b95"),
        (5000, "c2c1bcac813d31be", "e2b03ec0b9f40327"),
        (10000, "2fd8de6bdb8d1178", "6d87418db22cc802"),
    ],
    "folder 0.25/0 held": [
        (16, "2bd2e5d144edcf86", "1337ef30c3b3d6cb"),
        (6, "b8d04b8e4644977d", "e47ab6ee1abbe7af"),
        (5, "2aa4fdabb718ed53", "377dae357b6ca5bd"),
        "carved",
        "carved: 20% of the images, stratified, seed 0",
    ],
    "folder 2/4 classes20 max5 held": [
        (5, "7be31ccc8105668d", "82dabcd6523f9ac6"),
        (2, "4cbbd8ca5215b8d1", "8b810a862dc98be4"),
        (4, "ce1e3a71638b2793", "d78326c7079d97b8"),
        "carved",
        "carved: 20% of the images, stratified, seed 0",
    ],
}

RECIPES = {
    "digits 0.1/0": dict(val_size=0.1, seed=0),
    "digits 0.1/5": dict(val_size=0.1, seed=5),
    "digits 100/3 max300": dict(val_size=100, seed=3, max_train_images=300),
    "digits 0.2/1 classes975": dict(val_size=0.2, seed=1, classes=[9, 5, 7]),
    "digits 0": dict(val_size=0),
    "mnist 0.1/0": dict(val_size=0.1, seed=0),
    "mnist 5000/42 max1000": dict(val_size=5000, seed=42, max_train_images=1000),
    "folder 0.25/0": dict(val_size=0.25, seed=0),
    "folder 2/4 classes20 max5": dict(val_size=2, seed=4, classes=[2, 0], max_train_images=5),
}

# The files of train, validation and test when the folder is streamed (the same images as held: the same carving).
STREAMED = {
    "folder 0.25/0": (
        "ant/02.png ant/03.png ant/04.png ant/06.png ant/07.png bee/00.png bee/02.png bee/03.png bee/06.png cow/00.png cow/01.png cow/03.png cow/04.png cow/06.png cow/09.png cow/10.png",
        "ant/01.png ant/05.png bee/01.png bee/05.png cow/02.png cow/05.png",
        "ant/00.png ant/08.png bee/04.png cow/07.png cow/08.png",
    ),
    "folder 2/4 classes20 max5": (
        "ant/05.png ant/07.png cow/00.png cow/03.png cow/09.png",
        "ant/06.png cow/04.png",
        "ant/00.png ant/08.png cow/07.png cow/08.png",
    ),
}

FOLDER_CARVING = ("carved", "carved: 20% of the images, stratified, seed 0")


def write_animals(root: Path) -> Path:
    """Three classes of uneven size (9, 7, 11) of 6x6 PNGs (lossless, so their decoded pixels are fixed)."""
    generator = np.random.default_rng(7)
    for name, count in (("ant", 9), ("bee", 7), ("cow", 11)):
        (root / name).mkdir(parents=True)
        for index in range(count):
            pixels = generator.integers(0, 256, (6, 6, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{index:02d}.png")
    return root


def held_pin(part):
    if part is None:
        return None
    return len(part), digest(part.labels.numpy().tobytes()), digest(part.images.contiguous().numpy().tobytes())


@pytest.mark.parametrize("recipe", [name for name in RECIPES if not name.startswith("folder")])
def test_the_array_data_sets_are_carved_as_before(recipe):
    name = recipe.split()[0]
    if name == "mnist" and not SHARED_MNIST.is_dir():
        pytest.skip(f"the MNIST files are not in {SHARED_MNIST}")
    data_dir = SHARED_MNIST if name == "mnist" else None
    splits = load_splits(name, data_dir, allow_download=False, **RECIPES[recipe])
    assert [held_pin(part) for part in (splits.train, splits.validation, splits.test)] == HELD[recipe]


@pytest.mark.parametrize("recipe", [name for name in RECIPES if name.startswith("folder")])
def test_a_folder_is_carved_as_before_held_and_streamed(recipe, tmp_path):
    root = write_animals(tmp_path / "animals")
    asked = RECIPES[recipe]
    held = load_splits("folder", root, image_size=6, **asked)
    pins = [held_pin(part) for part in (held.train, held.validation, held.test)]
    assert pins + [held.validation_source, held.test_source] == HELD[f"{recipe} held"]
    streamed = stream_splits(
        "folder",
        root,
        asked["val_size"],
        asked["seed"],
        (6, 6),
        classes=asked.get("classes"),
        max_train_images=asked.get("max_train_images"),
    )
    try:
        files = [
            " ".join(Path(part.index.location(i)).relative_to(root).as_posix() for i in range(len(part)))
            for part in (streamed.train, streamed.validation, streamed.test)
        ]
        assert (streamed.validation_source, streamed.test_source) == FOLDER_CARVING
    finally:
        streamed.close()
    assert tuple(files) == STREAMED[recipe]


def test_one_carving_of_test_validation_and_a_training_subset():
    labels = torch.arange(4).repeat_interleave(torch.tensor([30, 20, 40, 10]))
    carving = carve_splits(labels, val_size=0.25, seed=3, max_train_images=30, test_fraction=TEST_FRACTION)
    parts = [carving.train, carving.validation, carving.test]
    assert [len(part) for part in parts] == [30, 20, 20]
    assert all(torch.equal(part, part.sort().values) for part in parts)  # each split in source order
    assert len(set(torch.cat(parts).tolist())) == 70  # disjoint
    assert labels[carving.test].bincount().tolist() == [6, 4, 8, 2]  # stratified
    again = carve_splits(labels, val_size=0.25, seed=3, max_train_images=30, test_fraction=TEST_FRACTION)
    assert all(torch.equal(a, b) for a, b in zip(parts, [again.train, again.validation, again.test]))
    other = carve_splits(labels, val_size=0.25, seed=4, test_fraction=TEST_FRACTION)
    assert torch.equal(other.test, carving.test)  # the test split does not move with the recipe's seed
    assert not torch.equal(other.validation, carving.validation)


def test_a_carving_that_cannot_be_made_says_so():
    labels = torch.tensor([0] + [1] * 9)
    with pytest.raises(DataError, match="a validation split of 0.5 leaves a class of tiny with no training image"):
        carve_splits(labels, val_size=0.5, class_count=2, name="tiny")
    assert carve_splits(labels, val_size=0.5).validation is not None  # unlabeled data: no class to keep
    with pytest.raises(DataError, match="val_size must be a fraction in"):
        carve_splits(labels, val_size=-1)
    assert carve_splits(labels).validation is None and carve_splits(labels).test is None
