"""DINOv3's linear segmentation probe on frozen patch features (issue 49, item 4).

    logits = Conv1x1(BatchNorm(features))            (B, K, rows, cols), one linear map per patch
    loss = CrossEntropy(upsample_bilinear(logits) to the mask's size, mask), pixels labelled 255 left out

as DINOv3's `LinearHead` (`dinov3/eval/segmentation/models/heads/linear_head.py`: BatchNorm, dropout, a 1x1
convolution) trains it on the last block's normed features (or the last four blocks' stacked: `layers="last4"`).
The features are computed once and cached (`dense.features`, `vitlab dense`), so the probe's epochs cost a head's
work only. The learning rate is chosen on the validation split's mIoU among `learning_rates` (DINOv3 sweeps it
too); the test split is measured once, with the chosen head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from vitlab.errors import UsageError
from vitlab.metrics.segmentation import IGNORE_LABEL, ConfusionMatrix, SegmentationScores


class LinearSegmentationHead(nn.Module):
    """BatchNorm then a linear map of every patch's features to class logits (DINOv3's linear head)."""

    def __init__(self, channels: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, kernel_size=1)

    def forward(self, features: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """features (B, C, rows, cols) -> logits (B, K, rows, cols), or bilinearly upsampled to `size` (H, W)."""
        logits = self.classifier(self.dropout(self.norm(features)))
        if size is not None:
            logits = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
        return logits


@dataclass
class ProbeResult:
    head: LinearSegmentationHead  # the head of the chosen learning rate
    learning_rate: float  # chosen on the validation split's mIoU
    validation: SegmentationScores  # the chosen head's, on the validation split
    tried: dict[float, float] = field(default_factory=dict)  # learning rate -> validation mIoU


def predicted_masks(
    head: nn.Module, features: torch.Tensor, size: tuple[int, int], batch_size: int = 256
) -> torch.Tensor:
    """features (N, C, rows, cols) -> the predicted label of every pixel (N, H, W), int64. head: any module whose
    forward(features, size) gives class scores (the linear head, the nearest-neighbour head)."""
    head.eval()
    with torch.no_grad():
        return torch.cat([head(chunk, size).argmax(dim=1) for chunk in features.split(batch_size)])


def segmentation_scores(
    head: nn.Module, features: torch.Tensor, masks: torch.Tensor, num_classes: int, batch_size: int = 256
) -> SegmentationScores:
    """The head's mIoU, per-class IoU and pixel accuracy on features (N, C, rows, cols) against masks (N, H, W)."""
    confusion = ConfusionMatrix(num_classes, IGNORE_LABEL, features.device)
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        confusion.update(
            predicted_masks(head, chunk, tuple(masks.shape[-2:]), batch_size), masks[start : start + batch_size]
        )
    return confusion.scores()


def train_head(
    train_features: torch.Tensor,
    train_masks: torch.Tensor,
    num_classes: int,
    learning_rate: float,
    epochs: int = 10,
    batch_size: int = 64,
    weight_decay: float = 1e-3,
    seed: int = 0,
    on_epoch: Callable[[], None] | None = None,
) -> LinearSegmentationHead:
    """One head trained with AdamW and a cosine schedule on features (N, C, rows, cols) and masks (N, H, W)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the head's initialisation and dropout
    head = LinearSegmentationHead(train_features.shape[1], num_classes).to(train_features.device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=learning_rate, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(train_features) / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    size = tuple(train_masks.shape[-2:])
    head.train()
    for _ in range(epochs):
        order = torch.randperm(len(train_features), generator=generator)
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size].to(train_features.device)
            logits = head(train_features[chosen].float(), size)
            loss = F.cross_entropy(logits, train_masks[chosen].long(), ignore_index=IGNORE_LABEL)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if on_epoch is not None:
            on_epoch()
    return head


def train_segmentation_probe(
    train_features: torch.Tensor,
    train_masks: torch.Tensor,
    validation_features: torch.Tensor,
    validation_masks: torch.Tensor,
    num_classes: int,
    learning_rates: Sequence[float] = (1e-3, 3e-3, 1e-2),
    epochs: int = 10,
    batch_size: int = 64,
    seed: int = 0,
    on_epoch: Callable[[], None] | None = None,
) -> ProbeResult:
    """A head per learning rate, the one with the best validation mIoU kept (never the test split's).
    on_epoch: called after each epoch of each head (progress: len(learning_rates) x epochs calls)."""
    if train_features.ndim != 4 or len(train_features) != len(train_masks):
        raise UsageError(
            f"features (N, C, rows, cols) and masks (N, H, W) of the same images, got {tuple(train_features.shape)} "
            f"and {tuple(train_masks.shape)}"
        )
    best: ProbeResult | None = None
    tried: dict[float, float] = {}
    for learning_rate in learning_rates:
        head = train_head(
            train_features, train_masks, num_classes, learning_rate, epochs, batch_size, seed=seed, on_epoch=on_epoch
        )
        scores = segmentation_scores(head, validation_features, validation_masks, num_classes)
        tried[learning_rate] = scores.mean_iou
        if best is None or scores.mean_iou > best.validation.mean_iou:
            best = ProbeResult(head, learning_rate, scores)
    assert best is not None
    best.tried = tried
    return best
