"""dense/depth_probe.py: the depth head's input is each block's patches with its class token, the head reads a
distribution over depth bins, the losses are scale-invariant and compare neighbouring pixels of one image only, and
the probe learns a depth its features say linearly, choosing its learning rate on validation RMSE."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from vitlab.config import ViTConfig
from vitlab.data.scene_depth import MAX_DEPTH, WALL_DEPTH, scene_depths
from vitlab.data.scenes import make_scenes
from vitlab.dense.depth_probe import (
    LinearDepthHead,
    depth_head_input,
    depth_scores,
    gradient_loss,
    predicted_depths,
    sig_loss,
    train_depth_probe,
)
from vitlab.dense.features import dense_features
from vitlab.errors import UsageError
from vitlab.models import create_model

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=4, num_heads=4, mlp_dim=64, num_classes=0)


def tiny_model(**fields):
    torch.manual_seed(0)
    return create_model(ViTConfig(**{**TINY, **fields})).eval()


def patch_depth_data(count: int, seed: int):
    """Features (N, 6, 4, 4) whose first channel z in [-1, 1] says each patch's depth 5 + 3z metres, plus noise;
    depths (N, 16, 16): the patch depths bilinearly upsampled x4 (what a linear head's upsampled output can be), the
    first pixel row 0 (no measurement)."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.rand(count, 4, 4, generator=generator) * 2 - 1
    features = torch.randn(count, 6, 4, 4, generator=generator) * 0.3
    features[:, 0] = z
    depths = F.interpolate((5 + 3 * z)[:, None], scale_factor=4, mode="bilinear", align_corners=False)[:, 0]
    depths[:, 0] = 0
    return features, depths


def test_the_probe_learns_a_linearly_decodable_depth_and_keeps_the_best_validation_rate():
    train_features, train_depths = patch_depth_data(96, 0)
    validation_features, validation_depths = patch_depth_data(32, 1)
    result = train_depth_probe(
        train_features,
        train_depths,
        validation_features,
        validation_depths,
        min_depth=1e-3,
        max_depth=10.0,
        learning_rates=(1e-5, 3e-2),
        epochs=8,
        batch_size=16,
    )
    assert set(result.tried) == {1e-5, 3e-2} and result.learning_rate == min(result.tried, key=result.tried.get)
    assert result.learning_rate == 3e-2
    # The patch depths spread by 3 / sqrt(3) = 1.7 m (5 + 3z, z uniform): the probe gets within a small fraction.
    assert result.validation.rmse < 0.25 and result.validation.delta1 > 0.98 and result.tried[1e-5] > 1.0
    assert result.validation.pixels == 32 * 15 * 16 and result.validation.images == 32
    test_features, test_depths = patch_depth_data(32, 2)
    assert depth_scores(result.head, test_features, test_depths).rmse < 0.25
    predicted = predicted_depths(result.head, test_features, (16, 16))
    assert predicted.shape == (32, 16, 16) and predicted.dtype == torch.float32


def test_the_head_is_a_distribution_over_uniform_bins_upsampled_four_times():
    torch.manual_seed(0)
    head = LinearDepthHead(6, min_depth=1.0, max_depth=9.0, bins=5).eval()
    assert head.bin_depths.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    features = torch.randn(2, 6, 3, 5)
    depths = head(features)
    assert depths.shape == (2, 12, 20)
    assert (depths >= 1.0).all() and (depths <= 9.0).all()
    # By hand at the patch grid (upsample 1): relu(logits) + 0.1, normalised, times the bin depths.
    flat = LinearDepthHead(6, 1.0, 9.0, bins=5, upsample=1).eval()
    flat.load_state_dict(head.state_dict())
    logits = flat.classifier(flat.norm(features))
    weights = torch.relu(logits) + 0.1
    expected = (weights / weights.sum(1, keepdim=True) * flat.bin_depths[:, None, None]).sum(1)
    torch.testing.assert_close(flat(features), expected)
    assert head(features, (7, 9)).shape == (2, 7, 9)


def test_depth_head_input_puts_each_blocks_class_token_beside_its_patches():
    model = tiny_model(register_tokens=2)
    images = torch.randn(2, 3, 16, 16)
    features = dense_features(model, images, "last4", prefix_tokens=True)
    stacked = depth_head_input(features)
    assert stacked.shape == (2, 4 * 2 * 32, 4, 4)  # "linear4": blocks * 2 * D channels
    for block in range(4):
        grid, prefix = features.grids[block], features.prefix[block]
        torch.testing.assert_close(stacked[:, 64 * block : 64 * block + 32], grid)
        class_part = stacked[:, 64 * block + 32 : 64 * (block + 1)]
        torch.testing.assert_close(class_part, prefix[:, 0, :, None, None].expand(2, 32, 4, 4))  # not a register
    last = depth_head_input(dense_features(model, images, "last", prefix_tokens=True))  # "linear"
    assert last.shape == (2, 64, 4, 4)
    head = LinearDepthHead(64, 1e-3, 10.0).eval()
    assert head(last, (16, 16)).shape == (2, 16, 16)


def test_depth_head_input_without_class_tokens_says_how_to_get_them():
    model = tiny_model()
    with pytest.raises(UsageError, match="prefix_tokens=True"):
        depth_head_input(dense_features(model, torch.randn(1, 3, 16, 16), "last4"))
    no_class = tiny_model(classifier="gap", class_token=False)
    with pytest.raises(UsageError, match="class token"):
        depth_head_input(dense_features(no_class, torch.randn(1, 3, 16, 16), "last", prefix_tokens=True))


def test_sig_loss_is_scale_invariant_up_to_its_mean_term_and_ignores_invalid_pixels():
    generator = torch.Generator().manual_seed(0)
    truth = torch.rand(2, 6, 6, generator=generator) * 8 + 1
    truth[:, 0] = 0  # no measurement
    valid = truth > 0
    predicted = truth * 2
    predicted[:, 0] = 123.0  # wild where nothing was measured: must not count
    # g = ln 2 at every valid pixel (up to the 1e-3 inside the logs): Var g = 0, so the loss is sqrt(0.15) ln 2.
    assert float(sig_loss(predicted, truth, valid)) == pytest.approx(math.sqrt(0.15) * math.log(2), rel=1e-3)
    noisy = truth * torch.exp(torch.randn(truth.shape, generator=generator) * 0.1)
    g = (noisy[valid] + 1e-3).log() - (truth[valid] + 1e-3).log()
    expected = math.sqrt(float(g.var() + 0.15 * g.mean() ** 2))  # unbiased variance, as torch.var and DINOv2
    assert float(sig_loss(noisy, truth, valid)) == pytest.approx(expected, rel=1e-5)
    assert float(sig_loss(noisy, truth, torch.zeros_like(valid))) == 0.0


def test_gradient_loss_compares_pixels_two_apart_within_each_image():
    # One row of three pixels, truth 1 m, prediction 2 m at the first: g = (ln 2.001 - ln 1.001, 0, 0). Across:
    # |g0 - g2| over the 3 valid pixels; nothing down (one row); the strided copies have fewer than 3 columns.
    truth = torch.ones(1, 1, 3)
    predicted = torch.tensor([[[2.0, 1.0, 1.0]]])
    g0 = math.log(2.001) - math.log(1.001)
    valid = truth > 0
    assert float(gradient_loss(predicted, truth, valid)) == pytest.approx(g0 / 3)
    assert float(gradient_loss(predicted.transpose(1, 2), truth.transpose(1, 2), valid.transpose(1, 2))) == (
        pytest.approx(g0 / 3)
    )
    # Each image of a batch off by its own factor: no gradient within any image, so no loss (images of a batch are
    # not compared with each other).
    truth = torch.rand(3, 8, 8) * 5 + 2
    factors = torch.tensor([0.5, 1.0, 3.0])[:, None, None]
    assert float(gradient_loss(truth * factors, truth, truth > 0)) == pytest.approx(0, abs=1e-3)
    # An invalid pixel breaks the pairs through it.
    truth, predicted = torch.tensor([[[1.0, 0.0, 1.0]]]), torch.tensor([[[2.0, 5.0, 1.0]]])
    assert float(gradient_loss(predicted, truth, truth > 0)) == pytest.approx(g0 / 2)


def test_the_probe_refuses_features_and_depths_that_do_not_match():
    features, depths = patch_depth_data(4, 0)
    with pytest.raises(UsageError, match="same images"):
        train_depth_probe(features, depths[:3], features, depths, 1e-3, 10.0, learning_rates=(1e-3,), epochs=1)
    with pytest.raises(UsageError, match="as floats"):
        train_depth_probe(features, depths.long(), features, depths, 1e-3, 10.0, learning_rates=(1e-3,), epochs=1)


def test_the_probe_runs_on_scene_depths_from_a_tiny_models_features():
    digits = np.zeros((4, 28, 28), np.uint8)
    for index in range(4):
        digits[index, 4 + index : 20, 8 : 22 - index] = 255  # blocks that leave an anti-aliased rim when resized
    scenes = make_scenes(digits, np.arange(4), 24, seed=0, canvas_size=16)
    depths = scene_depths(scenes)  # 4-10 px digits: 24 / size = 2.4-6 m, the wall at 8 m
    pixels = (scenes.images.float() / 255).expand(-1, 3, -1, -1)
    features = depth_head_input(dense_features(tiny_model(), pixels, "last4", prefix_tokens=True))
    assert features.shape == (24, 4 * 2 * 32, 4, 4)
    result = train_depth_probe(
        features[:16], depths[:16], features[16:], depths[16:], 1e-3, MAX_DEPTH, (1e-3, 1e-2), epochs=2
    )
    assert result.validation.images == 8 and 0 < result.validation.rmse < MAX_DEPTH
    assert result.validation.pixels == int(((depths[16:] > 0) & (depths[16:] <= WALL_DEPTH)).sum())
