"""Position kinds keyed by patch coordinates (models/positions/): every kind gives the same model whether its
tokens come as a pixel grid, as already-cut patches, or as images of different shapes padded into one batch; and a
new kind is a module plus one table row."""

import pytest
import torch

from vitlab.config import POSITION_EMBEDDINGS, ViTConfig
from vitlab.layers.patch_embed import cut_patches
from vitlab.model_input import PatchInput
from vitlab.models import create_model
from vitlab.models.positions import POSITION_KINDS
from vitlab.models.positions.absolute import AbsoluteTable
from vitlab.position_kinds import POSITION_TRAITS, PositionTraits

TINY = dict(image_size=(8, 12), patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=48, num_classes=3)
KINDS = [
    dict(pos_embed="learned"),
    dict(pos_embed="learned_2d"),
    dict(pos_embed="sincos2d"),
    dict(pos_embed="rope"),
    dict(pos_embed="none"),
    dict(pos_embed="learned", pos_embed_placement="every_block"),
    dict(pos_embed="learned_2d", pos_embed_placement="every_block_shared", register_tokens=2),
    dict(pos_embed="sincos2d", prefix_positions=False, register_tokens=1),
    dict(pos_embed="rope", register_tokens=2, layer_scale=0.1),
]
POOLINGS = [
    dict(classifier="token"),
    dict(classifier="gap"),
    dict(classifier="map"),
    dict(classifier="gem"),
    dict(classifier="max"),
    dict(classifier="layer_weighted", class_token=False),
]


def randomised(**fields):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**{**TINY, **fields})).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.1)
        if model.gem_pool is not None:
            model.gem_pool.p.fill_(2.5)
    return model


def padded(images: list[torch.Tensor], patch: int = 4) -> PatchInput:
    """Images of different sizes (C, H, W) as one PatchInput, padded after each image's last patch."""
    cut = [cut_patches(image[None], patch) for image in images]
    length = max(part.patches.shape[1] for part in cut)

    def pad(tensor: torch.Tensor, value) -> torch.Tensor:
        filler = tensor.new_full((1, length - tensor.shape[1], *tensor.shape[2:]), value)
        return torch.cat([tensor, filler], dim=1)

    return PatchInput(
        torch.cat([pad(c.patches, 7.0) for c in cut]),
        torch.cat([pad(c.coords, 0) for c in cut]),
        torch.cat([pad(c.valid, False) for c in cut]),
    )


def test_the_kinds_table_has_every_name_the_config_takes():
    assert tuple(POSITION_KINDS) == POSITION_EMBEDDINGS == tuple(POSITION_TRAITS)


@pytest.mark.parametrize("fields", KINDS + POOLINGS)
def test_cut_patches_give_the_pixel_grids_logits(fields):
    model = randomised(**fields)
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(cut_patches(images, 4)), model(images), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fields", KINDS + POOLINGS)
def test_images_of_different_shapes_in_one_padded_batch_give_each_ones_own_logits(fields):
    """Positions at each image's own grid (tables resampled per image, rotary angles normalised per image), padding
    never read by attention or pooling: each row equals the image run alone (dynamic image size)."""
    model = randomised(**fields)
    images = [torch.randn(3, 8, 12), torch.randn(3, 12, 4), torch.randn(3, 4, 8)]  # 2x3, 3x1 and 1x2 grids
    with torch.no_grad():
        together = model(padded(images))
        model.dynamic_size = True
        alone = torch.cat([model(image[None]) for image in images])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)


def test_patch_input_moves_and_splits_like_a_tensor():
    batch = padded([torch.randn(3, 8, 12), torch.randn(3, 4, 4)])
    assert len(batch) == 2 and batch.shape == (2, 6, 48)
    first, second = batch.chunk(2)
    assert torch.equal(second.valid, torch.tensor([[True] + [False] * 5]))
    moved = batch.to(torch.float64)
    assert (
        moved.patches.dtype == torch.float64 and moved.coords.dtype == torch.int64 and moved.valid.dtype == torch.bool
    )
    with pytest.raises(ValueError, match="coords"):
        PatchInput(batch.patches, batch.coords[:, :3], batch.valid)


def test_the_hybrid_and_a_wrong_patch_width_are_refused_in_one_line():
    from vitlab.errors import UsageError

    with pytest.raises(UsageError, match="4x4x3 = 48 values"):
        randomised()(
            PatchInput(
                torch.zeros(1, 2, 47), torch.zeros(1, 2, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)
            )
        )
    hybrid = create_model(
        ViTConfig(image_size=32, patch_size=1, resnet_layers=(1,), embed_dim=32, depth=1, num_heads=2, mlp_dim=32)
    )
    with pytest.raises(UsageError, match="ResNet hybrid"):
        hybrid(cut_patches(torch.randn(1, 3, 32, 32), 8))


class RowIndexTable(AbsoluteTable):
    """A made-up kind for the contract test: each patch's row number times a learned vector, nothing per column."""

    def create(self, model):
        model.pos_embed = torch.nn.Parameter(torch.zeros(1, 1, model.config.embed_dim))

    def initialise(self, model):
        torch.nn.init.normal_(model.pos_embed, std=0.02)

    def table(self, model, grid=None):
        rows, cols = grid or model.config.grid_size
        row_numbers = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)[None, :, None]
        prefix = torch.zeros(1, model.config.num_position_prefix, model.config.embed_dim)
        return torch.cat([prefix, row_numbers * model.pos_embed], dim=1)


def test_a_new_position_kind_is_a_module_and_one_row(monkeypatch):
    monkeypatch.setitem(POSITION_KINDS, "row_index", RowIndexTable)  # its code
    monkeypatch.setitem(POSITION_TRAITS, "row_index", PositionTraits("each patch's row number", "table"))  # what it is
    model = randomised(pos_embed="row_index")
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        logits = model(images)
        torch.testing.assert_close(model(cut_patches(images, 4)), logits, rtol=1e-4, atol=1e-5)
        model.pos_embed.mul_(5)
        assert not torch.allclose(model(images), logits, atol=1e-4)
    assert model.positions.table(model).shape == (1, 1 + 6, 32)
