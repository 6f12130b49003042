"""dense/neighbour_segmentation.py: patches carry the fractions of their counted pixels, the bank keeps the labelled
ones, the head labels a patch from its nearest bank patches, and k is chosen on the validation split."""

import pytest
import torch
from torch.nn import functional as F

from vitlab.dense.neighbour_segmentation import (
    NeighbourSegmentationHead,
    patch_bank,
    patch_label_distributions,
    train_neighbour_probe,
)
from vitlab.dense.segmentation_probe import segmentation_scores
from vitlab.errors import DataError, UsageError


def one_hot_patches(count: int, seed: int, noise: float = 0.0, flipped: float = 0.0):
    """Features (N, 4, 4, 4): the one-hot of each patch's class (3 classes, a fourth channel empty) plus noise, and
    masks (N, 8, 8): each patch's class on its 2 x 2 pixels, a `flipped` fraction of the patches given another class.
    Two-pixel patches: the bilinear upsampling of one-hot scores then keeps every pixel's own patch the largest."""
    generator = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, 3, (count, 4, 4), generator=generator)
    features = F.one_hot(classes, 4).permute(0, 3, 1, 2).float()
    features += torch.randn(features.shape, generator=generator) * noise
    shift = torch.randint(1, 3, classes.shape, generator=generator)
    flip = torch.rand(classes.shape, generator=generator) < flipped
    labels = torch.where(flip, (classes + shift) % 3, classes)
    masks = labels.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).to(torch.uint8)
    return features, masks, classes


def test_each_patch_holds_the_fractions_of_its_counted_pixels():
    masks = torch.tensor([[0, 0, 1, 1], [0, 255, 1, 2], [255, 255, 2, 2], [255, 255, 2, 0]], dtype=torch.uint8)[None]
    distributions = patch_label_distributions(masks, (2, 2), 3)
    expected = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.0, 0.75, 0.25]],  # the ignored pixel is not counted
            [[0.0, 0.0, 0.0], [0.25, 0.0, 0.75]],  # a patch with no counted pixel is all zeros
        ]
    )
    assert distributions.dtype == torch.float32
    torch.testing.assert_close(distributions, expected[None])
    with pytest.raises(UsageError, match="do not split"):
        patch_label_distributions(masks, (3, 2), 3)
    with pytest.raises(DataError, match="outside 0..1"):
        patch_label_distributions(masks, (2, 2), 2)


def test_the_bank_drops_unlabelled_patches_and_samples_deterministically():
    features = torch.randn(1, 5, 2, 2)
    masks = torch.tensor([[0, 0, 1, 1], [0, 255, 1, 2], [255, 255, 2, 2], [255, 255, 2, 0]], dtype=torch.uint8)[None]
    bank = patch_bank(features, masks, 3)
    kept = features.flatten(2)[0].T[[0, 1, 3]]  # patches (0, 0), (0, 1), (1, 1); (1, 0) is all ignored
    torch.testing.assert_close(bank.features, F.normalize(kept, dim=1))
    torch.testing.assert_close(bank.labels, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.75, 0.25], [0.25, 0.0, 0.75]]))

    features, masks, _ = one_hot_patches(6, 0, noise=0.1)
    whole = patch_bank(features, masks, 3)
    sample = patch_bank(features, masks, 3, max_patches=10, seed=1)
    assert len(whole.features) == 6 * 16 and sample.features.shape == (10, 4) and sample.labels.shape == (10, 3)
    torch.testing.assert_close(patch_bank(features, masks, 3, max_patches=10, seed=1).features, sample.features)
    assert not torch.equal(patch_bank(features, masks, 3, max_patches=10, seed=2).features, sample.features)
    rows = [int((whole.features == row).all(dim=1).nonzero()) for row in sample.features]  # rows of the whole bank
    torch.testing.assert_close(sample.labels, whole.labels[rows])


def test_one_hot_features_reproduce_the_training_masks_with_one_neighbour():
    features, masks, classes = one_hot_patches(4, 0)
    head = NeighbourSegmentationHead(patch_bank(features, masks, 3), k=1)
    assert torch.equal(head(features).argmax(dim=1), classes)
    assert torch.equal(head(features, (8, 8)).argmax(dim=1), masks.long())
    assert segmentation_scores(head, features, masks, 3).mean_iou == 1.0
    result = train_neighbour_probe(features, masks, features, masks, 3, ks=(1,))
    assert result.k == 1 and result.validation.mean_iou == 1.0 and result.tried == {1: 1.0}


def test_k_is_chosen_on_validation_where_one_neighbour_copies_label_noise():
    train_features, train_masks, _ = one_hot_patches(40, 0, noise=0.1, flipped=0.25)
    validation_features, validation_masks, _ = one_hot_patches(16, 1, noise=0.1)
    result = train_neighbour_probe(train_features, train_masks, validation_features, validation_masks, 3, ks=(1, 5, 10))
    assert set(result.tried) == {1, 5, 10} and result.tried[1] < result.tried[5] - 0.1
    assert result.k == max(result.tried, key=result.tried.__getitem__) and result.head.k == result.k
    # The sweep's shared neighbours score as the chosen head does on its own.
    assert segmentation_scores(result.head, validation_features, validation_masks, 3) == result.validation


def test_the_head_scores_patches_or_pixels_and_has_nothing_to_train():
    features, masks, _ = one_hot_patches(3, 0, noise=0.1)
    head = NeighbourSegmentationHead(patch_bank(features, masks, 3), k=5)
    assert list(head.parameters()) == []
    scores = head.train()(features)
    assert scores.shape == (3, 3, 4, 4)
    torch.testing.assert_close(scores.sum(dim=1), torch.ones(3, 4, 4))  # a weighted mean of distributions
    torch.testing.assert_close(head.eval()(features), scores)
    assert head(features, (8, 12)).shape == (3, 3, 8, 12)
