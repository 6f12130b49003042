"""dense/segmentation_maps.py: EoMT's outputs as maps, equal to what transformers' EomtImageProcessor makes of the
same logits (its post-processing is the same in the torchvision and PIL processors; the PIL one needs no
torchvision), including an image split into crops and merged back, and a padded image cut out again."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vitlab.dense.segmentation_maps import (
    crop_spans,
    merge_crops,
    panoptic_segments,
    resized_size,
    semantic_map,
    semantic_scores,
)
from vitlab.errors import UsageError

NUM_CLASSES = 4


def processor(**settings):
    from transformers import EomtImageProcessorPil

    return EomtImageProcessorPil(**settings)


def model_output(class_logits, mask_logits, patch_offsets=None):
    return SimpleNamespace(
        class_queries_logits=class_logits, masks_queries_logits=mask_logits, patch_offsets=patch_offsets
    )


def random_logits(batch_size, queries, grid, seed):
    generator = torch.Generator().manual_seed(seed)
    class_logits = torch.randn(batch_size, queries, NUM_CLASSES + 1, generator=generator)
    mask_logits = 4 * torch.randn(batch_size, queries, grid, grid, generator=generator)
    return class_logits, mask_logits


@pytest.mark.parametrize("size", [(32, 32), (20, 28), (45, 17)])
def test_semantic_scores_and_map_equal_the_processors(size):
    class_logits, mask_logits = random_logits(2, 6, 8, seed=0)
    expected = processor(size={"shortest_edge": 32, "longest_edge": None}).post_process_semantic_segmentation(
        model_output(class_logits, mask_logits), target_sizes=[size, size], return_segmentation_scores=True
    )

    scores = semantic_scores(class_logits, mask_logits, size, input_size=(32, 32))
    labels = semantic_map(class_logits, mask_logits, size, input_size=(32, 32))

    assert scores.shape == (2, NUM_CLASSES, *size) and labels.shape == (2, *size) and labels.dtype == torch.int64
    for i in range(2):
        torch.testing.assert_close(scores[i], expected[i].segmentation_scores, rtol=1e-6, atol=1e-7)
        assert torch.equal(labels[i], expected[i].segmentation)


def test_resized_size_is_the_processors_resize_rule():
    from transformers.image_transforms import get_size_with_aspect_ratio

    for height in range(5, 60, 3):
        for width in range(5, 60, 4):
            for shortest, longest in [(16, None), (32, 32), (24, 40), (20, 21)]:
                expected = get_size_with_aspect_ratio((height, width), shortest, longest)
                assert resized_size((height, width), shortest, longest) == tuple(expected), (height, width)


def test_crops_split_as_the_processor_splits_and_merge_back_to_its_semantic_map():
    """The processor splits each resized image into 16-pixel crops along the long side; crop_spans gives the same
    spans, and merge_crops of each crop's semantic_scores gives the processor's merged scores and map."""
    crop = 16
    image_sizes = [(24, 40), (50, 20), (16, 16)]
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (*size, 3), dtype=np.uint8) for size in image_sizes]
    split = processor(size={"shortest_edge": crop, "longest_edge": None}, do_split_image=True)
    offsets = [tuple(offset.tolist()) for offset in split(images=images, return_tensors="pt")["patch_offsets"]]

    spans = [crop_spans(resized_size(size, crop), crop) for size in image_sizes]
    assert offsets == [(index, *span) for index, image_spans in enumerate(spans) for span in image_spans]
    assert spans[0] == [(0, 16), (10, 26)] and spans[1] == [(0, 16), (12, 28), (24, 40)]

    class_logits, mask_logits = random_logits(len(offsets), 5, 4, seed=1)
    expected = split.post_process_semantic_segmentation(
        model_output(class_logits, mask_logits, patch_offsets=offsets),
        target_sizes=image_sizes,
        return_segmentation_scores=True,
    )
    crop_scores = semantic_scores(class_logits, mask_logits, (crop, crop))  # (crops, K, 16, 16)
    first = 0
    for index, size in enumerate(image_sizes):
        count = len(spans[index])
        merged = merge_crops(crop_scores[first : first + count], spans[index], resized_size(size, crop), size)
        first += count
        assert merged.shape == (NUM_CLASSES, *size)
        torch.testing.assert_close(merged, expected[index].segmentation_scores, rtol=1e-6, atol=1e-7)
        assert torch.equal(merged.argmax(0), expected[index].segmentation)

    with pytest.raises(UsageError, match="2 crops' scores for 3 spans"):
        merge_crops(crop_scores[:2], spans[1], (40, 16), (50, 20))


def confident_logits(batch_size, queries, grid, seed):
    """Logits where some queries are sure of a class, some sure of "no object" and some unsure, and masks are
    blobs of mixed size that overlap, so every rule of the panoptic post-processing decides something."""
    generator = torch.Generator().manual_seed(seed)
    class_logits = torch.randn(batch_size, queries, NUM_CLASSES + 1, generator=generator)
    sure = torch.randint(0, NUM_CLASSES + 1, (batch_size, queries), generator=generator)
    confident = torch.rand(batch_size, queries, generator=generator) < 0.75
    class_logits.scatter_add_(-1, sure[..., None], 6.0 * confident[..., None].float())
    rows = torch.arange(grid).float()
    centres = torch.rand(batch_size, queries, 2, generator=generator) * grid
    radii = 1 + torch.rand(batch_size, queries, generator=generator) * grid / 2
    distance = (rows[:, None] - centres[..., 0, None, None]) ** 2 + (rows[None, :] - centres[..., 1, None, None]) ** 2
    mask_logits = 2.0 * (radii[..., None, None] - distance.sqrt())
    mask_logits += torch.randn(batch_size, queries, grid, grid, generator=generator)
    return class_logits, mask_logits


def as_processor_result(result):
    return {"segmentation": result.segmentation, "segments_info": result.segments}


@pytest.mark.parametrize("fuse_labels", [(), (0, 2)])
def test_panoptic_segments_equal_the_processors_on_a_padded_non_square_image(fuse_labels):
    """A 20x28 image resized to fit 32x32 (23x32) and padded at the bottom: the valid region is cut out again."""
    class_logits, mask_logits = confident_logits(4, 12, 8, seed=2)
    size = (20, 28)
    pad = processor(size={"shortest_edge": 32, "longest_edge": 32}, do_pad=True)
    expected = pad.post_process_panoptic_segmentation(
        model_output(class_logits, mask_logits), target_sizes=[size] * 4, stuff_classes=list(fuse_labels) or None
    )

    valid = resized_size(size, 32, 32)
    assert valid == (23, 32)
    results = panoptic_segments(
        class_logits, mask_logits, size, fuse_labels=fuse_labels, input_size=(32, 32), valid_size=valid
    )

    scores, labels = class_logits.softmax(-1).max(-1)
    candidates = (labels != NUM_CLASSES) & (scores > 0.8)  # (B, Q): the queries past the score threshold
    dropped = 0
    assert len(results) == len(expected) == 4
    for result, reference, image_candidates in zip(results, expected, candidates, strict=True):
        assert result.segmentation.dtype == torch.int64 and result.segmentation.shape == size
        assert torch.equal(result.segmentation, reference["segmentation"].long())
        assert result.segments == reference["segments_info"]
        dropped += int(image_candidates.sum()) - len(result.segments)
    assert dropped > 0  # candidates left out by the mask and overlap thresholds (or fused), not only by score
    assert sum(len(result.segments) for result in results) >= 4


@pytest.mark.parametrize(
    "settings, fewer",
    [
        (dict(threshold=0.999), True),  # fewer queries are sure enough
        (dict(overlap_threshold=0.95), True),  # fewer masks keep enough of their area
        (dict(mask_threshold=0.9), False),
    ],
)
def test_panoptic_thresholds_drop_segments_as_the_processor_does(settings, fewer):
    class_logits, mask_logits = confident_logits(3, 10, 8, seed=6)
    named = {"overlap_mask_area_threshold" if name == "overlap_threshold" else name: v for name, v in settings.items()}
    expected = processor(size={"shortest_edge": 16, "longest_edge": None}).post_process_panoptic_segmentation(
        model_output(class_logits, mask_logits), target_sizes=[(16, 16)] * 3, **named
    )
    results = panoptic_segments(class_logits, mask_logits, (16, 16), **settings)
    assert len(results) == len(expected) == 3  # one answer per image: zip alone would stop at a short list
    for result, reference in zip(results, expected, strict=True):
        assert torch.equal(result.segmentation, reference["segmentation"].long())
        assert result.segments == reference["segments_info"]
    assert any(reference["segments_info"] for reference in expected)  # not only empty lists compared
    default = panoptic_segments(class_logits, mask_logits, (16, 16))
    if fewer:
        assert sum(len(r.segments) for r in results) < sum(len(r.segments) for r in default)


def test_no_confident_query_leaves_every_pixel_unassigned():
    class_logits, mask_logits = random_logits(1, 5, 4, seed=4)
    class_logits[..., -1] += 10  # every query says "no object"
    expected = processor().post_process_panoptic_segmentation(
        model_output(class_logits, mask_logits), target_sizes=[(12, 9)], size={"shortest_edge": 12, "longest_edge": 12}
    )
    (result,) = panoptic_segments(class_logits, mask_logits, (12, 9), input_size=(12, 12), valid_size=(12, 9))
    assert result.segments == [] == expected[0]["segments_info"]
    assert torch.equal(result.segmentation, expected[0]["segmentation"].long())
    assert (result.segmentation == -1).all()
