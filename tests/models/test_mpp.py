"""Masked patch prediction (vitlab.models.mpp): the paper's corruption statistics, its colour targets, and a
loss that reads the corrupted patches only."""

import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.models import mpp
from vitlab.models.vit import VisionTransformer
from vitlab.variants import variant_config

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=0)


def test_corruption_statistics_on_a_seeded_draw():
    """50% of the patches of every image, and within them 80% [mask] / 10% another patch / 10% kept."""
    batch, patches = 64, 196
    corruption = mpp.draw_corruption(batch, patches, 0.5, (0.8, 0.1, 0.1), torch.Generator().manual_seed(0))
    assert (corruption.chosen.sum(dim=1) == 98).all()  # exactly half of each image's 196 patches
    chosen = corruption.kind[corruption.chosen]
    shares = [(chosen == kind).float().mean().item() for kind in (mpp.MASK_TOKEN, mpp.OTHER_PATCH, mpp.KEPT)]
    # 6,272 draws: the standard error of a 10% share is 0.4 points; 1.5 points is almost 4 of them
    assert shares == pytest.approx([0.8, 0.1, 0.1], abs=0.015)
    # the paper's 15% alternative: round(0.15 * 196) = 29 per image
    assert (mpp.draw_corruption(8, 196, 0.15, (0.8, 0.1, 0.1)).chosen.sum(dim=1) == 29).all()


def test_corruption_draws_repeat_with_the_same_generator_and_differ_across_images():
    first = mpp.draw_corruption(4, 49, 0.5, (0.8, 0.1, 0.1), torch.Generator().manual_seed(3))
    again = mpp.draw_corruption(4, 49, 0.5, (0.8, 0.1, 0.1), torch.Generator().manual_seed(3))
    assert torch.equal(first.kind, again.kind)
    assert not torch.equal(first.chosen[0], first.chosen[1])


def test_applied_corruption_replaces_what_it_says():
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randn(6, 25, 8)
    mask_token = torch.full((1, 1, 8), 7.0)
    corruption = mpp.draw_corruption(6, 25, 0.5, (0.5, 0.3, 0.2), generator)
    corrupted = mpp.apply_corruption(tokens, corruption, mask_token, generator)
    kind = corruption.kind
    assert (corrupted[kind == mpp.MASK_TOKEN] == 7.0).all()
    assert torch.equal(corrupted[kind == mpp.UNCHANGED], tokens[kind == mpp.UNCHANGED])
    assert torch.equal(corrupted[kind == mpp.KEPT], tokens[kind == mpp.KEPT])
    donors = tokens.reshape(-1, 8)
    for replaced in corrupted[kind == mpp.OTHER_PATCH]:  # each is some patch of the batch
        assert (donors == replaced).all(dim=1).any()


def test_mean_colour_classes_are_3_bit_per_channel():
    images = torch.zeros(1, 3, 8, 8)
    images[:, :, :4, :4] = 1.0  # top-left patch white: levels (7, 7, 7) -> 511
    images[:, 0, :4, 4:] = 1.0  # top-right pure red: (7, 0, 0) -> 448
    images[:, 1, 4:, :4] = 0.5  # bottom-left half green: level floor(0.5 * 8) = 4 -> 4 * 8 = 32
    assert mpp.mean_colour_classes(images, (4, 4)).tolist() == [[511, 448, 32, 0]]
    grey = torch.tensor([0.0, 0.124, 0.126, 0.99]).reshape(1, 1, 2, 2)  # 1x1 patches: one level each
    assert mpp.mean_colour_classes(grey, (1, 1)).tolist() == [[0, 0, 1, 7]]  # 8 classes for a grey image
    assert mpp.downsized_colour_classes(torch.rand(2, 3, 16, 16), (8, 8)).shape == (2, 4, 16)


def test_the_loss_reads_the_corrupted_patches_only():
    from vitlab.objectives.mpp import MaskedPatchPrediction
    from vitlab.objectives.settings import PretrainConfig

    objective = MaskedPatchPrediction(PretrainConfig())
    model = VisionTransformer(ViTConfig(in_chans=3, **TINY))
    module = objective.attach(model)
    images = torch.rand(4, 3, 16, 16)
    outputs = module(images, torch.Generator().manual_seed(0))
    assert outputs.predictions.shape == (4, 16, 512)
    targets = objective.targets(images, model.config)
    loss, _ = objective.loss(outputs, targets)
    unchosen = ~outputs.corruption.chosen
    outputs.predictions = outputs.predictions.detach().clone()
    outputs.predictions[unchosen] += 100.0
    assert objective.loss(outputs, targets)[0] == pytest.approx(loss.item())


def test_a_corrupted_patch_keeps_its_position():
    """Positions are added after the corruption: two [mask] patches at different places encode differently."""
    module = mpp.MaskedPatchPredictor(
        VisionTransformer(ViTConfig(in_chans=3, **TINY)), 8, ratio=0.99, shares=(1.0, 0.0, 0.0)
    )
    module.head = torch.nn.Identity()
    outputs = module(torch.rand(1, 3, 16, 16))
    assert outputs.corruption.chosen.all()  # every patch is [mask]
    assert not torch.allclose(outputs.predictions[0, 0], outputs.predictions[0, 5])


def test_the_hybrid_is_refused_with_a_message():
    with pytest.raises(UsageError, match="ResNet hybrid"):
        mpp.MaskedPatchPredictor(VisionTransformer(variant_config("R26+S/32", image_size=64, num_classes=0)), 8)


@pytest.mark.parametrize("target", ["colour", "downsized", "mean_l2", "patch_l2"])
def test_the_weighed_loss_is_the_mean_over_the_corrupted_patches(target):
    """The loss weighs every patch by whether it was corrupted (no selection the host must wait for): the same as
    the mean over the corrupted patches selected, and the same count of colours right."""
    import torch.nn.functional as F

    from vitlab.objectives.mpp import MaskedPatchPrediction
    from vitlab.objectives.settings import PretrainConfig

    objective = MaskedPatchPrediction(PretrainConfig(mpp_target=target))
    module = objective.attach(VisionTransformer(ViTConfig(in_chans=3, **TINY)))
    images = torch.rand(4, 3, 16, 16)
    outputs = module(images, torch.Generator().manual_seed(0))
    targets = objective.targets(images, module.encoder.config)
    loss, (correct, predicted) = objective.loss(outputs, targets)
    chosen = outputs.corruption.chosen
    selected, wanted = outputs.predictions[chosen].float(), targets["target"][chosen]
    if objective.classifies:
        logits = selected.reshape(len(selected), -1, objective.num_colours)
        wanted = wanted.reshape(len(wanted), -1)
        expected = F.cross_entropy(logits.flatten(0, 1), wanted.flatten())
        assert correct.item() == pytest.approx((logits.argmax(-1) == wanted).float().mean(1).sum().item())
    else:
        expected = F.mse_loss(selected, wanted.float())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert predicted.item() == chosen.sum().item()
