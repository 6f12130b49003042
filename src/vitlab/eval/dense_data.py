"""The examples `vitlab eval` measures a dense model (a segmenter or a depth model) on: one split of mnist-scenes or
of a dense layout on disk, each image at its own size with its target, split as the dense probe and the
segmentation fine-tune split them.

A data set is one row of `DENSE_DATASETS`:
- "mnist-scenes" (`vitlab.data.scenes`): the scenes the segmentation fine-tune trains and is measured on (seed
  `SCENE_SEED`, `SCENE_COUNTS`), at the model's input size; its masks, or its depth maps for a depth model.
- "segmentation", "depth": the layout in `--data-dir` (Pascal VOC, ADE20K, a manifest, NYUv2-style depth pairs:
  `vitlab.data.dense_sets`), split by `open_probe_data`: "test" is the official test split, else the official val
  (what VOC and ADE20K papers report), "val" the validation pairs (carved from the training pairs with the run's
  val_size and seed, as the fine-tune carved them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vitlab.data.probe_data import Examples, open_probe_data
from vitlab.errors import DataError, UsageError

LAYOUT_FRACTION = 0.1  # the validation share of a layout's training pairs, where no run says its val_size


@dataclass
class DenseSplit:
    """One split of a dense data set, read example by example."""

    name: str  # the data set's name ("mnist-scenes", "voc-layout:boxes", ...)
    task: str  # "segmentation" or "depth": what its targets are
    examples: Examples
    num_classes: int | None = None  # segmentation: classes, background included
    # None: the data name none, and num_classes was read off the masks (the largest label + 1), so a class above
    # every label present may be missing from it.
    class_names: list[str] | None = None
    min_depth: float = 1e-3  # depth: the metres the metrics count, (min_depth, max_depth]
    max_depth: float = 10.0
    skipped: list[str] = field(default_factory=list)  # examples left out, one line each


@dataclass(frozen=True)
class DenseRequest:
    """What to open: the data set's row name, where its files are, the split, the task the model measures, the
    model's input side (mnist-scenes' canvas) and the run that trained on the data (its val_size and seed)."""

    dataset: str
    data_dir: str | None
    split: str
    task: str
    side: int
    run: dict[str, Any] | None = None


def scene_split(request: DenseRequest) -> DenseSplit:
    """One split of mnist-scenes at the model's side: the scenes the segmentation fine-tune trains and is measured
    on (`vitlab.data.segmentation.scene_splits`), with their masks or depth maps."""
    from vitlab.data import segmentation
    from vitlab.data.probe_data import DenseExample, scene_targets
    from vitlab.data.scenes import CLASS_NAMES, mnist_scene_splits

    counts = segmentation.SCENE_COUNTS  # read now: tests shrink them
    val_size = request.run.get("val_size", 0.1) if request.run else 0.1
    validation = 0 if val_size == 0 else int(val_size) if val_size >= 1 else counts["validation"]
    if request.split == "val" and validation == 0:
        raise DataError("the run trained with val_size 0: it has no validation split; use --split test")
    built = mnist_scene_splits(
        request.data_dir,
        counts["train"] if request.split == "train" else 1,  # the other splits' scenes do not depend on it
        max(validation, 1),
        counts["test"],
        seed=segmentation.SCENE_SEED,
        validation_digits=counts["validation_digits"],
        canvas_size=request.side,
    )
    split = {"train": "train", "val": "validation", "test": "test"}[request.split]
    scenes = getattr(built, split)
    targets = scene_targets(scenes, request.task)
    names = [f"mnist-scenes:{split}:{index}" for index in range(len(scenes))]
    skipped: list[str] = []

    def read(index: int) -> DenseExample:
        return DenseExample(names[index], scenes.images[index].float() / 255.0, targets[index])

    data = DenseSplit("mnist-scenes", request.task, Examples(names, read, skipped), skipped=skipped)
    if request.task == "segmentation":
        data.num_classes, data.class_names = len(CLASS_NAMES), list(CLASS_NAMES)
    else:
        from vitlab.data.scene_depth import MAX_DEPTH

        data.max_depth = MAX_DEPTH
    return data


def layout_split(request: DenseRequest) -> DenseSplit:
    """One split of the layout in `data_dir`, as `open_probe_data` splits it (the run's val_size and seed)."""
    if request.data_dir is None:
        raise UsageError(
            f"--dataset {request.dataset} reads a VOC, ADE20K, manifest or depth-pair folder: give it with --data-dir"
        )
    if request.dataset != request.task:
        raise UsageError(
            f"the model measures {request.task} and --dataset {request.dataset} holds {request.dataset} targets; "
            f"evaluate it on --dataset {request.task} --data-dir FOLDER"
        )
    run = request.run or {}
    val_size = run.get("val_size", LAYOUT_FRACTION)
    fraction = val_size if 0 < val_size < 1 else LAYOUT_FRACTION
    data = open_probe_data(request.data_dir, None, None, request.task, fraction, seed=run.get("seed", 0))
    examples = {"train": data.train, "val": data.validation, "test": data.test}[request.split]
    split = DenseSplit(data.name, data.task, examples, data.num_classes, data.class_names)
    split.min_depth, split.max_depth, split.skipped = data.min_depth, data.max_depth, data.skipped
    return split


DENSE_DATASETS: dict[str, Callable[[DenseRequest], DenseSplit]] = {
    "mnist-scenes": scene_split,
    "segmentation": layout_split,
    "depth": layout_split,
}


def open_dense_split(request: DenseRequest) -> DenseSplit:
    """The split `request` names (a row of `DENSE_DATASETS`), its targets those of the model's task."""
    if request.dataset not in DENSE_DATASETS:
        raise UsageError(
            f"--dataset {request.dataset} holds a class per image, and a {request.task} model needs a target per "
            f"pixel: use --dataset mnist-scenes, or --dataset {request.task} --data-dir FOLDER (VOC, ADE20K, a "
            "manifest or NYUv2-style depth pairs)"
        )
    return DENSE_DATASETS[request.dataset](request)
