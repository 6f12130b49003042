"""Monocular-depth metrics (Eigen et al. 2014), as DINOv2's depth evaluation reports them: RMSE, AbsRel, SqRel,
RMSE-log, log10, SILog and the threshold accuracies delta < 1.25, 1.25^2, 1.25^3 (the metrics of the
Monocular-Depth-Estimation-Toolbox that `dinov2/eval/depth` is built on, and of the NYUv2 / KITTI literature).

Which pixels count: those whose true depth d satisfies min_depth < d <= max_depth; a true depth of 0 means "no
measurement" (a depth sensor's hole, a rim pixel of mnist-scenes) and is never counted. The toolbox keeps
d < max_depth; here the maximum itself counts, because a surface at the far limit (mnist-scenes' wall, a depth
map clipped at its range) is a measurement. Predictions are clamped to [min_depth, max_depth] first, as DINOv2's
`DepthEncoderDecoder.inference` does, so logs and ratios stay finite.

Averaging: each metric is computed per image over its counted pixels, then averaged over images (DINOv2 through
the toolbox, and the NYUv2 convention since Eigen et al.), not pooled over every pixel of the data set: an image
with many valid pixels weighs no more than one with few. An image with no counted pixel has no metric and is
skipped (counted in `DepthScores.skipped_images`), as the toolbox's NaN per image and `nanmean` skip it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import UsageError

# The per-image metrics, in the order of `DepthMeter.sums`.
METRICS = ("rmse", "abs_rel", "sq_rel", "rmse_log", "log10", "silog", "delta1", "delta2", "delta3")


@dataclass(frozen=True)
class DepthScores:
    """What `DepthMeter.scores` returns: each metric's mean over the images counted; NaN when none was."""

    rmse: float  # sqrt(mean (d - p)^2), metres
    abs_rel: float  # mean |d - p| / d
    sq_rel: float  # mean (d - p)^2 / d, metres
    rmse_log: float  # sqrt(mean (ln d - ln p)^2)
    log10: float  # mean |log10 d - log10 p|
    silog: float  # 100 * sqrt(mean e^2 - (mean e)^2), e = ln p - ln d: the scale-invariant log error
    delta1: float  # fraction of pixels with max(d / p, p / d) < 1.25
    delta2: float  # ... < 1.25^2
    delta3: float  # ... < 1.25^3
    images: int  # images counted (with at least one valid pixel)
    skipped_images: int  # images with no valid pixel, left out of every mean
    pixels: int  # valid pixels over the images counted


