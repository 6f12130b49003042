"""dense/features.py: the grids are the tokens of the model's own forward, chosen as users ask."""

import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.data.naflex import pad_patch_inputs
from vitlab.dense.features import chosen_blocks, dense_features
from vitlab.errors import UsageError
from vitlab.models import create_model

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=4, num_heads=4, mlp_dim=64, num_classes=0)


def randomised(**fields):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**{**TINY, **fields}))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def test_the_last_blocks_grid_is_the_forward_features_patch_tokens_on_their_grid():
    model = randomised(pos_embed="rope", register_tokens=2)
    images = torch.randn(2, 3, 16, 24)  # a rotary model takes any multiple of its patch
    features = dense_features(model, images, "last", prefix_tokens=True)
    with torch.no_grad():
        tokens = model.forward_features(images)
    assert features.blocks == [3] and features.grids[0].shape == (2, 32, 4, 6)
    assert torch.equal(features.grids[0], tokens[:, 3:].transpose(1, 2).reshape(2, 32, 4, 6))
    assert torch.equal(features.prefix[0], tokens[:, :3])


def test_last4_stacks_four_blocks_on_the_channel_axis():
    model = randomised()
    features = dense_features(model, torch.randn(1, 3, 16, 16), "last4", norm=False)
    assert features.blocks == [0, 1, 2, 3] and features.prefix is None
    assert features.concatenated().shape == (1, 4 * 32, 4, 4)


def test_images_at_their_own_grids_get_each_its_grid_as_alone():
    model = randomised(pos_embed="rope")
    wide, tall = torch.randn(3, 8, 16), torch.randn(3, 12, 4)
    together = dense_features(model, pad_patch_inputs([wide, tall], 4), [1, -1])
    for index, image in enumerate((wide, tall)):
        alone = dense_features(model, image[None], [1, -1])
        for block in range(2):
            torch.testing.assert_close(together.grids[block][index], alone.grids[block][0], rtol=1e-5, atol=1e-5)
    with pytest.raises(UsageError, match="no common grid"):
        together.concatenated()


@pytest.mark.parametrize("layers, blocks", [("last", [3]), ("LAST2", [2, 3]), (1, [1]), ([-1, 0, 0], [0, 3])])
def test_layer_choices_read_as_said(layers, blocks):
    assert chosen_blocks(4, layers) == blocks


@pytest.mark.parametrize("layers", ["last5", "first", 4, [-5], []])
def test_a_layer_choice_the_model_lacks_is_refused_in_one_line(layers):
    with pytest.raises(UsageError, match="4-block model|'last', 'last1'..'last4'|no block chosen"):
        chosen_blocks(4, layers)
