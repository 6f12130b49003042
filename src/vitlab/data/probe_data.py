"""The examples a dense probe reads: an image and its target (a label mask or a depth map), split into training,
validation and test, from mnist-scenes or from a data set in a layout people hold (VOC, ADE20K, a manifest,
NYUv2-style depth pairs: `vitlab.data.dense_sets`).

The validation split chooses the probe's learning rate and the test split is measured once, with the chosen head.
Where a layout has two splits (VOC and ADE20K: train and val, the val figures being what papers report), the
validation examples are carved from the training split (`validation_fraction`, seeded) and the official val
split is the test split. A target that does not fit its image is named in one line in `skipped` and left out; the
other examples are used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from vitlab.errors import DataError, UsageError

TASKS = ("segmentation", "depth")
TEST_FRACTION = 0.2  # of a one-split data set, held out as its test split


@dataclass(frozen=True)
class DenseExample:
    name: str  # the image's path, or "<data set>:<split>:<index>"
    image: torch.Tensor  # float (C, H, W) in [0, 1], the model's channels
    target: torch.Tensor  # (H, W): uint8 labels (255 ignored), or float32 depth in metres (0 = no measurement)


class Examples:
    """A split's examples, read one by one when asked (files are decoded then, not held); an example whose target
    does not fit is left out and its one-line message kept in `skipped`."""

    def __init__(self, names: list[str], read: Callable[[int], DenseExample], skipped: list[str]) -> None:
        self.names = names
        self.read = read
        self.skipped = skipped  # shared by the splits of one data set

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[DenseExample]:
        for index in range(len(self.names)):
            try:
                yield self.read(index)
            except DataError as error:
                self.skipped.append(str(error))


@dataclass
class ProbeData:
    name: str
    task: str  # "segmentation" or "depth"
    train: Examples
    validation: Examples
    test: Examples
    num_classes: int | None = None  # segmentation: classes, background included
    class_names: list[str] | None = None
    min_depth: float = 1e-3  # depth: the metres the probe's bins span and the metrics count (NYUv2: 0.001..10)
    max_depth: float = 10.0
    side: int | None = None  # the images' own side where they share one (mnist-scenes' canvas): the default view
    skipped: list[str] = field(default_factory=list)


def scene_data(data_dir: str | None, task: str, canvas: int, seed: int = 0, allow_download: bool = True) -> ProbeData:
    """mnist-scenes (`vitlab.data.scenes`) as probe data: its own three splits, `canvas`-pixel scenes."""
    from vitlab.data.scenes import CLASS_NAMES, mnist_scene_splits

    splits = mnist_scene_splits(data_dir, seed=seed, canvas_size=canvas, allow_download=allow_download)
    skipped: list[str] = []

    def examples(split: str) -> Examples:
        scenes = getattr(splits, split)
        targets = scene_targets(scenes, task)

        def read(index: int) -> DenseExample:
            image = scenes.images[index].float() / 255.0
            return DenseExample(f"mnist-scenes:{split}:{index}", image, targets[index])

        return Examples([f"mnist-scenes:{split}:{index}" for index in range(len(scenes))], read, skipped)

    data = ProbeData(
        "mnist-scenes", task, examples("train"), examples("validation"), examples("test"), skipped=skipped, side=canvas
    )
    if task == "segmentation":
        data.num_classes, data.class_names = len(CLASS_NAMES), list(CLASS_NAMES)
    else:
        from vitlab.data.scene_depth import MAX_DEPTH

        data.max_depth = MAX_DEPTH
    return data


def scene_targets(scenes, task: str) -> torch.Tensor:
    """The scenes' masks, or their depth maps (`vitlab.data.scene_depth`)."""
    if task == "segmentation":
        return scenes.masks
    from vitlab.data.scene_depth import scene_depths

    return scene_depths(scenes)


