"""Semantic-segmentation metrics from an accumulated confusion matrix: mIoU, per-class IoU, pixel accuracy and mean
class accuracy, with an ignore label (255), as DINOv3's segmentation evaluation (`dinov3/eval/segmentation/
metrics.py`) and mmsegmentation's `IoUMetric` compute them.

The counts are summed over the whole evaluation before any ratio is taken (IoU of the data set, not a mean of
per-image IoUs), in int64: exact at any size, where a float32 histogram (DINOv3's `torch.histc`) stops counting
one by one past 2**24 pixels of a class.

Convention for absent classes: a class that is in neither the truth nor the prediction of any counted pixel has
no IoU (NaN) and is left out of the mean; a class that is predicted but never true has IoU 0 and counts. This is
what DINOv3 and mmsegmentation do (intersection / union gives 0 / 0 = NaN, then `nanmean`). Mean class accuracy
likewise averages over the classes present in the truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import DataError, UsageError

IGNORE_LABEL = 255  # the truth label of pixels left out (VOC's boundaries, ADE20K's "other" after the shift)


@dataclass(frozen=True)
class SegmentationScores:
    """What `ConfusionMatrix.scores` returns; fractions in [0, 1], NaN where a ratio has nothing to count."""

    mean_iou: float  # mean of per_class_iou over the classes present in truth or prediction
    per_class_iou: list[float]  # (num_classes,): NaN for a class absent from both
    pixel_accuracy: float  # correct pixels / counted pixels
    mean_class_accuracy: float  # mean of per_class_accuracy over the classes present in the truth
    per_class_accuracy: list[float]  # (num_classes,): recall of each class; NaN for a class absent from the truth
    pixels: int  # pixels counted (truth not the ignore label)
    ignored_pixels: int  # pixels skipped because their truth is the ignore label


class ConfusionMatrix:
    """Counts of (true class, predicted class) over every pixel seen, accumulated batch by batch.

    The counts live in one int64 tensor (`counts`) on the device of the label maps: `update` adds a batch with
    device ops only (no host read, so an evaluation loop on a GPU is not stalled per batch), and
    `all_reduce` sums the tensor over processes in one collective. Its layout: num_classes * num_classes cells
    of the matrix (row = truth, column = prediction), then the pixels whose labels were out of range, then the
    pixels skipped for the ignore label.

    A label outside 0..num_classes - 1 (in the truth, not the ignore label; or in the prediction of a counted
    pixel) is an error: on the CPU, `update` raises at once; elsewhere, where finding it would mean reading the
    device every batch, the pixels are counted apart and `scores` (or `check`) raises.
    """

    def __init__(self, num_classes: int, ignore_label: int | None = IGNORE_LABEL, device: torch.device | str = "cpu"):
        if num_classes < 1:
            raise UsageError(f"a confusion matrix needs at least one class, got num_classes={num_classes}")
        if ignore_label is not None and 0 <= ignore_label < num_classes:
            raise UsageError(
                f"the ignore label {ignore_label} is one of the {num_classes} classes; choose a label outside "
                f"0..{num_classes - 1} (255 is the usual one)"
            )
        self.num_classes = num_classes
        self.ignore_label = ignore_label
        self.counts = torch.zeros(num_classes * num_classes + 2, dtype=torch.int64, device=device)

    @property
    def cells(self) -> int:
        return self.num_classes * self.num_classes

    @property
    def matrix(self) -> torch.Tensor:
        """int64 (num_classes, num_classes): pixels of true class i (row) predicted as class j (column)."""
        return self.counts[: self.cells].view(self.num_classes, self.num_classes)

    def update(self, predicted: torch.Tensor, truth: torch.Tensor) -> None:
        """Count a batch. predicted, truth: integer label maps of one shape (any: (H, W), (N, H, W), ...) on one
        device; pixels whose truth is the ignore label are skipped whatever their prediction."""
        if predicted.shape != truth.shape:
            raise UsageError(
                f"predicted labels {tuple(predicted.shape)} and true labels {tuple(truth.shape)} differ in shape; "
                "resize the prediction to the mask (nearest for labels, or upsample the logits) before counting"
            )
        for name, labels in (("predicted", predicted), ("true", truth)):
            if labels.is_floating_point() or labels.is_complex():
                raise UsageError(
                    f"{name} labels are {labels.dtype}: pass label maps (e.g. logits.argmax(dim=1)), not scores"
                )
        if predicted.device != truth.device:
            raise UsageError(f"predicted labels are on {predicted.device} and true labels on {truth.device}")
        if self.counts.device != truth.device:
            self.counts = self.counts.to(truth.device)
        truth, predicted = truth.reshape(-1).long(), predicted.reshape(-1).long()
        in_range = (truth >= 0) & (truth < self.num_classes) & (predicted >= 0) & (predicted < self.num_classes)
        ignored = truth == self.ignore_label if self.ignore_label is not None else torch.zeros_like(in_range)
        # Every pixel lands in one cell: its matrix cell, the out-of-range cell or the ignored cell. torch.where
        # rather than boolean indexing, and index_add_ rather than bincount: on a GPU both of those read sizes or
        # bounds back to the host, and this runs once per batch.
        cell = torch.where(in_range, truth * self.num_classes + predicted, self.cells)
        cell = torch.where(ignored, self.cells + 1, cell)
        self.counts.index_add_(0, cell, torch.ones_like(cell))
        if self.counts.device.type == "cpu":
            self.check()

    def merge(self, other: ConfusionMatrix) -> None:
        """Add another matrix's counts to these (the same classes and ignore label)."""
        if (other.num_classes, other.ignore_label) != (self.num_classes, self.ignore_label):
            raise UsageError(
                f"cannot merge a matrix of {other.num_classes} classes (ignore {other.ignore_label}) into one of "
                f"{self.num_classes} (ignore {self.ignore_label})"
            )
        self.counts += other.counts.to(self.counts.device)

    def all_reduce(self, env: DistEnv) -> None:
        """Sum the counts over every process (a no-op on one); every rank must call it, counted pixels or not."""
        all_reduce_sum(self.counts, env)

    def check(self) -> None:
        """Raise DataError if any pixel counted so far had a label out of range (reads the counts to the host)."""
        out_of_range = int(self.counts[self.cells])
        if out_of_range:
            ignore = f", or {self.ignore_label} in the truth to ignore a pixel" if self.ignore_label is not None else ""
            raise DataError(
                f"{out_of_range} pixels have a true or predicted label outside 0..{self.num_classes - 1}; labels "
                f"must be class indices below num_classes={self.num_classes}{ignore} (a data set whose masks "
                "count from 1 needs them shifted down)"
            )

    def scores(self) -> SegmentationScores:
        """mIoU, per-class IoU, pixel accuracy and mean class accuracy of everything counted (see the module
        docstring for the absent-class convention). Raises DataError if a label was out of range."""
        self.check()
        counts = self.counts.cpu()
        matrix = counts[: self.cells].view(self.num_classes, self.num_classes).double()
        correct = matrix.diagonal()
        true_pixels, predicted_pixels = matrix.sum(1), matrix.sum(0)
        union = true_pixels + predicted_pixels - correct
        per_class_iou = (correct / union).tolist()  # 0 / 0 = NaN: a class absent from truth and prediction
        per_class_accuracy = (correct / true_pixels).tolist()  # NaN: a class absent from the truth
        pixels = int(matrix.sum())
        return SegmentationScores(
            mean_iou=nan_mean(per_class_iou),
            per_class_iou=per_class_iou,
            pixel_accuracy=float(correct.sum()) / pixels if pixels else math.nan,
            mean_class_accuracy=nan_mean(per_class_accuracy),
            per_class_accuracy=per_class_accuracy,
            pixels=pixels,
            ignored_pixels=int(counts[self.cells + 1]),
        )


