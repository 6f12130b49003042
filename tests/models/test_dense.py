"""A dense model holds its encoder (models/dense.py): the encoder's keys under "encoder.", timm's names below that;
state dicts of the flat layout vitlab wrote up to d434df3 load; the encoder's switches reach the encoder."""

import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.head_configs import DPTConfig, EoMTConfig, LinearSegmentationConfig, UpsamplingSegmentationConfig
from vitlab.models.dense import DenseModel, encoder_keys, nested_encoder_keys
from vitlab.models.registry import create_model
from vitlab.models.vit import VisionTransformer

SMALL = dict(image_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, mlp_dim=64, register_tokens=2)
HEADS = [
    (EoMTConfig(queries=4, blocks=2, upscale_blocks=1), 3),
    (DPTConfig(layers=(0, 1, 2, 3), neck_sizes=(4, 8, 12, 16), fusion_dim=8, head_dim=4), 0),
    (LinearSegmentationConfig(), 3),
    (UpsamplingSegmentationConfig(channels=8), 3),
]


def dense_model(head, num_classes) -> DenseModel:
    torch.manual_seed(0)
    model = create_model(ViTConfig(**SMALL, num_classes=num_classes, head=head)).eval()
    assert isinstance(model, DenseModel) and isinstance(model.encoder, VisionTransformer)
    return model


@pytest.mark.parametrize("head, num_classes", HEADS, ids=[head.kind for head, _ in HEADS])
def test_the_encoder_keeps_timms_names_under_encoder_and_the_head_sits_beside_it(head, num_classes):
    model = dense_model(head, num_classes)
    state = model.state_dict()
    plain = VisionTransformer(model.config.encoder_config).state_dict()
    assert set(encoder_keys(state)) == set(plain)  # exactly a headless ViT's keys, "blocks.0.attn.qkv.weight" ...
    others = [key for key in state if not key.startswith("encoder.")]
    assert others and all(key.startswith(model.head_parts) for key in others)
    assert model.encoder.config.head is None and model.encoder.config.num_classes == 0


@pytest.mark.parametrize("head, num_classes", HEADS, ids=[head.kind for head, _ in HEADS])
def test_a_state_dict_of_the_flat_layout_loads_with_the_same_outputs(head, num_classes):
    model = dense_model(head, num_classes)
    flat = {key.removeprefix("encoder."): value for key, value in model.state_dict().items()}
    assert nested_encoder_keys(flat, model.head_parts).keys() == model.state_dict().keys()
    other = dense_model(head, num_classes)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.zero_()
    other.load_state_dict(flat)  # the pre-hook moves the encoder's keys under "encoder."
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = model(images), other(images)
    for a, b in zip(ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,)):
        assert torch.equal(a, b)


def test_the_encoders_switches_reach_the_encoder():
    model = dense_model(*HEADS[0])
    model.dynamic_size = True
    model.set_attention_kernel("explicit")
    model.set_image_size(48)
    assert model.encoder.dynamic_size and model.encoder.attention_kernel == "explicit"
    assert model.config.image_size == model.encoder.config.image_size == (48, 48)
    assert model.blocks is model.encoder.blocks and len(model.blocks) == 4


def test_an_encoder_of_another_config_is_refused():
    config = ViTConfig(**SMALL, num_classes=3, head=LinearSegmentationConfig())
    with pytest.raises(UsageError, match="encoder_config"):
        create_model(config).__class__(config, VisionTransformer(config.encoder_config.replace(depth=2)))
