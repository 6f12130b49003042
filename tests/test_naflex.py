"""Native aspect ratio under a patch budget (`vitlab.data.naflex`)."""

import math

import pytest
import torch

from vitlab.data.naflex import naflex_grid, naflex_resize, pad_patch_inputs
from vitlab.errors import UsageError
from vitlab.models import create_model


def bisected_grid(height, width, patch, budget, eps=1e-5):
    """SigLIP 2's processor's search as its documentation states it: bisect the scale until the grid of ceil(side *
    scale / patch) patches (at least one) fits the budget; written here independently of vitlab's exact search."""

    def side(size, scale):
        return max(1, math.ceil(size * scale / patch))

    low, high = eps / 10, 100.0
    while high - low >= eps:
        middle = (low + high) / 2
        if side(height, middle) * side(width, middle) <= budget:
            low = middle
        else:
            high = middle
    return side(height, low), side(width, low)


@pytest.mark.parametrize("budget", [1, 16, 64, 256, 1024])
def test_the_grid_is_the_processors_fits_the_budget_and_keeps_the_aspect_ratio(budget):
    generator = torch.Generator().manual_seed(budget)
    for height, width in [(375, 500), (500, 375), (224, 224), (100, 1000), (3000, 17), (7, 9)] + [
        tuple(int(v) for v in torch.randint(1, 2000, (2,), generator=generator)) for _ in range(40)
    ]:
        rows, cols = naflex_grid(height, width, 16, budget)
        assert (rows, cols) == bisected_grid(height, width, 16, budget), (height, width)
        assert rows * cols <= budget
        if rows > 1 and cols > 1:  # neither side clamped to one patch: both scaled alike, to within a patch
            scale = min(rows / height, cols / width)  # patches per pixel: the largest both sides round up from
            assert -1e-9 <= rows - height * scale < 1 and -1e-9 <= cols - width * scale < 1


def test_a_4_by_3_photo_at_256_patches():
    assert naflex_grid(375, 500, 16, 256) == (14, 18)  # 224 x 288 pixels, 252 patches (a square: 16 x 16)
    image = torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8)
    resized = naflex_resize(image, 16, 256)
    assert resized.shape == (3, 224, 288) and resized.dtype == torch.uint8
    with pytest.raises(UsageError, match="at least one patch"):
        naflex_grid(10, 10, 16, 0)


@pytest.mark.parametrize("pos_embed", ["learned", "rope"])
def test_a_padded_batch_gives_each_images_own_outputs(pos_embed):
    """Images of three shapes padded into one batch: each row's features equal the image's alone, so the mask
    keeps padding out of attention and pooling (a learned table sampled at each image's grid, or rotary)."""
    torch.manual_seed(0)
    overrides = dict(depth=2, embed_dim=32, num_heads=2, mlp_dim=64, num_classes=3, classifier="gap")
    model = create_model("Ti/16", image_size=64, pos_embed=pos_embed, **overrides).eval()
    images = [torch.rand(3, h, w) for h, w in [(48, 64), (64, 32), (16, 80)]]
    batch = pad_patch_inputs(images, 16, length=16)
    assert batch.valid.sum(1).tolist() == [12, 8, 5]
    with torch.no_grad():
        together = model.forward_pre_logits(batch)
        for row, image in enumerate(images):
            alone = model.forward_pre_logits(pad_patch_inputs([image], 16))
            torch.testing.assert_close(together[row : row + 1], alone, atol=1e-5, rtol=1e-5)
