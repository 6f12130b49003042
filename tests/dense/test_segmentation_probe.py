"""dense/segmentation_probe.py: the linear head learns what its features say, chooses its learning rate on the
validation split, and scores with the ignore label left out."""

import torch

from vitlab.dense.segmentation_probe import LinearSegmentationHead, segmentation_scores, train_segmentation_probe


def patch_classes_data(count: int, seed: int):
    """Features (N, 6, 4, 4) holding a one-hot of each patch's class (3 classes) plus noise, and masks (N, 16, 16):
    each patch's class on its 4 x 4 pixels, the first pixel row ignored (255)."""
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, 3, (count, 4, 4), generator=generator)
    features = torch.randn(count, 6, 4, 4, generator=generator) * 0.3
    features[:, :3] += torch.nn.functional.one_hot(classes, 3).permute(0, 3, 1, 2).float() * 2
    masks = classes.repeat_interleave(4, dim=1).repeat_interleave(4, dim=2).to(torch.uint8)
    masks[:, 0] = 255
    return features, masks


def test_the_probe_learns_linearly_decodable_classes_and_keeps_the_best_validation_rate():
    train_features, train_masks = patch_classes_data(96, 0)
    validation_features, validation_masks = patch_classes_data(32, 1)
    result = train_segmentation_probe(
        train_features, train_masks, validation_features, validation_masks, 3, (1e-4, 3e-2), epochs=8, batch_size=16
    )
    assert set(result.tried) == {1e-4, 3e-2} and result.learning_rate == max(result.tried, key=result.tried.get)
    # Bilinear upsampling blurs the edges between patches of different classes, so even the head that knows every
    # patch's class misses pixels there: the probe is held to 95% of that head's mIoU.
    oracle = LinearSegmentationHead(6, 3, dropout=0.0).eval()
    with torch.no_grad():
        oracle.classifier.weight.zero_()
        oracle.classifier.weight[:, :3, 0, 0] = torch.eye(3) * 10
        oracle.classifier.bias.zero_()
        oracle.norm.running_mean.zero_()
        oracle.norm.running_var.fill_(1 - 1e-5)
    ceiling = segmentation_scores(oracle, validation_features, validation_masks, 3).mean_iou
    assert result.validation.mean_iou > 0.95 * ceiling and result.validation.ignored_pixels == 32 * 16
    test_features, test_masks = patch_classes_data(32, 2)
    assert segmentation_scores(result.head, test_features, test_masks, 3).mean_iou > 0.95 * ceiling


def test_the_head_is_batchnorm_and_a_linear_map_per_patch_upsampled_bilinearly():
    head = LinearSegmentationHead(6, 3, dropout=0.0).eval()
    features = torch.randn(2, 6, 4, 4)
    logits = head(features)
    normed = (features - head.norm.running_mean[:, None, None]) / (head.norm.running_var[:, None, None] + 1e-5).sqrt()
    per_patch = torch.einsum("kc,bchw->bkhw", head.classifier.weight[:, :, 0, 0], normed)
    torch.testing.assert_close(logits, per_patch + head.classifier.bias[:, None, None])
    assert head(features, (16, 16)).shape == (2, 3, 16, 16)