def segmentation_figures(scores: SegmentationScores, class_names: Sequence[str]) -> dict[str, Any]:
    """The figures of one segmentation evaluation as `vitlab eval`'s report and the segmentation objective's
    validation both hold them: mmsegmentation's mIoU, aAcc and mAcc ("miou", "pixel_accuracy",
    "mean_class_accuracy"), its per-class IoU and Acc ("per_class_iou", "per_class_accuracy", in the order of
    "class_names"), and the pixels counted and ignored. Fractions in [0, 1]; NaN where nothing was counted (see
    the module docstring)."""
    if len(class_names) != len(scores.per_class_iou):
        raise UsageError(f"{len(class_names)} class names for {len(scores.per_class_iou)} classes; give one per class")
    return {
        "miou": scores.mean_iou,
        "pixel_accuracy": scores.pixel_accuracy,
        "mean_class_accuracy": scores.mean_class_accuracy,
        "per_class_iou": list(scores.per_class_iou),
        "per_class_accuracy": list(scores.per_class_accuracy),
        "class_names": list(class_names),
        "pixels": scores.pixels,
        "ignored_pixels": scores.ignored_pixels,
    }


def nan_mean(values: list[float]) -> float:
    """The mean of the values that are not NaN; NaN when none is."""
    present = [value for value in values if not math.isnan(value)]
    return sum(present) / len(present) if present else math.nan
