"""A photo of its own aspect ratio through a dense model: sized as transformers' image processors size it (their PIL
backends: EomtImageProcessorPil, DPTImageProcessorPil), and the answer back at the photo's size as their
post-processing gives it, on the same outputs. The processors' numbers are the reference; nothing here compares
vitlab with itself."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.dense.inference import (
    Depth,
    Segmentation,
    depth_answer,
    model_inputs,
    predict_dense,
    segmentation_answer,
)
from vitlab.head_configs import DPTConfig, EoMTConfig, LinearSegmentationConfig
from vitlab.models import create_model

pytest.importorskip("transformers")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def eomt_config(**changes) -> ViTConfig:
    fields = dict(
        image_size=32,
        patch_size=8,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_dim=32,
        num_classes=3,
        head=EoMTConfig(queries=5, blocks=1, upscale_blocks=1),
        class_names=["sky", "road", "car"],
        image_mean=MEAN,
        image_std=STD,
    )
    return ViTConfig(**{**fields, **changes})


def dpt_config(**changes) -> ViTConfig:
    fields = dict(
        image_size=28,
        patch_size=14,
        embed_dim=16,
        depth=4,
        num_heads=2,
        mlp_dim=32,
        num_classes=0,
        head=DPTConfig(layers=(0, 1, 2, 3), neck_sizes=(8, 8, 8, 8), fusion_dim=8, head_dim=8),
        image_mean=MEAN,
        image_std=STD,
    )
    return ViTConfig(**{**fields, **changes})


def photo(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """A smooth non-square photo (uint8 (3, H, W)): resizing it is well conditioned, unlike noise."""
    rows = np.linspace(0, 1, height)[:, None]
    cols = np.linspace(0, 1, width)[None, :]
    rng = np.random.default_rng(seed)
    channels = [np.sin(3 * rows + 2 * cols + phase) * 0.5 + 0.5 for phase in rng.uniform(0, 3, 3)]
    return torch.from_numpy((np.stack(channels) * 255).round().astype(np.uint8))


def eomt_processor(side: int, **options):
    from transformers.models.eomt.image_processing_pil_eomt import EomtImageProcessorPil

    return EomtImageProcessorPil(image_mean=list(MEAN), image_std=list(STD), **options)


@pytest.mark.parametrize("size", [(45, 70), (70, 45)])
def test_eomt_padded_input_and_panoptic_answer_equal_the_processors(size):
    config = eomt_config()
    pixels = photo(*size)
    processor = eomt_processor(32, size={"shortest_edge": 32, "longest_edge": 32}, do_pad=True)
    expected = processor(pixels.permute(1, 2, 0).numpy(), return_tensors="pt")["pixel_values"]
    images, view = model_inputs(pixels, config)
    torch.testing.assert_close(images, expected.float(), atol=1e-5, rtol=0)
    assert view.padded == (32, 32) and max(view.resized) == 32

    generator = torch.Generator().manual_seed(1)
    class_logits = 4 * torch.randn(1, 5, 4, generator=generator)
    mask_logits = 3 * torch.randn(1, 5, 8, 8, generator=generator)
    outputs = types.SimpleNamespace(class_queries_logits=class_logits, masks_queries_logits=mask_logits)
    reference = processor.post_process_panoptic_segmentation(outputs, target_sizes=[size], threshold=0.3)[0]
    answer = segmentation_answer(class_logits, mask_logits, view, threshold=0.3)
    assert isinstance(answer, Segmentation) and answer.panoptic is not None
    assert reference["segments_info"], "the test needs at least one segment"
    torch.testing.assert_close(answer.panoptic.segmentation, reference["segmentation"].long())
    assert answer.panoptic.segments == reference["segments_info"]
    assert answer.labels.shape == size and answer.scores.shape == (3, *size)


def test_eomt_crops_and_their_semantic_merge_equal_the_processors():
    config = eomt_config(head=EoMTConfig(queries=5, blocks=1, upscale_blocks=1, crops=True))
    size = (40, 90)  # short side to 32: 32 x 72, three crops of 32 along the width
    pixels = photo(*size, seed=2)
    processor = eomt_processor(32, size={"shortest_edge": 32}, do_split_image=True)
    encoded = processor(pixels.permute(1, 2, 0).numpy(), return_tensors="pt")
    images, view = model_inputs(pixels, config)
    assert len(view.spans) == 3
    torch.testing.assert_close(images, torch.stack(list(encoded["pixel_values"])).float(), atol=1e-5, rtol=0)

    generator = torch.Generator().manual_seed(3)
    class_logits = 2 * torch.randn(3, 5, 4, generator=generator)
    mask_logits = 2 * torch.randn(3, 5, 8, 8, generator=generator)
    outputs = types.SimpleNamespace(
        class_queries_logits=class_logits, masks_queries_logits=mask_logits, patch_offsets=encoded["patch_offsets"]
    )
    reference = processor.post_process_semantic_segmentation(
        outputs, target_sizes=[size], return_segmentation_scores=True
    )[0]
    answer = segmentation_answer(class_logits, mask_logits, view)
    torch.testing.assert_close(answer.scores, reference["segmentation_scores"], atol=1e-5, rtol=1e-5)
    assert torch.equal(answer.labels, reference["segmentation"])
    assert answer.panoptic is None


@pytest.mark.parametrize("size", [(50, 90), (97, 33)])
def test_depth_anything_keep_aspect_input_and_depth_equal_the_processors(size):
    from PIL import Image
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil

    config = dpt_config()
    pixels = photo(*size, seed=4)
    processor = DPTImageProcessorPil(
        size={"height": 28, "width": 28},
        keep_aspect_ratio=True,
        ensure_multiple_of=14,
        resample=Image.Resampling.BICUBIC,
        image_mean=list(MEAN),
        image_std=list(STD),
        do_pad=False,
    )
    expected = processor(pixels.permute(1, 2, 0).numpy(), return_tensors="pt")["pixel_values"]
    images, view = model_inputs(pixels, config)
    assert images.shape == expected.shape
    torch.testing.assert_close(images, expected.float(), atol=1e-5, rtol=0)

    predicted = torch.rand(1, *view.resized, generator=torch.Generator().manual_seed(5))
    outputs = types.SimpleNamespace(predicted_depth=predicted)
    reference = processor.post_process_depth_estimation(outputs, target_sizes=[size])[0]["predicted_depth"]
    answer = depth_answer(predicted, view, "relative")
    torch.testing.assert_close(answer.depth, reference, atol=1e-6, rtol=0)


def test_a_non_square_photo_comes_back_at_its_own_size_from_both_models():
    torch.manual_seed(0)
    pixels = photo(45, 70)
    segmentation = predict_dense(create_model(eomt_config()).eval(), pixels)
    depth = predict_dense(create_model(dpt_config()).eval(), pixels)
    assert isinstance(segmentation, Segmentation) and segmentation.labels.shape == (45, 70)
    assert int(segmentation.labels.max()) < 3
    assert isinstance(depth, Depth) and depth.depth.shape == (45, 70) and depth.kind == "relative"


def test_a_linear_segmenter_reads_the_photo_at_its_aspect_ratio_and_answers_at_its_size():
    import torch.nn.functional as F

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_dim=32,
        num_classes=3,
        head=LinearSegmentationConfig(),
    )
    torch.manual_seed(0)
    model = create_model(config).eval()
    pixels = photo(45, 70)
    answer = predict_dense(model, pixels)
    images, view = model_inputs(pixels, config)
    assert view.resized == (32, 48)  # shorter side 32, the longer one whole patches of 8
    with torch.no_grad():
        logits = F.interpolate(model(images), size=(45, 70), mode="bilinear", align_corners=False)[0]
    assert isinstance(answer, Segmentation) and answer.panoptic is None
    assert torch.equal(answer.labels, logits.argmax(0))


def test_per_pixel_maps_are_eomts_class_scores_and_a_heads_logits_at_the_size_asked():
    from vitlab.dense.inference import pixel_maps, predicted_labels
    from vitlab.dense.segmentation_maps import semantic_scores
    from vitlab.errors import UsageError
    from vitlab.models.eomt import SegmentationOutput

    torch.manual_seed(0)
    class_logits, mask_logits = torch.randn(2, 5, 4), torch.randn(2, 5, 8, 8)
    output = SegmentationOutput(class_logits, mask_logits)
    torch.testing.assert_close(
        pixel_maps("eomt", output, (16, 24)), semantic_scores(class_logits, mask_logits, (16, 24))
    )
    logits = torch.randn(2, 3, 16, 16)
    assert pixel_maps("linear", logits, (16, 16)) is logits  # at its own size: the logits themselves
    assert pixel_maps("upsampling", logits, (8, 8)).shape == (2, 3, 8, 8)
    assert torch.equal(predicted_labels("linear", logits, (16, 16)), logits.argmax(1))
    assert pixel_maps("dpt", torch.rand(2, 16, 16), (16, 16)).shape == (2, 1, 16, 16)
    with pytest.raises(UsageError, match="no per-pixel maps"):
        pixel_maps("none", logits, (16, 16))
