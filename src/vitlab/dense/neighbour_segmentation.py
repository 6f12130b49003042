"""Training-free segmentation by nearest-neighbour retrieval of labelled patches, beside the linear probe.

    bank    = every training patch with a counted pixel: its L2-normalised features and its label distribution
    scores  = for each query patch, its k most similar bank patches (exact cosine), their label distributions
              averaged with DINO's weights exp(similarity / T), T = 0.07
    mask    = argmax over classes of the scores, bilinearly upsampled to the image as the linear head's logits are

This is the dense "nearest neighbour retrieval" evaluation of Hummingbird (Balazevic et al. 2023, "Towards In-context
Scene Understanding"): a frozen encoder's patch features are judged by how well labelled patches of other images,
found by similarity alone, label a new image. Nothing is trained; the only choice, k, is made on the validation
split's mIoU (never the test split's). The weighted vote is DINO's k-NN classifier (`vitlab.metrics.neighbours`), here
per patch.

Why label distributions, not majority labels: a patch of 16 x 16 pixels often straddles an object's boundary. Its
majority label would discard the minority class's pixels, and a small or thin object (a pole, a bottle) that never
holds the majority of a patch would vanish from the bank. Each patch carries the fraction of its counted pixels of
each class instead (pixels labelled 255 left out; a patch with none is left out of the bank), so the neighbours vote
with what they hold, and a query patch half road, half car scores both.

Cost: the bank holds M x C float32 features and M x K float32 label distributions, every counted patch of the
training split (1,464 VOC images at 32 x 32 patches and C = 768: 1.5 M patches, 4.6 GB of features; ADE20K's 20,210
images: 20.7 M patches, 64 GB; pass `max_patches` to keep a uniform sample). Each of the Q query patches is compared
with every bank patch, M x Q dot products, exactly, by `vitlab.metrics.neighbours.nearest`: faiss where installed, else
torch in chunks of 1,024 queries (memory: 1,024 x M similarities). Each call also copies the bank once (normalised,
or into faiss's index), so a head called image by image pays M x C per image on top of the search. Choosing k costs
one search: the validation patches' neighbours are found once for the largest k, and a smaller k reads the first k
of them (they come most similar first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from vitlab.errors import DataError, UsageError
from vitlab.metrics.neighbours import KNN_TEMPERATURE, nearest
from vitlab.metrics.segmentation import IGNORE_LABEL, ConfusionMatrix, SegmentationScores

KS = (1, 5, 10, 20)  # the neighbour counts tried on the validation split
MASK_CHUNK = 64  # images whose label distributions are counted at once (memory: chunk x H x W int64)


def patch_pixels(masks: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """masks (N, H, W) -> (N, rows, ph, cols, pw), a view: each patch's pixels of the (rows, cols) feature grid."""
    if masks.ndim != 3:
        raise UsageError(f"masks must be (N, H, W), got {tuple(masks.shape)}")
    count, height, width = masks.shape
    rows, cols = grid
    if rows < 1 or cols < 1 or height % rows or width % cols:
        raise UsageError(
            f"masks of {height} x {width} pixels do not split into the feature grid's {rows} x {cols} patches; "
            "pass masks at the features' pixel size (H = rows * patch height, W = cols * patch width), e.g. the "
            "training views the features were computed from"
        )
    return masks.reshape(count, rows, height // rows, cols, width // cols)


def patch_label_distributions(
    masks: torch.Tensor, grid: tuple[int, int], num_classes: int, ignore_label: int = IGNORE_LABEL
) -> torch.Tensor:
    """masks (N, H, W) of class indices, H and W whole multiples of grid (rows, cols) -> (N, rows, cols, K) float32:
    each patch's fraction of its counted pixels in each class. Pixels labelled `ignore_label` are not counted; a
    patch with no counted pixel is all zeros."""
    labels = patch_pixels(masks, grid).long()  # (N, rows, ph, cols, pw)
    count, rows, _, cols, _ = labels.shape
    ignored = labels == ignore_label
    out_of_range = int((~ignored & ((labels < 0) | (labels >= num_classes))).sum())
    if out_of_range:
        raise DataError(
            f"{out_of_range} mask pixels are outside 0..{num_classes - 1} and not the ignore label {ignore_label}; "
            "masks must hold class indices below num_classes (a data set counting from 1 needs them shifted down)"
        )
    # One histogram over (patch, class) cells; ignored pixels land in an extra class K, dropped afterwards.
    labels = labels.masked_fill(ignored, num_classes)
    patch = torch.arange(count * rows * cols, device=masks.device).view(count, rows, 1, cols, 1)
    cells = patch * (num_classes + 1) + labels  # (N, rows, ph, cols, pw)
    counts = torch.bincount(cells.reshape(-1), minlength=count * rows * cols * (num_classes + 1))
    counts = counts.view(count, rows, cols, num_classes + 1)[..., :num_classes].float()  # (N, rows, cols, K)
    return counts / counts.sum(dim=-1, keepdim=True).clamp(min=1)


@dataclass
class PatchBank:
    """The labelled patches a query's neighbours are found among. Memory: M x (C + K) float32."""

    features: torch.Tensor  # (M, C) float32, L2-normalised
    labels: torch.Tensor  # (M, K) float32: each patch's label distribution (rows sum to 1)


def patch_bank(
    features: torch.Tensor,
    masks: torch.Tensor,
    num_classes: int,
    max_patches: int | None = None,
    seed: int = 0,
    ignore_label: int = IGNORE_LABEL,
) -> PatchBank:
    """features (N, C, rows, cols) and masks (N, H, W) at the features' pixel size -> every patch with a counted
    pixel, a uniform sample of `max_patches` of them (seeded) where there are more. Memory: M x (C + K) float32."""
    if features.ndim != 4 or len(features) != len(masks):
        raise UsageError(
            f"features (N, C, rows, cols) and masks (N, H, W) of the same images, got {tuple(features.shape)} "
            f"and {tuple(masks.shape)}"
        )
    if max_patches is not None and max_patches < 1:
        raise UsageError(f"max_patches must be at least 1 (or None for every patch), got {max_patches}")
    count, _, rows, cols = features.shape
    per_image = rows * cols
    counted = (patch_pixels(masks, (rows, cols)) != ignore_label).any(dim=4).any(dim=2)  # (N, rows, cols)
    kept = counted.reshape(-1).nonzero().squeeze(1).cpu()  # flat patch indices, ascending
    if not len(kept):
        raise DataError(f"no training patch has a pixel that is not the ignore label {ignore_label}; check the masks")
    if max_patches is not None and len(kept) > max_patches:
        generator = torch.Generator().manual_seed(seed)
        kept = kept[torch.randperm(len(kept), generator=generator)[:max_patches]].sort().values
    # (N, C, rows * cols)[image, :, position] -> (M, C): gathers the kept patches without copying the rest.
    on_device = kept.to(features.device)
    bank_features = features.flatten(2)[on_device // per_image, :, on_device % per_image]
    labels = torch.empty(len(kept), num_classes)
    for start in range(0, count, MASK_CHUNK):
        in_chunk = (kept >= start * per_image) & (kept < (start + MASK_CHUNK) * per_image)
        distributions = patch_label_distributions(
            masks[start : start + MASK_CHUNK], (rows, cols), num_classes, ignore_label
        )
        labels[in_chunk] = distributions.reshape(-1, num_classes).cpu()[kept[in_chunk] - start * per_image]
    return PatchBank(F.normalize(bank_features.float(), dim=1), labels.to(features.device))


class NeighbourSegmentationHead(nn.Module):
    """Class scores of each patch from its k nearest bank patches; nothing to train (the bank is held as buffers,
    so `.to(device)` moves it and `.eval()` / `.train()` change nothing)."""

    bank_features: torch.Tensor  # (M, C), L2-normalised
    bank_labels: torch.Tensor  # (M, K) label distributions

    def __init__(self, bank: PatchBank, k: int = 10, temperature: float = KNN_TEMPERATURE) -> None:
        super().__init__()
        if k < 1 or temperature <= 0:
            raise UsageError(f"k must be at least 1 and the temperature positive, got k={k}, temperature={temperature}")
        self.register_buffer("bank_features", bank.features)
        self.register_buffer("bank_labels", bank.labels)
        self.k, self.temperature = k, temperature

    @property
    def num_classes(self) -> int:
        return self.bank_labels.shape[1]

    def neighbours(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, C, rows, cols) -> (similarities, bank indices), each (B * rows * cols, k), most similar
        first; patches in (image, row, col) order."""
        queries = features.permute(0, 2, 3, 1).reshape(-1, features.shape[1])  # (B * rows * cols, C)
        # faiss reads host memory only; a bank on an accelerator is searched by torch there.
        use_faiss = None if self.bank_features.device.type == "cpu" else False
        return nearest(self.bank_features, queries.to(self.bank_features.device), self.k, use_faiss=use_faiss)

    def class_scores(
        self,
        similarities: torch.Tensor,
        indices: torch.Tensor,
        grid: tuple[int, int, int],
        size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Neighbours (B * rows * cols, k) of the (B, rows, cols) grid -> class scores (B, K, rows, cols): the
        neighbours' label distributions weighted by exp(similarity / T), or bilinearly upsampled to `size` (H, W)."""
        # The weights' common factor exp(max / T) cancels in the ratio; taking it out keeps exp finite for any T.
        weights = ((similarities - similarities[:, :1]) / self.temperature).exp()  # (Q, k)
        scores = torch.zeros(len(indices), self.num_classes, device=self.bank_labels.device)
        for rank in range(indices.shape[1]):  # k steps of (Q, K), not one (Q, k, K) gather
            scores += weights[:, rank, None] * self.bank_labels[indices[:, rank]]
        scores /= weights.sum(dim=1, keepdim=True)
        scores = scores.view(*grid, self.num_classes).permute(0, 3, 1, 2)  # (B, K, rows, cols)
        if size is not None:
            scores = F.interpolate(scores, size=size, mode="bilinear", align_corners=False)
        return scores

    def forward(self, features: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        """features (B, C, rows, cols) -> class scores (B, K, rows, cols), or upsampled to `size` (H, W);
        `.argmax(dim=1)` is the predicted mask, as with the linear head's logits."""
        batch, _, rows, cols = features.shape
        similarities, indices = self.neighbours(features)
        return self.class_scores(similarities, indices, (batch, rows, cols), size)


@dataclass
class NeighbourProbeResult:
    head: NeighbourSegmentationHead  # the head of the chosen k
    k: int  # chosen on the validation split's mIoU
    validation: SegmentationScores  # the chosen head's, on the validation split
    tried: dict[int, float] = field(default_factory=dict)  # k -> validation mIoU


def train_neighbour_probe(
    train_features: torch.Tensor,
    train_masks: torch.Tensor,
    validation_features: torch.Tensor,
    validation_masks: torch.Tensor,
    num_classes: int,
    ks: Sequence[int] = KS,
    temperature: float = KNN_TEMPERATURE,
    max_patches: int | None = None,
    seed: int = 0,
    batch_size: int = 256,
) -> NeighbourProbeResult:
    """The bank of the training patches, and the k of `ks` with the best validation mIoU (never the test split's).
    Features (N, C, rows, cols), masks (N, H, W); the training masks at the features' pixel size, the validation
    masks at any size (the scores are upsampled to it). The validation neighbours are searched once, for max(ks)."""
    if not ks or min(ks) < 1:
        raise UsageError(f"ks must be neighbour counts of at least 1, got {tuple(ks)}")
    if validation_features.ndim != 4 or len(validation_features) != len(validation_masks):
        raise UsageError(
            f"validation features (N, C, rows, cols) and masks (N, H, W) of the same images, got "
            f"{tuple(validation_features.shape)} and {tuple(validation_masks.shape)}"
        )
    bank = patch_bank(train_features, train_masks, num_classes, max_patches, seed)
    batch, _, rows, cols = validation_features.shape
    searcher = NeighbourSegmentationHead(bank, max(ks), temperature)
    similarities, indices = searcher.neighbours(validation_features)  # (N * rows * cols, max(ks))
    per_image, size = rows * cols, (validation_masks.shape[-2], validation_masks.shape[-1])
    best: NeighbourProbeResult | None = None
    tried: dict[int, float] = {}
    for k in ks:
        head_k = NeighbourSegmentationHead(bank, k, temperature)
        confusion = ConfusionMatrix(num_classes, IGNORE_LABEL, validation_masks.device)
        for start in range(0, batch, batch_size):
            images = slice(start * per_image, (start + batch_size) * per_image)
            chunk = validation_masks[start : start + batch_size]
            scores = head_k.class_scores(similarities[images, :k], indices[images, :k], (len(chunk), rows, cols), size)
            confusion.update(scores.argmax(dim=1).to(chunk.device), chunk)
        scores_k = confusion.scores()
        tried[k] = scores_k.mean_iou
        if best is None or scores_k.mean_iou > best.validation.mean_iou:
            best = NeighbourProbeResult(head_k, k, scores_k)
    assert best is not None
    best.tried = tried
    return best
