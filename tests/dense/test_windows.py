"""dense/windows.py: windows on the patch grid, stitched; one window that holds the image is the single pass."""

import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.dense.features import dense_features
from vitlab.dense.windows import sliding_window_features, window_starts
from vitlab.errors import UsageError
from vitlab.models import create_model

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=0)


def randomised(**fields):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**{**TINY, **fields}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


@pytest.mark.parametrize(
    "length, window, stride, starts",
    [(10, 4, 3, [0, 3, 6]), (10, 4, 4, [0, 4, 6]), (4, 8, 2, [0]), (12, 12, 5, [0]), (96, 32, 21, [0, 21, 42, 63, 64])],
)
def test_windows_start_as_mmsegmentations_slide_the_last_flush_with_the_end(length, window, stride, starts):
    assert window_starts(length, window, stride) == starts


@pytest.mark.parametrize("fields", [dict(pos_embed="rope"), dict()])
def test_one_window_that_holds_the_image_is_the_single_pass(fields):
    model = randomised(**fields)
    image = torch.randn(1, 3, 16, 16)  # the model's own size: a learned table takes it without dynamic_size
    stitched = sliding_window_features(model, image, window=32, stride=8, layers="last2")
    assert torch.equal(stitched, dense_features(model, image, "last2").concatenated())


def test_overlapping_windows_average_what_each_says_of_a_patch():
    model = randomised(pos_embed="rope")
    image = torch.randn(1, 3, 16, 24)  # a grid of 4 x 6 patches; windows of 4 x 4 patches, 2 apart: at 0 and 2
    stitched = sliding_window_features(model, image, window=16, stride=8, batch_size=1)
    left = dense_features(model, image[..., :16]).concatenated()[0]
    right = dense_features(model, image[..., 8:]).concatenated()[0]
    assert stitched.shape == (1, 32, 4, 6)
    torch.testing.assert_close(stitched[0, :, :, :2], left[:, :, :2], rtol=0, atol=0)  # one window only
    torch.testing.assert_close(stitched[0, :, :, 4:], right[:, :, 2:], rtol=0, atol=0)
    torch.testing.assert_close(stitched[0, :, :, 2:4], (left[:, :, 2:] + right[:, :, :2]) / 2, rtol=1e-6, atol=1e-6)


def test_a_size_that_is_not_whole_patches_is_named():
    model = randomised(pos_embed="rope")
    with pytest.raises(UsageError, match="window width 10 is not a positive multiple of the patch size 4"):
        sliding_window_features(model, torch.randn(1, 3, 16, 16), window=(8, 10), stride=4)
    with pytest.raises(UsageError, match="one image"):
        sliding_window_features(model, torch.randn(2, 3, 16, 16), window=8, stride=4)


def test_a_stride_past_the_window_is_refused_not_left_empty():
    model = randomised(pos_embed="rope")
    with pytest.raises(UsageError, match="leaves patches no window covers"):
        sliding_window_features(model, torch.randn(1, 3, 32, 32), window=8, stride=16)
