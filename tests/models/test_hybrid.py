import torch

from vitlab.config import ViTConfig
from vitlab.layers.std_conv import MaxPool2dSame, StdConv2dSame, same_padding
from vitlab.models import create_model
from vitlab.models.hybrid import ResNetStem


def test_same_padding_puts_the_odd_pixel_after():
    assert same_padding(32, 7, 2) == (2, 3)  # the root conv of a 32-pixel input
    assert same_padding(8, 3, 2) == (0, 1)
    assert same_padding(8, 3, 1) == (1, 1)
    assert same_padding(8, 1, 1) == (0, 0)


def test_std_conv_standardises_each_filter():
    conv = StdConv2dSame(3, 4, 3)
    with torch.no_grad():
        conv.weight.mul_(7).add_(3)
    x = torch.randn(1, 3, 5, 5)
    w = conv.weight
    standard = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True, unbiased=False) + 1e-5)
    expected = torch.nn.functional.conv2d(x, standard, padding=1)
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)


def test_max_pool_same_never_picks_padding():
    x = -torch.ones(1, 1, 4, 4)
    assert MaxPool2dSame(3, 2)(x).max() == -1


def test_stem_output_stride_and_channels():
    stem = ResNetStem(3, (1, 1, 1), width_factor=0.5)
    assert stem.out_channels == 32 * 4 * 4
    assert stem(torch.randn(1, 3, 64, 64)).shape == (1, 512, 4, 4)


def test_hybrid_model_patchifies_the_feature_map_with_p_1():
    config = ViTConfig(
        image_size=32,
        patch_size=1,
        embed_dim=32,
        depth=1,
        num_heads=4,
        mlp_dim=64,
        num_classes=3,
        resnet_layers=(1, 1),
        resnet_width_factor=0.5,
    )
    assert config.grid_size == (4, 4)
    model = create_model(config).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    assert "patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight" in model.state_dict()
