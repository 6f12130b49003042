"""EoMT's outputs as segmentation maps: per-class scores and a class per pixel (semantic), or segments with ids
(panoptic), as transformers' `EomtImageProcessor.post_process_semantic_segmentation` and
`post_process_panoptic_segmentation` give them (tests/dense/test_segmentation_maps.py compares them).

A prediction is class_logits (B, Q, K + 1) (the last column "no object") and mask_logits (B, Q, h, w) at 1/4 of the
input's pixels (or whatever EoMT's upscale blocks give). The masks are first upsampled to the model's input size,
then scored or cut into segments, then resized to the size asked for, as the processor does; where the processor
resized, padded or split the image before the model saw it, the functions below undo that the same way:
- split (semantic ADE20K/Cityscapes models: `do_split_image`): the image, resized so its short side is the crop
  size, is cut into square crops along its long side (`crop_spans`); each crop's class scores are averaged where
  crops overlap and resized to the image (`merge_crops`).
- padded (panoptic COCO models: `do_pad`): the resized image sits at the top left of the input; `panoptic_segments`
  takes that region (`valid_size`) before resizing to the image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.errors import UsageError


class PanopticResult(NamedTuple):
    segmentation: Tensor  # (H, W) int64: the segment id of each pixel, -1 where no segment holds it
    segments: list[dict]  # one per segment id, in id order: {"id": int, "label_id": int, "score": float}


def semantic_scores(
    class_logits: Tensor, mask_logits: Tensor, size: tuple[int, int], input_size: tuple[int, int] | None = None
) -> Tensor:
    """class_logits (B, Q, K + 1), mask_logits (B, Q, h, w) -> per-class scores (B, K, H, W) at size = (H, W).

    The score of class c at a pixel is sum over queries of p(c | query) * sigmoid(mask logit): masks upsampled
    bilinearly to input_size (the model's input, default `size`), scored, then resized to `size`."""
    masks = F.interpolate(mask_logits, size=input_size or size, mode="bilinear", align_corners=False)
    class_probs = class_logits.softmax(-1)[..., :-1]  # "no object" claims no pixel
    scores = torch.einsum("bqc, bqhw -> bchw", class_probs, masks.sigmoid())
    return F.interpolate(scores, size=size, mode="bilinear", align_corners=False)


def semantic_map(
    class_logits: Tensor, mask_logits: Tensor, size: tuple[int, int], input_size: tuple[int, int] | None = None
) -> Tensor:
    """class_logits (B, Q, K + 1), mask_logits (B, Q, h, w) -> the class of each pixel, (B, H, W) int64: the argmax
    of `semantic_scores`."""
    return semantic_scores(class_logits, mask_logits, size, input_size).argmax(1)


def resized_size(image_size: tuple[int, int], shortest_edge: int, longest_edge: int | None = None) -> tuple[int, int]:
    """The (height, width) the EoMT processor resizes an image of image_size to: short side `shortest_edge`, the
    aspect ratio kept (the long side truncated to an int), unless the long side would pass `longest_edge`: then
    the long side is longest_edge and the short side follows (rounded)."""
    height, width = image_size
    short, long = min(height, width), max(height, width)
    scale_short = float(shortest_edge)
    if longest_edge is not None and long / short * shortest_edge > longest_edge:
        scale_short = longest_edge * short / long
    target_short = int(round(scale_short))
    if short == target_short:
        return height, width
    target_long = int(scale_short * long / short)
    return (target_long, target_short) if width < height else (target_short, target_long)


def crop_spans(image_size: tuple[int, int], crop_size: int) -> list[tuple[int, int]]:
    """(start, end) of each square crop along the long side of an image of image_size (already resized so its
    short side is crop_size), as the processor splits it: as few crops as cover the side, overlapping evenly,
    the first flush with the start and the last with the end. Along the height when height > width."""
    long_side = max(image_size)
    count = math.ceil(long_side / crop_size)
    overlap = (count * crop_size - long_side) / (count - 1) if count > 1 else 0
    return [(int(i * (crop_size - overlap)), int(i * (crop_size - overlap)) + crop_size) for i in range(count)]


def merge_crops(
    crop_scores: Tensor, spans: Sequence[tuple[int, int]], image_size: tuple[int, int], size: tuple[int, int]
) -> Tensor:
    """One image's crops back together: crop_scores (N, K, c, c) (`semantic_scores` of each crop at (c, c)), spans
    the crops' (start, end) from `crop_spans(image_size, c)` -> (K, H, W) at size: the crops' scores averaged
    where they overlap on the resized image (image_size), then resized bilinearly to size (the original image)."""
    if len(spans) != crop_scores.shape[0]:
        raise UsageError(f"{crop_scores.shape[0]} crops' scores for {len(spans)} spans; give one span per crop")
    height, width = image_size
    along_height = height > width
    total = crop_scores.new_zeros(crop_scores.shape[1], height, width)
    count = crop_scores.new_zeros(1, height, width)
    for scores, (start, end) in zip(crop_scores, spans):
        region = (
            (slice(None), slice(start, end), slice(None))
            if along_height
            else (slice(None), slice(None), slice(start, end))
        )
        total[region] += scores
        count[region] += 1
    averaged = total / count.clamp(min=1)
    return F.interpolate(averaged[None], size=size, mode="bilinear", align_corners=False)[0]


def panoptic_segments(
    class_logits: Tensor,
    mask_logits: Tensor,
    size: tuple[int, int],
    threshold: float = 0.8,
    mask_threshold: float = 0.5,
    overlap_threshold: float = 0.8,
    fuse_labels: Sequence[int] = (),
    input_size: tuple[int, int] | None = None,
    valid_size: tuple[int, int] | None = None,
) -> list[PanopticResult]:
    """class_logits (B, Q, K + 1), mask_logits (B, Q, h, w) -> one PanopticResult per image, its map at size.

    Masks are upsampled to input_size (the model's input, default `size`), their top-left valid_size (the image
    inside a padded input; default all of it) kept and resized to `size`. A query is a candidate when its most
    probable class is not "no object" and has probability > threshold. Each pixel goes to the candidate of highest
    probability * sigmoid(mask); a candidate becomes a segment when it wins some pixels whose mask >= mask_threshold
    and the pixels it wins are more than overlap_threshold of its mask's area. Segments of a label in fuse_labels
    ("stuff") merge into one segment per label; ids count from 0 in query order."""
    num_classes = class_logits.shape[-1] - 1
    masks = F.interpolate(mask_logits, size=input_size or size, mode="bilinear", align_corners=False)
    if valid_size is not None:
        masks = masks[..., : valid_size[0], : valid_size[1]]
    masks = F.interpolate(masks, size=size, mode="bilinear", align_corners=False)
    scores, labels = class_logits.softmax(-1).max(-1)  # (B, Q) each
    fused = set(fuse_labels)
    results = []
    for image_masks, image_scores, image_labels in zip(masks, scores, labels):
        keep = (image_labels != num_classes) & (image_scores > threshold)
        probs, kept_scores, kept_labels = image_masks[keep].sigmoid(), image_scores[keep], image_labels[keep]
        segmentation = torch.full(size, -1, dtype=torch.int64, device=mask_logits.device)
        segments: list[dict] = []
        if len(kept_labels) == 0:
            results.append(PanopticResult(segmentation, segments))
            continue
        owner = (kept_scores[:, None, None] * probs).argmax(0)  # (H, W): the candidate each pixel goes to
        fused_ids: dict[int, int] = {}
        for k, label in enumerate(kept_labels.tolist()):
            won = owner == k
            inside = probs[k] >= mask_threshold
            segment = won & inside
            won_area, inside_area = won.sum(), inside.sum()
            if won_area == 0 or inside_area == 0 or segment.sum() == 0:
                continue
            if not (won_area / inside_area).item() > overlap_threshold:  # mostly covered by other segments
                continue
            if label in fused_ids:
                segmentation[segment] = fused_ids[label]
                continue
            segment_id = len(segments)
            if label in fused:
                fused_ids[label] = segment_id
            segmentation[segment] = segment_id
            segments.append({"id": segment_id, "label_id": label, "score": round(kept_scores[k].item(), 6)})
        results.append(PanopticResult(segmentation, segments))
    return results