def carve(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training indices, validation indices): a seeded `fraction` of `count` held out, at least one each."""
    if count < 2:
        raise DataError(f"a probe needs at least 2 training examples to hold some out for validation, got {count}")
    held = min(count - 1, max(1, round(count * fraction)))
    order = np.random.default_rng(seed).permutation(count)
    return sorted(order[held:].tolist()), sorted(order[:held].tolist())


def open_probe_data(
    data: str | None,
    dataset: str | None,
    data_dir: str | None,
    task: str | None,
    validation_fraction: float = 0.1,
    canvas: int = 56,
    seed: int = 0,
    classes: str | None = None,
) -> ProbeData:
    """DATA (a dense layout: `vitlab.data.dense_sets`) or `dataset` ("mnist-scenes") as probe data.

    Splits: a layout's "test" split is the test split where it has one, else its "val" (VOC, ADE20K: what their
    papers report). Its "val" is the validation split where both are there; otherwise the validation examples are
    `validation_fraction` of the training pairs, carved with `seed`. Data of one split only (a manifest without a
    split column, a flat folder of pairs) has its test pairs carved first (`TEST_FRACTION`, seed + 1), so that
    no figure is measured on the pairs the head trained or was chosen on.

    classes: the segmentation classes' names, a file or names separated by commas (`dense_sets.class_list`; by
    default the data's own `labelmap.txt` or `classes.txt`, VOC's and ADE20K's names for those data sets)."""
    if dataset is not None:
        if classes is not None:
            raise UsageError(f"--dataset {dataset} names its own classes; leave out --classes")
        if dataset != "mnist-scenes":
            raise UsageError(f"--dataset {dataset!r}: the built-in dense task is mnist-scenes")
        return scene_data(data_dir, task or "segmentation", canvas, seed)
    if data is None:
        raise UsageError("give the data: a VOC, ADE20K, manifest or depth-pair folder, or --dataset mnist-scenes")
    if not 0 < validation_fraction < 1:
        raise UsageError(f"--validation-fraction must be between 0 and 1, got {validation_fraction}")
    from vitlab.data.dense_sets import open_dense_dataset

    train = open_dense_dataset(data, "train", task, classes)
    official = {split: optional_split(data, split, train.task, classes) for split in ("val", "test")}
    official = {split: found for split, found in official.items() if found and set(found.pairs) != set(train.pairs)}
    skipped: list[str] = []
    if "test" in official or "val" in official:
        test = official.get("test") or official["val"]
        validation = official.get("val") if "test" in official else None
        test_pairs = list(test.pairs)
        rest = list(train.pairs)
    else:  # one split (a manifest without a split column, a flat folder): the test pairs are carved from it too
        test = train
        kept, held = carve(len(train.pairs), TEST_FRACTION, seed + 1)
        rest, test_pairs = [train.pairs[i] for i in kept], [train.pairs[i] for i in held]
        validation = None
    if validation is None:
        kept, held = carve(len(rest), validation_fraction, seed)
        train_pairs, validation_pairs = [rest[i] for i in kept], [rest[i] for i in held]
    else:
        train_pairs, validation_pairs = rest, list(validation.pairs)
    num_classes = train.num_classes
    if train.task == "segmentation" and num_classes is None:
        from vitlab.data.dense_sets import count_classes, without_bad_pairs

        num_classes = count_classes(without_bad_pairs(train)[0])
        train = dataclasses.replace(train, num_classes=num_classes)
    name = train.name.rsplit(":", 1)[0]
    return ProbeData(
        name,
        train.task,
        pair_examples(train, train_pairs, skipped),
        pair_examples(train, validation_pairs, skipped),
        pair_examples(dataclasses.replace(test, num_classes=num_classes), test_pairs, skipped),
        num_classes=num_classes,
        class_names=list(train.class_names) if train.class_names else None,
        skipped=skipped,
    )


def optional_split(data: str, split: str, task: str, classes: str | None = None):
    """The layout's `split`, or None where it has none (a missing split is a DataError of the layout)."""
    from vitlab.data.dense_sets import open_dense_dataset

    try:
        return open_dense_dataset(data, split, task, classes)
    except DataError:
        return None


def pair_examples(dataset, pairs: list, skipped: list[str]) -> Examples:
    """The examples of a layout's file pairs, each read when asked: the image in [0, 1] (3, H, W), its target
    checked against it (`read_target`: a bad one is a one-line DataError, which `Examples` notes and skips)."""
    from vitlab.data.dense_sets import read_image, read_target

    def read(index: int) -> DenseExample:
        pair = pairs[index]
        image = read_image(pair)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0
        target = read_target(dataset, pair, (image.height, image.width))
        return DenseExample(str(pair.image), pixels, torch.from_numpy(np.ascontiguousarray(target)))

    return Examples([str(pair.image) for pair in pairs], read, skipped)