class DepthMeter:
    """Per-image depth metrics, summed over the images seen, batch by batch (the depth counterpart of
    `metrics.segmentation.ConfusionMatrix`).

    The sums live in one float64 tensor (`sums`) on the device of the depth maps: `update` adds a batch with device
    ops only (no host read per batch), and `all_reduce` sums it over processes in one collective. Its layout: the
    sum over counted images of each metric in `METRICS`, then the images counted, the images skipped and the valid
    pixels.
    """

    def __init__(self, min_depth: float = 1e-3, max_depth: float = 10.0, device: torch.device | str = "cpu"):
        if not 0 <= min_depth < max_depth:
            raise UsageError(f"depths are counted in (min_depth, max_depth]: need 0 <= {min_depth} < {max_depth}")
        self.min_depth = float(min_depth)
        self.max_depth = float(max_depth)
        self.sums = torch.zeros(len(METRICS) + 3, dtype=torch.float64, device=device)

    def update(self, predicted: torch.Tensor, truth: torch.Tensor) -> None:
        """Count a batch. predicted, truth: depth maps in metres of one shape, (H, W) one image or (N, H, W);
        truth 0 (or anything outside (min_depth, max_depth]) where there is no measurement."""
        if predicted.shape != truth.shape or truth.ndim not in (2, 3):
            raise UsageError(
                f"predicted depths {tuple(predicted.shape)} and true depths {tuple(truth.shape)} must be one shape, "
                "(H, W) or (N, H, W); resize the prediction to the depth map before counting"
            )
        if predicted.device != truth.device:
            raise UsageError(f"predicted depths are on {predicted.device} and true depths on {truth.device}")
        if self.sums.device != truth.device:
            self.sums = self.sums.to(truth.device)
        truth = truth.reshape(-1, truth.shape[-2] * truth.shape[-1]).float()  # (N, pixels)
        predicted = predicted.reshape(truth.shape).float().clamp(self.min_depth, self.max_depth)
        valid = (truth > self.min_depth) & (truth <= self.max_depth)
        truth = torch.where(valid, truth, 1.0)  # invalid pixels get a harmless value, then weigh 0
        counted = valid.sum(1)  # (N,)
        weights = valid / counted.clamp(min=1)[:, None]  # each image's valid pixels sum to 1

        def mean(term: torch.Tensor) -> torch.Tensor:  # (N, pixels) -> (N,) float64: the mean over valid pixels
            return (term.double() * weights).sum(1)

        error = predicted - truth
        log_error = predicted.log() - truth.log()
        ratio = torch.maximum(truth / predicted, predicted / truth)
        per_image = torch.stack(
            [
                mean(error.square()).sqrt(),
                mean(error.abs() / truth),
                mean(error.square() / truth),
                mean(log_error.square()).sqrt(),
                mean((predicted.log10() - truth.log10()).abs()),
                (mean(log_error.square()) - mean(log_error).square()).clamp(min=0).sqrt() * 100,
                mean((ratio < 1.25).float()),
                mean((ratio < 1.25**2).float()),
                mean((ratio < 1.25**3).float()),
            ],
            dim=1,
        )  # (N, metrics); an image with no valid pixel has weights 0 and is dropped by `has` below
        has = (counted > 0).double()
        self.sums[: len(METRICS)] += (per_image * has[:, None]).sum(0)
        self.sums[len(METRICS)] += has.sum()
        self.sums[len(METRICS) + 1] += (1 - has).sum()
        self.sums[len(METRICS) + 2] += counted.sum()

    def merge(self, other: DepthMeter) -> None:
        """Add another meter's sums to these (the same depth range)."""
        if (other.min_depth, other.max_depth) != (self.min_depth, self.max_depth):
            raise UsageError(
                f"cannot merge a meter of depths ({other.min_depth}, {other.max_depth}] into one of "
                f"({self.min_depth}, {self.max_depth}]"
            )
        self.sums += other.sums.to(self.sums.device)

    def all_reduce(self, env: DistEnv) -> None:
        """Sum over every process (a no-op on one); every rank must call it, images counted or not."""
        all_reduce_sum(self.sums, env)

    def scores(self) -> DepthScores:
        """Each metric's mean over the images counted (see the module docstring)."""
        sums = self.sums.cpu().tolist()
        images = int(sums[len(METRICS)])
        means = {name: total / images if images else math.nan for name, total in zip(METRICS, sums)}
        return DepthScores(
            **means, images=images, skipped_images=int(sums[len(METRICS) + 1]), pixels=int(sums[len(METRICS) + 2])
        )


def align_inverse_depth(
    prediction: torch.Tensor, truth: torch.Tensor, min_depth: float = 1e-3, max_depth: float = 10.0
) -> torch.Tensor:
    """A relative model's answer for one image (H, W) (inverse depth up to an unknown scale and shift, larger is
    nearer: Depth Anything's relative models, MiDaS) -> depth in metres (H, W), for the metrics above.

    The scale s and shift t that bring s * prediction + t nearest to the true inverse depth 1 / d in least squares
    over the counted pixels (min_depth < d <= max_depth), as MiDaS's and Depth Anything's zero-shot evaluations
    align each image; the aligned inverse depth is then kept at least 1 / max_depth and inverted. With fewer than
    two counted pixels (or a constant prediction over them) there is nothing to fit, and the answer is max_depth
    everywhere (an image with no counted pixel is skipped by `DepthMeter` anyway)."""
    if prediction.shape != truth.shape or truth.ndim != 2:
        raise UsageError(
            f"a prediction {tuple(prediction.shape)} and a truth {tuple(truth.shape)} must be one image of one "
            "shape (H, W); resize the prediction to the depth map first"
        )
    valid = (truth > min_depth) & (truth <= max_depth)
    x = prediction[valid].double()
    y = 1.0 / truth[valid].double()
    count = x.numel()
    variance = (x * x).sum() * count - x.sum() ** 2  # the determinant of the 2x2 normal equations
    if count < 2 or variance <= 0:
        return torch.full_like(prediction, max_depth, dtype=torch.float32)
    scale = (count * (x * y).sum() - x.sum() * y.sum()) / variance
    shift = (y.sum() - scale * x.sum()) / count
    inverse = (scale * prediction.double() + shift).clamp(min=1.0 / max_depth)
    return (1.0 / inverse).float()
