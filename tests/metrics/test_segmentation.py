"""Segmentation metrics (vitlab.metrics.segmentation): figures checked by hand on small label maps, an absent class and
the ignore label among them; counts that do not depend on how the pixels are batched; labels out of range refused."""

import math

import pytest
import torch

from vitlab.distributed import DistEnv
from vitlab.errors import DataError, UsageError
from vitlab.metrics.segmentation import IGNORE_LABEL, ConfusionMatrix

X = IGNORE_LABEL  # an ignored pixel, one letter so that the label maps below line up


def test_a_three_class_example_checked_by_hand():
    truth = torch.tensor([[0, 0, 1, 1], [0, X, 1, 1]], dtype=torch.uint8)
    predicted = torch.tensor([[0, 1, 1, 1], [0, 2, 0, 1]])
    # The ignored pixel is predicted 2: skipped all the same, so class 2 stays absent from truth and prediction.
    # Counted pixels (truth, prediction): (0,0) (0,1) (1,1) (1,1) (0,0) (1,0) (1,1): 7 of them.
    #                 predicted 0  1  2
    # true 0                    2  1  0     row sum 3
    # true 1                    1  3  0     row sum 4
    # true 2                    0  0  0     absent
    # column sums               3  4  0
    # IoU 0 = 2 / (3 + 3 - 2) = 0.5; IoU 1 = 3 / (4 + 4 - 3) = 0.6; IoU 2 = 0 / 0: NaN, left out of the mean.
    # mIoU = (0.5 + 0.6) / 2 = 0.55; pixel accuracy = (2 + 3) / 7; class accuracy 2/3 and 3/4, mean 17/24.
    confusion = ConfusionMatrix(3)
    confusion.update(predicted, truth)
    assert confusion.matrix.tolist() == [[2, 1, 0], [1, 3, 0], [0, 0, 0]]
    scores = confusion.scores()
    assert scores.per_class_iou[:2] == pytest.approx([0.5, 0.6]) and math.isnan(scores.per_class_iou[2])
    assert scores.mean_iou == pytest.approx(0.55)
    assert scores.pixel_accuracy == pytest.approx(5 / 7)
    assert scores.per_class_accuracy[:2] == pytest.approx([2 / 3, 3 / 4]) and math.isnan(scores.per_class_accuracy[2])
    assert scores.mean_class_accuracy == pytest.approx(17 / 24)
    assert (scores.pixels, scores.ignored_pixels) == (7, 1)


def test_a_class_predicted_but_never_true_counts_with_iou_zero():
    # (truth, prediction): (0,0) (0,2) (1,1) (1,1). IoU 0 = 1 / (2 + 1 - 1) = 0.5, IoU 1 = 2 / 2 = 1,
    # IoU 2 = 0 / (0 + 1 - 0) = 0: in the prediction, so in the mean: (0.5 + 1 + 0) / 3 = 0.5.
    # Class accuracy: 1/2, 1, NaN (never true): mean 0.75. Pixel accuracy 3/4.
    confusion = ConfusionMatrix(3)
    confusion.update(torch.tensor([0, 2, 1, 1]), torch.tensor([0, 0, 1, 1]))
    scores = confusion.scores()
    assert scores.per_class_iou == pytest.approx([0.5, 1.0, 0.0])
    assert scores.mean_iou == pytest.approx(0.5)
    assert scores.mean_class_accuracy == pytest.approx(0.75) and math.isnan(scores.per_class_accuracy[2])
    assert scores.pixel_accuracy == pytest.approx(0.75)


def test_batches_counted_one_by_one_equal_one_batch():
    generator = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 5, (6, 1, 9, 7), generator=generator)
    truth[torch.rand(truth.shape, generator=generator) < 0.2] = X
    predicted = torch.randint(0, 5, truth.shape, generator=generator)
    whole, in_batches, merged = ConfusionMatrix(5), ConfusionMatrix(5), ConfusionMatrix(5)
    whole.update(predicted, truth)
    for start in range(0, 6, 2):
        in_batches.update(predicted[start : start + 2, 0], truth[start : start + 2, 0])  # (N, H, W) as well
    half = ConfusionMatrix(5)
    half.update(predicted[:3], truth[:3])
    merged.update(predicted[3:], truth[3:])
    merged.merge(half)
    assert torch.equal(whole.counts, in_batches.counts) and torch.equal(whole.counts, merged.counts)
    assert int(whole.matrix.sum()) + whole.scores().ignored_pixels == truth.numel()
    whole.all_reduce(DistEnv())  # one process: the counts stay as they are
    assert torch.equal(whole.counts, merged.counts)


def test_ignored_pixels_are_skipped_whatever_their_prediction():
    truth = torch.tensor([1, X, X, 0])
    confusion = ConfusionMatrix(2)
    confusion.update(torch.tensor([1, 7, -3, 0]), truth)  # predictions out of range where the truth is ignored
    scores = confusion.scores()
    assert confusion.matrix.tolist() == [[1, 0], [0, 1]]
    assert (scores.pixels, scores.ignored_pixels, scores.mean_iou) == (2, 2, 1.0)
    # Without an ignore label, 255 is just a label out of range.
    with pytest.raises(DataError, match="outside 0..1"):
        ConfusionMatrix(2, ignore_label=None).update(torch.tensor([0, 0]), torch.tensor([0, X]))


@pytest.mark.parametrize(
    "predicted, truth",
    [
        ([0, 1, 2], [0, 1, 3]),  # a true label past the last class
        ([0, 3, 2], [0, 1, 2]),  # a predicted one
        ([0, 1, 2], [0, -1, 2]),  # a negative one
    ],
)
def test_a_label_out_of_range_is_refused(predicted, truth):
    confusion = ConfusionMatrix(3)
    with pytest.raises(DataError, match=r"1 pixels have a true or predicted label outside 0..2"):
        confusion.update(torch.tensor(predicted), torch.tensor(truth))
    # The pixel stays counted apart: the matrix refuses to score rather than report figures without it.
    with pytest.raises(DataError, match="outside 0..2"):
        confusion.scores()


def test_maps_that_are_not_label_maps_are_refused():
    confusion = ConfusionMatrix(3)
    with pytest.raises(UsageError, match="differ in shape"):
        confusion.update(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(UsageError, match="argmax"):
        confusion.update(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(UsageError, match="ignore label 2"):
        ConfusionMatrix(3, ignore_label=2)


def test_nothing_counted_scores_nan():
    scores = ConfusionMatrix(2).scores()
    assert math.isnan(scores.mean_iou) and math.isnan(scores.pixel_accuracy) and scores.pixels == 0
