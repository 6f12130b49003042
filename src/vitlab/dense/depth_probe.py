"""DINOv2's linear depth probe on frozen patch features (`dinov2/eval/depth`: `BNHead`, `DepthBaseDecodeHead`,
`SigLoss`, `GradientLoss`, and the released configs, e.g. `dinov2_vits14_kitti_linear`).

    x = [patches_b ; class_b broadcast to every patch] for each chosen block b    (B, blocks * 2D, rows, cols)
    logits = Conv1x1(BatchNorm(x)), bilinearly upsampled x4                       (B, bins, 4 rows, 4 cols)
    p = (relu(logits) + 0.1) / sum over bins                                      a distribution over the bins
    depth = sum_i p_i * bin_depth_i,  bin_depth = linspace(min_depth, max_depth, bins)
    loss = SigLoss(depth, truth) + 0.5 * GradientLoss(depth, truth), on valid pixels, at the truth's size

"linear" takes the last block (`dense_features(..., "last", prefix_tokens=True)`), "linear4" the last four ("last4");
`depth_head_input` lays either out. This is DINOv2's `classify=True, bins_strategy="UD", norm_strategy="linear"`
head with its 256 bins (AdaBins' "linear" normalisation: depth as a classification over bins uniform in depth, read
out as the expected bin depth), and `upsample=4`, the loss weights (1.0, 0.5) and AdamW of its released configs.

Choices, and where this differs:
- Upsampling x4 then bilinear to the truth's size, as DINOv2: the bin distribution is formed at 4x the patch grid,
  not at every output pixel, because 256 logits per pixel at a photo's full size (NYU's 480 x 640: 300 MB an image
  in float32) would cost far more than the head itself. The logits are upsampled rather than the features (DINOv2
  resizes the features before its 1x1 convolution): a 1x1 convolution commutes with bilinear interpolation (its
  weights sum to 1), so the result is the same with bins channels resized instead of blocks * 2D.
- A BatchNorm before the linear map, as in DINOv3's linear segmentation head and the name `BNHead`; DINOv2's
  published `BNHead` has its BatchNorm commented out. In eval mode it is a per-channel affine map, so the head stays
  linear in the features; it puts blocks of different scales on one footing for the learning-rate sweep.
- SigLoss (AdaBins): g = ln(p + 1e-3) - ln(d + 1e-3) over valid pixels, sqrt(Var g + 0.15 (mean g)^2), pooled over
  the batch's valid pixels as DINOv2 does, without its 100-step warm-up (scale term only) that its configs turn on.
- GradientLoss (MegaDepth): the absolute differences of g two pixels apart, down the rows and across the columns,
  where both pixels are valid, at strides 1, 2, 4, 6 of the map, each scale divided by its valid pixels. DINOv2's
  code slices a (B, 1, H, W) batch with `[::2*i, ::2*i]` and `[0:-2, :]`, which, as we read it, run over the batch
  and channel axes rather than rows and columns (with its configs' 2 images per GPU the term is then zero); here it
  runs over the rows and columns of each image, as MegaDepth meant it.
- Valid pixels: truth in (min_depth, max_depth], the same as the metrics (`metrics.depth`); DINOv2's losses take
  truth > 0.

The features are computed once and cached, so the probe's epochs cost a head's work only. The learning rate is
chosen on the validation split's RMSE among `learning_rates` (never the test split's); the test split is measured
once, with the chosen head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from vitlab.dense.features import DenseFeatures
from vitlab.errors import UsageError
from vitlab.metrics.depth import DepthMeter, DepthScores

BINS = 256  # DINOv2's n_bins
UPSAMPLE = 4  # DINOv2's BNHead upsample: the bin distribution is formed at 4x the patch grid
LINEAR_NORM_EPS = 0.1  # AdaBins' "linear" normalisation: relu(logits) + 0.1, then divided by the sum
LOG_EPS = 1e-3  # SigLoss and GradientLoss: ln(depth + 1e-3), so a depth of 0 has a finite log
SIG_VARIANCE_FOCUS = 0.15  # SigLoss: Var g + 0.15 (mean g)^2, mostly scale-invariant
GRADIENT_STRIDES = (1, 2, 4, 6)  # GradientLoss: the map and its strided copies (DINOv2's 2 * i, i = 1..3)
GRADIENT_LOSS_WEIGHT = 0.5  # DINOv2's configs: SigLoss weight 1.0, GradientLoss 0.5


def depth_head_input(features: DenseFeatures) -> torch.Tensor:
    """DINOv2's depth-head input: each block's patch grid with that block's class token broadcast to every patch,
    the blocks side by side -> (B, len(blocks) * 2 * D, rows, cols), per block [patches, class token].

    features: from `dense_features(..., prefix_tokens=True)`; the class token is the first prefix token, as
    `DenseFeatures` lays them out for a model that has one."""
    if features.prefix is None:
        raise UsageError(
            "the depth head reads each block's class token; compute the features with "
            "dense_features(model, images, layers, prefix_tokens=True)"
        )
    parts = []
    for block, grid, prefix in zip(features.blocks, features.grids, features.prefix):
        if isinstance(grid, list):
            raise UsageError("images at their own grids have no common grid to stack; take them one image at a time")
        if prefix.shape[1] == 0:
            raise UsageError(
                f"block {block} has no prefix tokens: the depth head needs a model with a class token "
                "(class_token=True)"
            )
        class_token = prefix[:, 0, :, None, None].expand_as(grid)  # (B, D) -> (B, D, rows, cols)
        parts += [grid, class_token]
    return torch.cat(parts, dim=1)


class LinearDepthHead(nn.Module):
    """BatchNorm, then a linear map of every patch's features to logits over depth bins, read out as the expected
    bin depth (DINOv2's linear depth head; see the module docstring)."""

    def __init__(
        self, channels: int, min_depth: float, max_depth: float, bins: int = BINS, upsample: int = UPSAMPLE
    ) -> None:
        super().__init__()
        if not 0 <= min_depth < max_depth or bins < 2 or upsample < 1:
            raise UsageError(
                f"a depth head needs 0 <= min_depth < max_depth, bins >= 2 and upsample >= 1; got "
                f"min_depth={min_depth}, max_depth={max_depth}, bins={bins}, upsample={upsample}"
            )
        self.min_depth, self.max_depth, self.upsample = float(min_depth), float(max_depth), upsample
        self.norm = nn.BatchNorm2d(channels)
        self.classifier = nn.Conv2d(channels, bins, kernel_size=1)
        self.register_buffer("bin_depths", torch.linspace(min_depth, max_depth, bins))  # DINOv2's "UD" bins

    def forward(self, features: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """features (B, C, rows, cols) -> depths in metres (B, upsample * rows, upsample * cols), or bilinearly
        resized to `size` (H, W)."""
        logits = self.classifier(self.norm(features))  # (B, bins, rows, cols)
        if self.upsample > 1:
            logits = F.interpolate(logits, scale_factor=self.upsample, mode="bilinear", align_corners=False)
        weights = torch.relu(logits) + LINEAR_NORM_EPS
        # sum_k p_k d_k with p = w / sum w, as one ratio of two sums: no normalised copy of the (bins, H, W) tensor
        # (nor its backward) is made, the largest cost of a training step on a CPU.
        depths = torch.einsum("bkhw,k->bhw", weights, self.bin_depths) / weights.sum(dim=1)
        if size is not None and tuple(size) != tuple(depths.shape[-2:]):
            depths = F.interpolate(depths[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
        return depths


@dataclass
class DepthProbeResult:
    head: LinearDepthHead  # the head of the chosen learning rate
    learning_rate: float  # chosen on the validation split's RMSE
    validation: DepthScores  # the chosen head's, on the validation split
    tried: dict[float, float] = field(default_factory=dict)  # learning rate -> validation RMSE


def valid_depths(truth: torch.Tensor, min_depth: float, max_depth: float) -> torch.Tensor:
    """The pixels that carry a measurement: min_depth < truth <= max_depth (0 = none), as `metrics.depth` counts."""
    return (truth > min_depth) & (truth <= max_depth)


def sig_loss(predicted: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """AdaBins' scale-invariant log loss over the valid pixels of a batch (B, H, W), pooled: sqrt(Var g +
    0.15 (mean g)^2), g = ln(predicted + 1e-3) - ln(truth + 1e-3), the variance unbiased as torch.var's. 0 (with a
    gradient) when no pixel is valid."""
    g = torch.where(valid, (predicted + LOG_EPS).log() - (truth + LOG_EPS).log(), 0.0)
    count = valid.sum()
    mean = g.sum() / count.clamp(min=1)
    variance = torch.where(valid, g - mean, 0.0).square().sum() / (count - 1).clamp(min=1)
    # Clamped above 0 so the root's gradient stays finite at a perfect fit (where the loss's own gradient is 0).
    return (variance + SIG_VARIANCE_FOCUS * mean.square()).clamp(min=1e-12).sqrt() * (count > 0)


def gradient_loss(predicted: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """MegaDepth's gradient-matching loss on depth maps (B, H, W): at each stride of `GRADIENT_STRIDES`, the absolute
    differences of g = ln(predicted + 1e-3) - ln(truth + 1e-3) between pixels two apart (down and across) where both
    are valid, summed and divided by the valid pixels at that stride; the scales summed."""
    total = predicted.new_zeros(())
    for stride in GRADIENT_STRIDES:
        mask = valid[:, ::stride, ::stride]
        g = (predicted[:, ::stride, ::stride] + LOG_EPS).log() - (truth[:, ::stride, ::stride] + LOG_EPS).log()
        g = torch.where(mask, g, 0.0)
        down = (g[:, :-2] - g[:, 2:]).abs() * (mask[:, :-2] & mask[:, 2:])
        across = (g[:, :, :-2] - g[:, :, 2:]).abs() * (mask[:, :, :-2] & mask[:, :, 2:])
        total = total + (down.sum() + across.sum()) / mask.sum().clamp(min=1)
    return total


def depth_loss(
    predicted: torch.Tensor,
    truth: torch.Tensor,
    min_depth: float,
    max_depth: float,
    gradient_loss_weight: float = GRADIENT_LOSS_WEIGHT,
) -> torch.Tensor:
    """DINOv2's depth loss: SigLoss + gradient_loss_weight * GradientLoss, on predicted and true depths (B, H, W) of
    one size, over the pixels whose truth is in (min_depth, max_depth]."""
    valid = valid_depths(truth, min_depth, max_depth)
    loss = sig_loss(predicted, truth, valid)
    if gradient_loss_weight:
        loss = loss + gradient_loss_weight * gradient_loss(predicted, truth, valid)
    return loss


def predicted_depths(
    head: LinearDepthHead, features: torch.Tensor, size: tuple[int, int], batch_size: int = 256
) -> torch.Tensor:
    """features (N, C, rows, cols) -> the predicted depth of every pixel (N, H, W), float32 metres."""
    head.eval()
    with torch.no_grad():
        return torch.cat([head(chunk.float(), size) for chunk in features.split(batch_size)])


def depth_scores(
    head: LinearDepthHead, features: torch.Tensor, depths: torch.Tensor, batch_size: int = 256
) -> DepthScores:
    """The head's RMSE, AbsRel, delta < 1.25 ... (`metrics.depth`, per image then averaged) on features
    (N, C, rows, cols) against true depths (N, H, W), counted in the head's (min_depth, max_depth]."""
    meter = DepthMeter(head.min_depth, head.max_depth, features.device)
    size = (depths.shape[-2], depths.shape[-1])
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        truth = depths[start : start + batch_size].to(features.device)
        meter.update(predicted_depths(head, chunk, size, batch_size), truth)
    return meter.scores()


def train_depth_head(
    train_features: torch.Tensor,
    train_depths: torch.Tensor,
    min_depth: float,
    max_depth: float,
    learning_rate: float,
    epochs: int = 10,
    batch_size: int = 64,
    weight_decay: float = 1e-2,
    bins: int = BINS,
    gradient_loss_weight: float = GRADIENT_LOSS_WEIGHT,
    seed: int = 0,
    on_epoch: Callable[[], None] | None = None,
) -> LinearDepthHead:
    """One head trained with AdamW (DINOv2's weight decay 0.01) and a cosine schedule on features
    (N, C, rows, cols) and depths (N, H, W) in metres, 0 where there is no measurement."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the head's initialisation
    head = LinearDepthHead(train_features.shape[1], min_depth, max_depth, bins).to(train_features.device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=learning_rate, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(train_features) / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    size = (train_depths.shape[-2], train_depths.shape[-1])
    head.train()
    for _ in range(epochs):
        order = torch.randperm(len(train_features), generator=generator)
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            predicted = head(train_features[chosen.to(train_features.device)].float(), size)
            truth = train_depths[chosen.to(train_depths.device)].to(predicted.device).float()
            loss = depth_loss(predicted, truth, min_depth, max_depth, gradient_loss_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if on_epoch is not None:
            on_epoch()
    return head


def train_depth_probe(
    train_features: torch.Tensor,
    train_depths: torch.Tensor,
    validation_features: torch.Tensor,
    validation_depths: torch.Tensor,
    min_depth: float,
    max_depth: float,
    learning_rates: Sequence[float] = (1e-3, 3e-3, 1e-2),
    epochs: int = 10,
    batch_size: int = 64,
    bins: int = BINS,
    gradient_loss_weight: float = GRADIENT_LOSS_WEIGHT,
    seed: int = 0,
    on_epoch: Callable[[], None] | None = None,
) -> DepthProbeResult:
    """A head per learning rate, the one with the lowest validation RMSE kept (never the test split's).

    features: `depth_head_input` of the cached features, (N, C, rows, cols); depths (N, H, W) float metres, 0 where
    there is no measurement; min_depth, max_depth: the bins' range and the pixels counted (DINOv2: 1e-3 and 10 m
    on NYUv2, 80 m on KITTI). on_epoch: called after each epoch of each head (progress)."""
    for split, features, depths in (
        ("training", train_features, train_depths),
        ("validation", validation_features, validation_depths),
    ):
        if features.ndim != 4 or depths.ndim != 3 or len(features) != len(depths):
            raise UsageError(
                f"{split} features (N, C, rows, cols) and depths (N, H, W) of the same images, got "
                f"{tuple(features.shape)} and {tuple(depths.shape)}"
            )
        if not depths.is_floating_point():
            raise UsageError(f"{split} depths are {depths.dtype}: pass depths in metres as floats (0 = no measurement)")
    best: DepthProbeResult | None = None
    tried: dict[float, float] = {}
    for learning_rate in learning_rates:
        head = train_depth_head(
            train_features,
            train_depths,
            min_depth,
            max_depth,
            learning_rate,
            epochs,
            batch_size,
            bins=bins,
            gradient_loss_weight=gradient_loss_weight,
            seed=seed,
            on_epoch=on_epoch,
        )
        scores = depth_scores(head, validation_features, validation_depths)
        tried[learning_rate] = scores.rmse
        if best is None or lower_rmse(scores, best.validation):
            best = DepthProbeResult(head, learning_rate, scores)
    assert best is not None
    best.tried = tried
    return best


def lower_rmse(scores: DepthScores, than: DepthScores) -> bool:
    """Whether `scores` has the lower RMSE; a NaN RMSE (no valid pixel, or a diverged head) loses to any number."""
    return not math.isnan(scores.rmse) and (math.isnan(than.rmse) or scores.rmse < than.rmse)
