"""Depth metrics (vitlab.metrics.depth): figures checked by hand on tiny depth maps, pixels without a measurement
ignored, predictions clamped to the range, each metric a mean of per-image values, images with no valid pixel
skipped, and sums that do not depend on how the images are batched."""

import math

import pytest
import torch

from vitlab.distributed import DistEnv
from vitlab.errors import UsageError
from vitlab.metrics.depth import DepthMeter


def test_a_two_by_two_image_checked_by_hand():
    truth = torch.tensor([[1.0, 2.0], [4.0, 0.0]])  # 0: no measurement
    predicted = torch.tensor([[2.0, 2.0], [3.0, 99.0]])  # 99 falls on the unmeasured pixel: not counted
    # Valid pixels (truth, prediction): (1, 2) (2, 2) (4, 3). Errors p - d: 1, 0, -1.
    # RMSE = sqrt((1 + 0 + 1) / 3); AbsRel = (1/1 + 0/2 + 1/4) / 3 = 5/12; SqRel = (1/1 + 0/2 + 1/4) / 3 = 5/12.
    # Ratios max(d/p, p/d): 2, 1, 4/3. delta < 1.25: 1 of 3; < 1.5625: 2 of 3; < 1.953: still 2 of 3.
    meter = DepthMeter(min_depth=1e-3, max_depth=10.0)
    meter.update(predicted, truth)
    scores = meter.scores()
    assert scores.rmse == pytest.approx(math.sqrt(2 / 3))
    assert scores.abs_rel == pytest.approx(5 / 12) and scores.sq_rel == pytest.approx(5 / 12)
    assert (scores.delta1, scores.delta2, scores.delta3) == pytest.approx((1 / 3, 2 / 3, 2 / 3))
    log_errors = [math.log(2), 0.0, math.log(3 / 4)]  # ln p - ln d
    assert scores.rmse_log == pytest.approx(math.sqrt(sum(e * e for e in log_errors) / 3))
    assert scores.log10 == pytest.approx((math.log10(2) + math.log10(4 / 3)) / 3)
    mean_log_error = sum(log_errors) / 3
    silog = 100 * math.sqrt(sum(e * e for e in log_errors) / 3 - mean_log_error**2)
    assert scores.silog == pytest.approx(silog, rel=1e-5)
    assert (scores.images, scores.skipped_images, scores.pixels) == (1, 0, 3)


def test_predictions_are_clamped_to_the_range_and_truths_outside_it_ignored():
    truth = torch.tensor([[10.0, 5.0, 0.5, 12.0]])  # 0.5 below min_depth and 12 above max_depth: no measurement
    predicted = torch.tensor([[50.0, -1.0, 3.0, 3.0]])  # 50 -> 10 (exact), -1 -> 1 (error 4)
    meter = DepthMeter(min_depth=1.0, max_depth=10.0)
    meter.update(predicted, truth)
    scores = meter.scores()
    # Counted: (10, 10) and (5, 1); the maximum depth itself is a measurement.
    assert scores.rmse == pytest.approx(math.sqrt((0 + 16) / 2)) and scores.abs_rel == pytest.approx((0 + 4 / 5) / 2)
    assert scores.pixels == 2 and scores.delta1 == pytest.approx(0.5)


def test_each_metric_is_a_mean_over_images_and_an_image_without_valid_pixels_is_skipped():
    truth = torch.tensor(
        [
            [[2.0, 0.0], [0.0, 0.0]],  # one valid pixel, predicted 4: AbsRel 1
            [[3.0, 3.0], [3.0, 0.0]],  # three valid pixels, exact: AbsRel 0
            [[0.0, 0.0], [0.0, 0.0]],  # no measurement at all: skipped
        ]
    )
    predicted = torch.tensor([[[4.0, 1.0], [1.0, 1.0]], [[3.0, 3.0], [3.0, 7.0]], [[5.0, 5.0], [5.0, 5.0]]])
    meter = DepthMeter()
    meter.update(predicted, truth)
    scores = meter.scores()
    # Per image then averaged: (1 + 0) / 2 = 0.5; pooled over the four pixels it would be 1/4.
    assert scores.abs_rel == pytest.approx(0.5) and scores.rmse == pytest.approx((2 + 0) / 2)
    assert scores.delta1 == pytest.approx((0 + 1) / 2)
    assert (scores.images, scores.skipped_images, scores.pixels) == (2, 1, 4)
    alone = DepthMeter()
    alone.update(predicted[2], truth[2])
    assert math.isnan(alone.scores().rmse) and alone.scores().skipped_images == 1


def test_batches_counted_one_by_one_or_merged_equal_one_batch():
    generator = torch.Generator().manual_seed(0)
    truth = torch.rand(6, 5, 7, generator=generator) * 12  # some above the 10 m maximum
    truth[torch.rand(truth.shape, generator=generator) < 0.2] = 0
    predicted = torch.rand(truth.shape, generator=generator) * 11
    whole, in_batches, merged, half = DepthMeter(), DepthMeter(), DepthMeter(), DepthMeter()
    whole.update(predicted, truth)
    for start in range(6):
        in_batches.update(predicted[start], truth[start])  # (H, W) one image as well
    half.update(predicted[:3], truth[:3])
    merged.update(predicted[3:], truth[3:])
    merged.merge(half)
    torch.testing.assert_close(whole.sums, in_batches.sums)
    torch.testing.assert_close(whole.sums, merged.sums)
    whole.all_reduce(DistEnv())  # one process: the sums stay as they are
    torch.testing.assert_close(whole.sums, merged.sums)


def test_mismatched_shapes_ranges_and_meters_are_refused_with_what_to_do():
    with pytest.raises(UsageError, match="resize the prediction"):
        DepthMeter().update(torch.ones(1, 4, 4), torch.ones(1, 8, 8))
    with pytest.raises(UsageError, match="0 <= 5.0 < 2.0"):
        DepthMeter(min_depth=5.0, max_depth=2.0)
    with pytest.raises(UsageError, match="cannot merge"):
        DepthMeter(max_depth=10.0).merge(DepthMeter(max_depth=80.0))


def test_a_relative_answer_is_aligned_to_the_truth_by_scale_and_shift_in_inverse_depth():
    from vitlab.metrics.depth import align_inverse_depth

    truth = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.0, 8.0]])  # 0: no measurement, left out of the fit
    inverse = torch.where(truth > 0, 1 / truth.clamp(min=1e-6), 0.0)
    answer = 3.0 * inverse - 0.1  # a relative model's: the true inverse depth up to a scale and a shift
    answer[1, 1] = 50.0  # the unmeasured pixel's answer, which the fit does not see
    aligned = align_inverse_depth(answer, truth)
    measured = truth > 0
    torch.testing.assert_close(aligned[measured], truth[measured], rtol=1e-5, atol=0)  # float32 of a float64 fit
    # Nothing to fit (one counted pixel): the far limit everywhere, never a division by zero.
    one = torch.zeros(2, 3)
    one[0, 0] = 2.0
    assert torch.equal(align_inverse_depth(answer, one, max_depth=10.0), torch.full((2, 3), 10.0))
    with pytest.raises(UsageError, match="one shape"):
        align_inverse_depth(answer, truth[0])
