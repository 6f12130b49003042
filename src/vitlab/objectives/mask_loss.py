"""The mask-classification loss EoMT trains with (Kerssies et al. 2025, "Your ViT is Secretly an Image Segmentation
Model"), which is Mask2Former's (Cheng et al. 2022) applied to each of EoMT's predictions.

A prediction is Q queries, each a class distribution over K classes plus "no object" and a mask. The loss
1. matches queries to an image's target segments one to one (Hungarian, `match_queries`), at the cost
   class_weight * (-p(target class)) + mask_weight * BCE + dice_weight * dice, the mask terms measured on the same
   random points for every (query, segment) pair;
2. trains every query's class with cross-entropy (unmatched queries: "no object", weighted `no_object_weight`);
3. trains the matched queries' masks with sigmoid BCE and dice on points chosen by uncertainty (PointRend's
   importance sampling: mostly where the mask logit is near 0, the rest uniform), not on every pixel: the masks are
   compared at any resolution by bilinear point sampling (`grid_sample`), so a (h, w) mask meets its (H, W) target
   without upsampling either.
The mask terms are summed over matched masks and divided by the number of target segments in the batch (the mean
over processes under torchrun), as transformers does; the original EoMT divides by the number of matched segments,
the same number unless an image has more segments than queries.

Reference: tue-mps/eomt (training/mask_classification_loss.py, built on transformers' Mask2FormerLoss) and
transformers' `EomtLoss`; tests/objectives/test_mask_loss.py compares the three parts with `EomtLoss` on one batch.

Ignored pixels: `semantic_targets` leaves them out of every target segment, as the original EoMT's data sets do
(a pixel whose label is not a class gets no mask), so for a matched query they are points where the target mask is
0 (background), not points left out: the original loss has no ignore mask beyond that, and neither has this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.distributed import DistEnv, all_reduce_sum
from vitlab.errors import DataError


@dataclass
class MaskTargets:
    """One image's target segments: masks (N, H, W) float in {0, 1}, labels (N,) int64 class indices in [0, K)."""

    masks: Tensor
    labels: Tensor

    def to(self, device: torch.device | str) -> MaskTargets:
        return MaskTargets(self.masks.to(device), self.labels.to(device))


def semantic_targets(label_map: Tensor, ignore_label: int = 255) -> MaskTargets:
    """A semantic label map (H, W) int64 -> one target segment per class present, classes in increasing order:
    masks (N, H, W) float, labels (N,). Pixels labelled `ignore_label` belong to no segment."""
    if label_map.ndim != 2:
        raise DataError(f"a semantic label map is (H, W), got shape {tuple(label_map.shape)}")
    classes = label_map.unique()
    classes = classes[classes != ignore_label]
    masks = label_map[None] == classes[:, None, None]  # (N, H, W)
    return MaskTargets(masks.float(), classes.long())


def sample_points(maps: Tensor, points: Tensor) -> Tensor:
    """maps (N, H, W), points (N, P, 2) as (x, y) in [0, 1]^2 -> the maps' bilinear values there, (N, P).

    Coordinates are relative to the map's extent (pixel centres at (i + 0.5) / H), so maps of different resolution
    sampled at the same points compare the same places of the image."""
    grid = 2.0 * points[:, :, None, :] - 1.0  # (N, P, 1, 2) in grid_sample's [-1, 1]
    values = F.grid_sample(maps[:, None], grid.to(maps.dtype), align_corners=False)  # (N, 1, P, 1)
    return values[:, 0, :, 0]


def pairwise_mask_costs(pred_logits: Tensor, target_masks: Tensor) -> tuple[Tensor, Tensor]:
    """pred_logits (Q, P) at P points, target_masks (N, P) in {0, 1} at the same points -> the mean sigmoid BCE and
    the dice loss of every (query, segment) pair, each (Q, N)."""
    num_points = pred_logits.shape[1]
    # BCE at a point is bce(x, 1) where the target is 1 and bce(x, 0) where it is 0: two matmuls give every pair.
    loss_inside = F.binary_cross_entropy_with_logits(pred_logits, torch.ones_like(pred_logits), reduction="none")
    loss_outside = F.binary_cross_entropy_with_logits(pred_logits, torch.zeros_like(pred_logits), reduction="none")
    bce = (loss_inside / num_points) @ target_masks.T + (loss_outside / num_points) @ (1 - target_masks).T
    probs = pred_logits.sigmoid()
    overlap = 2 * probs @ target_masks.T
    total = probs.sum(-1)[:, None] + target_masks.sum(-1)[None, :]
    dice = 1 - (overlap + 1) / (total + 1)
    return bce, dice


