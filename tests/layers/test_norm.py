"""Normalisation layers by name (layers/norm.py), and a model built with RMSNorm and a query-key norm."""

import torch
from torch import nn

from vitlab.config import NORMS, ViTConfig
from vitlab.layers.norm import NORM_LAYERS, norm_factory
from vitlab.models import create_model

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=5)


def test_the_table_has_every_name_the_config_takes():
    assert tuple(NORM_LAYERS) == NORMS


def test_rmsnorm_scales_by_the_root_mean_square_without_centring():
    layer = norm_factory("rmsnorm", 1e-6)(8)
    assert isinstance(layer, nn.RMSNorm) and layer.eps == 1e-6
    with torch.no_grad():
        layer.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.randn(3, 8) + 5  # an offset LayerNorm would remove
    expected = x / x.pow(2).mean(dim=-1, keepdim=True).add(1e-6).sqrt() * torch.arange(1.0, 9.0)
    torch.testing.assert_close(layer(x), expected)


def test_a_model_takes_its_norms_from_the_config_with_timms_names():
    model = create_model(ViTConfig(**TINY, norm="rmsnorm", qk_norm=True))
    names = set(model.state_dict())
    assert {
        "blocks.0.norm1.weight",
        "blocks.0.attn.q_norm.weight",
        "blocks.0.attn.k_norm.weight",
        "norm.weight",
    } <= names
    assert not any(name.endswith("norm1.bias") or name == "norm.bias" for name in names)  # RMSNorm has no bias
    assert model.blocks[1].attn.q_norm.weight.shape == (8,)  # per head: head_dim wide
    assert all(isinstance(module, nn.RMSNorm) for name, module in model.named_modules() if name.endswith("norm1"))
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 5)


def test_the_query_key_norm_changes_the_attention_and_takes_the_explicit_path_alike():
    model = create_model(ViTConfig(**{**TINY, "num_classes": 0}, qk_norm=True)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        fused = model(images)
        model.set_attention_kernel("explicit")
        explicit = model(images)
        model.blocks[0].attn.q_norm.weight.mul_(3)
        changed = model(images)
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(changed, explicit, atol=1e-4)
