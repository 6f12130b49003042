import torch

from vitlab.data.transforms import (
    AugmentConfig,
    Draws,
    augment_batch,
    mix,
    one_hot,
    random_affine,
    random_crop,
    random_erasing,
    random_hflip,
    trivial_augment,
)


def draws(batch, seed=0, shard=None):
    return Draws(torch.Generator().manual_seed(seed), batch, shard)


def test_crop_with_zero_padding_is_identity_and_otherwise_shifts():
    x = torch.rand(8, 3, 6, 6)
    assert torch.equal(random_crop(x, 0, draws(8)), x)
    out = random_crop(x, 2, draws(8))
    assert out.shape == x.shape
    # Every output is the input shifted by some (dy, dx) in [-2, 2]^2 with zeros shifted in.
    for image, original in zip(out, x):
        padded = torch.nn.functional.pad(original, (2, 2, 2, 2))
        assert any(torch.equal(image, padded[:, dy : dy + 6, dx : dx + 6]) for dy in range(5) for dx in range(5))


def test_flip_flips_about_half():
    x = torch.rand(400, 1, 2, 2)
    out = random_hflip(x, draws(400))
    flipped = (out == x.flip(-1)).flatten(1).all(1) & ~(out == x).flatten(1).all(1)
    assert 150 < flipped.sum() < 250


def test_affine_with_zero_ranges_is_identity():
    x = torch.rand(4, 1, 8, 8)
    torch.testing.assert_close(random_affine(x, draws(4)), x, rtol=0, atol=1e-6)
    assert not torch.allclose(random_affine(x, draws(4), degrees=20), x)


def test_shards_see_the_same_augmentation_as_one_process():
    x, y = torch.rand(16, 3, 8, 8), torch.randint(10, (16,))
    config = AugmentConfig(
        crop_padding=1, hflip=True, affine_degrees=10, affine_scale=0.1, trivial_augment=1.0, random_erasing=0.5
    )
    whole, _ = augment_batch(x, y, 10, config, draws(16, seed=5))
    parts = [augment_batch(x[s], y[s], 10, config, draws(16, seed=5, shard=s))[0] for s in (slice(0, 8), slice(8, 16))]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=0)


def test_trivial_augment_stays_in_range_and_is_seeded():
    x = torch.rand(64, 3, 8, 8)
    a, b = trivial_augment(x, draws(64, 1)), trivial_augment(x, draws(64, 1))
    assert torch.equal(a, b) and a.min() >= 0 and a.max() <= 1
    assert not torch.equal(a, x)


def test_random_erasing_probability():
    x = torch.zeros(200, 1, 16, 16)
    assert torch.equal(random_erasing(x, draws(200), 0.0), x)
    erased = (random_erasing(x, draws(200), 0.5) != 0).flatten(1).any(1)
    assert 70 < erased.sum() < 130


def test_targets_stay_distributions_through_smoothing_and_mixing():
    targets = one_hot(torch.tensor([0, 3, 9]), 10, smoothing=0.1)
    assert torch.allclose(targets.sum(1), torch.ones(3)) and abs(targets[0, 0].item() - 0.91) < 1e-6
    for alpha in ((0.8, 0.0), (0.0, 1.0)):
        images, mixed = mix(torch.rand(4, 3, 8, 8), one_hot(torch.arange(4), 4), draws(4), *alpha)
        assert torch.allclose(mixed.sum(1), torch.ones(4))
        assert (mixed > 0).sum(1).max() <= 2  # each row mixes a sample with its partner only


def test_mixing_under_ddp_uses_the_same_numbers_with_partners_from_the_own_shard():
    """What the module promises for N processes: the same mixing weight as one process, partners from the
    process's own shard (the shard reversed), not from the whole batch."""
    images = torch.rand(8, 1, 4, 4)
    targets = one_hot(torch.arange(8), 8, 0.0)

    def draws(shard=None):
        return Draws(torch.Generator().manual_seed(3), 8, shard)

    whole_images, whole_targets = mix(images.clone(), targets, draws(), mixup_alpha=0.4, cutmix_alpha=0.0)
    lam = float(whole_targets[0, 0])  # row 0 keeps lam of its own class
    assert 0 < lam < 1 and abs(float(whole_targets[0, 7]) - (1 - lam)) < 1e-6  # partner: row 7 of the batch
    for shard in (slice(0, 4), slice(4, 8)):
        part_images, part_targets = mix(images[shard].clone(), targets[shard], draws(shard), 0.4, 0.0)
        own = torch.arange(8)[shard]
        partners = own.flip(0)
        torch.testing.assert_close(part_targets, lam * targets[own] + (1 - lam) * targets[partners])
        torch.testing.assert_close(part_images, lam * images[own] + (1 - lam) * images[partners])