def matching_cost(
    class_logits: Tensor,
    mask_logits: Tensor,
    target: MaskTargets,
    points: Tensor,
    class_weight: float = 2.0,
    mask_weight: float = 5.0,
    dice_weight: float = 5.0,
) -> Tensor:
    """The cost (Q, N) of giving query q segment n: class_weight * -softmax(class_logits[q])[label n] +
    mask_weight * BCE + dice_weight * dice, the mask terms at `points` (P, 2) in [0, 1]^2, the same for every pair.

    class_logits (Q, K + 1), mask_logits (Q, h, w), target: N segments at any (H, W). NaN and inf (a diverged
    prediction) become the largest float, so such a pair is matched only when nothing else can be."""
    pred = sample_points(mask_logits.float(), points[None].expand(mask_logits.shape[0], -1, -1))  # (Q, P)
    masks = target.masks.to(device=mask_logits.device, dtype=torch.float32)
    targets = sample_points(masks, points[None].expand(masks.shape[0], -1, -1))  # (N, P)
    bce, dice = pairwise_mask_costs(pred, targets)
    # -p(class) rather than the NLL: bounded, and the constant 1 of 1 - p changes no assignment.
    class_cost = -class_logits.float().softmax(-1)[:, target.labels.to(class_logits.device)]  # (Q, N)
    cost = mask_weight * bce + class_weight * class_cost + dice_weight * dice
    largest = torch.finfo(cost.dtype).max
    return torch.nan_to_num(cost, nan=largest, posinf=largest, neginf=largest)


@torch.no_grad()
def match_queries(
    class_logits: Tensor,
    mask_logits: Tensor,
    target: MaskTargets,
    class_weight: float = 2.0,
    mask_weight: float = 5.0,
    dice_weight: float = 5.0,
    num_points: int = 12544,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """One image's queries matched to its target segments, one to one, at the least total `matching_cost`.

    class_logits (Q, K + 1), mask_logits (Q, h, w), target: N segments at any (H, W). The mask terms are measured
    on `num_points` uniform random points shared by every pair, drawn from `generator` (on the logits' device;
    None: the global generator). Returns (query_idx, target_idx), int64, min(Q, N) pairs, query_idx increasing
    (scipy's linear_sum_assignment order)."""
    from scipy.optimize import linear_sum_assignment

    points = torch.rand(num_points, 2, device=mask_logits.device, generator=generator)
    cost = matching_cost(class_logits, mask_logits, target, points, class_weight, mask_weight, dice_weight)
    query_idx, target_idx = linear_sum_assignment(cost.cpu().numpy())
    device = class_logits.device
    return torch.as_tensor(query_idx, dtype=torch.int64, device=device), torch.as_tensor(
        target_idx, dtype=torch.int64, device=device
    )


def uncertain_points(
    mask_logits: Tensor,
    num_points: int,
    oversample_ratio: float,
    importance_sample_ratio: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """mask_logits (M, h, w) -> (M, num_points, 2) points in [0, 1]^2 for each mask: of num_points * oversample_ratio
    uniform candidates, the importance_sample_ratio * num_points whose logit is nearest 0 (the most uncertain),
    then uniform points for the rest (PointRend, section 3.1, as Mask2Former trains)."""
    num_masks = mask_logits.shape[0]
    num_candidates = int(num_points * oversample_ratio)
    num_uncertain = int(importance_sample_ratio * num_points)
    device = mask_logits.device
    candidates = torch.rand(num_masks, num_candidates, 2, device=device, generator=generator)
    uncertainty = -sample_points(mask_logits, candidates).abs()  # (M, num_candidates)
    chosen = uncertainty.topk(num_uncertain, dim=1).indices  # (M, num_uncertain)
    points = candidates.gather(1, chosen[..., None].expand(-1, -1, 2))  # (M, num_uncertain, 2)
    num_random = num_points - num_uncertain
    if num_random > 0:
        uniform = torch.rand(num_masks, num_random, 2, device=device, generator=generator)
        points = torch.cat([points, uniform], dim=1)
    return points


class MaskClassificationLoss:
    """EoMT's loss for one prediction: weighted class cross-entropy + mask BCE + dice after Hungarian matching.

    Defaults are EoMT's (and Mask2Former's): class 2, mask 5, dice 5, "no object" 0.1, 12544 = 112 * 112 points,
    3x oversampling, 75% of them by uncertainty.

    env: under torchrun, the number of target segments that divides the mask terms is the mean over processes (as
    EoMT and transformers do), so every process's masks weigh the same in the averaged gradient; every process
    must then call the loss at the same steps. None or one process: this process's count."""

    def __init__(
        self,
        num_classes: int,
        class_weight: float = 2.0,
        mask_weight: float = 5.0,
        dice_weight: float = 5.0,
        no_object_weight: float = 0.1,
        num_points: int = 12544,
        oversample_ratio: float = 3.0,
        importance_sample_ratio: float = 0.75,
        env: DistEnv | None = None,
    ) -> None:
        self.num_classes = num_classes
        self.class_weight = class_weight
        self.mask_weight = mask_weight
        self.dice_weight = dice_weight
        self.no_object_weight = no_object_weight
        self.num_points = num_points
        self.oversample_ratio = oversample_ratio
        self.importance_sample_ratio = importance_sample_ratio
        self.env = env

    def __call__(
        self,
        class_logits: Tensor,
        mask_logits: Tensor,
        targets: list[MaskTargets],
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """class_logits (B, Q, K + 1) (the last column "no object"), mask_logits (B, Q, h, w), one MaskTargets per
        image (masks at any (H, W)) -> (total, parts): total = class_weight * class + mask_weight * mask +
        dice_weight * dice, a scalar; parts "class", "mask", "dice" are the unweighted terms.

        Random points (matching, then importance sampling) come from `generator` (on the logits' device; None: the
        global generator), drawn image by image for the matching, then for all matched masks at once."""
        batch_size, num_queries, num_columns = class_logits.shape
        if num_columns != self.num_classes + 1:
            raise DataError(
                f"class logits have {num_columns} columns; a loss for {self.num_classes} classes expects "
                f"{self.num_classes + 1} (the classes, then 'no object')"
            )
        if len(targets) != batch_size:
            raise DataError(f"{len(targets)} targets for a batch of {batch_size} predictions; give one per image")
        for target in targets:
            if len(target.labels) and int(target.labels.max()) >= self.num_classes:
                raise DataError(
                    f"target label {int(target.labels.max())} is not one of the {self.num_classes} classes "
                    f"(0 to {self.num_classes - 1}); map other labels to the ignore label"
                )
        matches = [
            match_queries(
                class_logits[i],
                mask_logits[i],
                target,
                self.class_weight,
                self.mask_weight,
                self.dice_weight,
                self.num_points,
                generator,
            )
            for i, target in enumerate(targets)
        ]
        num_masks = self.num_masks(targets, class_logits.device)
        class_loss = self.class_loss(class_logits, targets, matches)
        mask_loss, dice_loss = self.mask_losses(mask_logits, targets, matches, num_masks, generator)
        total = self.class_weight * class_loss + self.mask_weight * mask_loss + self.dice_weight * dice_loss
        return total, {"class": class_loss, "mask": mask_loss, "dice": dice_loss}

    def num_masks(self, targets: list[MaskTargets], device: torch.device) -> Tensor:
        """What the mask terms are divided by: the batch's target segments (the mean over processes under
        torchrun), at least 1, as Mask2Former and EoMT do."""
        count = torch.tensor(float(sum(len(target.labels) for target in targets)), device=device)
        if self.env is not None and self.env.enabled:
            count = all_reduce_sum(count, self.env) / self.env.world_size
        return count.clamp(min=1)

    def class_loss(
        self, class_logits: Tensor, targets: list[MaskTargets], matches: list[tuple[Tensor, Tensor]]
    ) -> Tensor:
        """Cross-entropy over every query (B, Q): matched queries their segment's class, the rest "no object" (index
        K), whose weight is no_object_weight; the mean is weighted (torch's cross_entropy with `weight`)."""
        batch_size, num_queries, _ = class_logits.shape
        device = class_logits.device
        classes = torch.full((batch_size, num_queries), self.num_classes, dtype=torch.int64, device=device)
        for i, (target, (query_idx, target_idx)) in enumerate(zip(targets, matches)):
            classes[i, query_idx] = target.labels.to(device)[target_idx]
        weights = torch.ones(self.num_classes + 1, device=device)
        weights[-1] = self.no_object_weight
        return F.cross_entropy(class_logits.float().transpose(1, 2), classes, weight=weights)

    def mask_losses(
        self,
        mask_logits: Tensor,
        targets: list[MaskTargets],
        matches: list[tuple[Tensor, Tensor]],
        num_masks: Tensor,
        generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        """BCE and dice of the matched queries' masks on importance-sampled points, each summed over the M matched
        masks and divided by num_masks."""
        image_idx = torch.cat([torch.full_like(query_idx, i) for i, (query_idx, _) in enumerate(matches)])
        query_idx = torch.cat([query_idx for query_idx, _ in matches])
        if len(query_idx) == 0:  # no segments in the batch: nothing to compare, and a graph that still reaches masks
            zero = mask_logits.sum() * 0.0
            return zero, zero
        pred = mask_logits[image_idx, query_idx].float()  # (M, h, w)
        with torch.no_grad():
            points = uncertain_points(
                pred, self.num_points, self.oversample_ratio, self.importance_sample_ratio, generator
            )  # (M, P, 2)
            labels = []
            start = 0
            for target, (_, target_idx) in zip(targets, matches):
                # Each image's targets are sampled in their own (H, W); the points are fractions of it.
                masks = target.masks.to(device=pred.device, dtype=torch.float32)[target_idx]  # (m, H, W)
                labels.append(sample_points(masks, points[start : start + len(target_idx)]))
                start += len(target_idx)
            point_labels = torch.cat(labels)  # (M, P)
        point_logits = sample_points(pred, points)  # (M, P)
        bce = F.binary_cross_entropy_with_logits(point_logits, point_labels, reduction="none").mean(1)
        probs = point_logits.sigmoid()
        dice = 1 - (2 * (probs * point_labels).sum(-1) + 1) / (probs.sum(-1) + point_labels.sum(-1) + 1)
        return bce.sum() / num_masks, dice.sum() / num_masks
