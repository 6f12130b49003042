"""EoMT (models/eomt.py): the forward passes, masked attention, building from a backbone, and the configs refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from paths import FIXTURES
from vitlab.checkpoint.formats import export_checkpoint, load_model
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError, UsageError
from vitlab.head_configs import EoMTConfig
from vitlab.models.eomt import EoMT, SegmentationOutput, eomt_from_backbone
from vitlab.models.registry import create_model
from vitlab.variants import variant_config

# DINOv2-style as the released EoMT models: class token, 4 registers without positions, LayerScale.
TINY = dict(
    image_size=32,
    patch_size=8,
    embed_dim=32,
    depth=3,
    num_heads=2,
    mlp_dim=64,
    num_classes=3,
    register_tokens=4,
    prefix_positions=False,
    layer_scale=1.0,
    head=EoMTConfig(queries=5, blocks=2, upscale_blocks=1),
)


def tiny_eomt(**changes) -> EoMT:
    torch.manual_seed(0)
    model = create_model(ViTConfig(**{**TINY, **changes})).eval()
    assert isinstance(model, EoMT)
    return model


def test_forward_gives_class_and_mask_logits_per_query():
    model = tiny_eomt()
    out = model(torch.randn(2, 3, 32, 32))
    assert isinstance(out, SegmentationOutput)
    assert out.class_logits.shape == (2, 5, 4)  # K + 1: "no object" last
    assert out.mask_logits.shape == (2, 5, 8, 8)  # the 4x4 grid upscaled x2 once


def test_forward_train_without_masking_ends_with_forward():
    model = tiny_eomt()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final = model(images)
        predictions = model.forward_train(images, [0.0, 0.0])
    assert len(predictions) == 3  # before each of the 2 query blocks, then the final one
    torch.testing.assert_close(predictions[-1].class_logits, final.class_logits, rtol=0, atol=0)
    torch.testing.assert_close(predictions[-1].mask_logits, final.mask_logits, rtol=0, atol=0)


def test_masked_attention_changes_the_prediction():
    model = tiny_eomt()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        open_ = model.forward_train(images, [0.0, 0.0])
        masked = model.forward_train(images, [1.0, 1.0])
    # The first prediction comes before any masked block; the ones after differ.
    torch.testing.assert_close(masked[0].mask_logits, open_[0].mask_logits)
    assert (masked[-1].mask_logits - open_[-1].mask_logits).abs().max() > 1e-3


def test_the_mask_restricts_queries_to_their_patches():
    model = tiny_eomt()
    logits = torch.full((1, 5, 8, 8), -1.0)
    logits[0, 0, :4, :4] = 1.0  # query 0: the top-left quarter of the grid (2x2 patches)
    mask = model.masked_attention(logits, (4, 4), probability=1.0)[0, 0]  # (T, T)
    prefix = model.query_prefix  # 5 queries + class + 4 registers
    assert mask.shape == (prefix + 16, prefix + 16)
    assert mask[0, :prefix].all()  # queries, class and registers: always read
    assert mask[0, prefix:].view(4, 4)[:2, :2].all() and mask[0, prefix:].sum() == 4
    assert not mask[1, prefix:].any()  # an empty mask reads no patch
    assert mask[prefix:].all()  # patch tokens read everything


def test_forward_train_checks_its_probabilities():
    model = tiny_eomt()
    with pytest.raises(UsageError, match="one masking probability"):
        model.forward_train(torch.randn(1, 3, 32, 32), [0.5])


def test_gradients_reach_queries_and_heads():
    model = tiny_eomt().train()
    predictions = model.forward_train(torch.randn(2, 3, 32, 32), [0.5, 0.5])
    sum(p.class_logits.sum() + p.mask_logits.sum() for p in predictions).backward()
    for name in (
        "q.weight",
        "class_head.weight",
        "mask_head.0.weight",
        "upscale.0.conv1.weight",
        "blocks.0.attn.qkv.weight",
    ):
        assert model.get_parameter(name).grad is not None, name


def test_rotary_encoder_takes_any_grid():
    model = tiny_eomt(pos_embed="rope", key_bias=False)
    out = model(torch.randn(1, 3, 32, 48))
    assert out.mask_logits.shape == (1, 5, 8, 12)


@pytest.mark.parametrize(
    "backbone",
    [
        # DINOv3-style: rotary positions, registers, LayerScale, patch 16 -> 2 upscaling blocks.
        dict(
            image_size=32,
            patch_size=16,
            pos_embed="rope",
            register_tokens=2,
            layer_scale=1.0,
            key_bias=False,
            num_classes=0,
        ),
        # SigLIP-style: no class token, attention pooling, patch 8 -> 1 upscaling block.
        dict(image_size=32, patch_size=8, classifier="map", class_token=False, num_classes=7),
        # timm's "avg" models: the final norm on the pooled vector (fc_norm), given to every token here.
        dict(image_size=32, patch_size=8, classifier="gap", fc_norm=True, num_classes=7),
    ],
    ids=["dinov3", "siglip", "fc_norm"],
)
def test_eomt_from_backbone_keeps_the_encoder(backbone):
    torch.manual_seed(0)
    shape = dict(embed_dim=32, depth=3, num_heads=2, mlp_dim=64)
    base = create_model(ViTConfig(**shape, **backbone)).eval()
    model = eomt_from_backbone(base, num_classes=4, queries=6, blocks=2, class_names=list("abcd")).eval()
    assert model.settings.upscale_blocks == (2 if backbone["patch_size"] == 16 else 1)
    assert model.config.class_names == list("abcd")
    for name, value in base.state_dict().items():
        if name.startswith(("patch_embed.", "blocks.", "cls_token", "reg_token", "pos_embed")):
            torch.testing.assert_close(model.state_dict()["encoder." + name], value, rtol=0, atol=0)
    if backbone.get("fc_norm"):
        torch.testing.assert_close(model.encoder.norm.weight, base.fc_norm.weight)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(images)
        tokens, _ = base.forward_blocks(*base.prepare_tokens(images), stop=1)
        ours, _ = model.encoder.forward_blocks(*model.encoder.prepare_tokens(images), stop=1)
    torch.testing.assert_close(ours, tokens)  # the encoder's blocks before the queries are the backbone's
    grid = 32 // backbone["patch_size"] * 2**model.settings.upscale_blocks
    assert out.class_logits.shape == (2, 6, 5) and out.mask_logits.shape == (2, 6, grid, grid)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_classes=0), "needs num_classes > 0"),
        (dict(head=EoMTConfig(queries=5, blocks=4)), "blocks must be in 1..depth"),
        (dict(head=EoMTConfig(queries=0, blocks=2)), "queries must be in"),
        (dict(pos_embed="relative", prefix_positions=True), "relative attention"),
        (dict(pos_embed_placement="every_block", prefix_positions=True), "positions added before every block"),
    ],
)
def test_bad_configs_are_refused_with_one_clear_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        create_model(ViTConfig(**{**TINY, **changes}))


def test_eomt_refuses_a_config_without_its_head():
    with pytest.raises(ConfigError, match="head is 'eomt' was expected, got head 'none'"):
        EoMT(ViTConfig(**{**TINY, "head": None}))


def test_reset_head_gives_a_fresh_class_head():
    model = tiny_eomt()
    model.reset_head(7, class_names=list("abcdefg"))
    assert model(torch.randn(1, 3, 32, 32)).class_logits.shape == (1, 5, 8)


# ------------------------------------------------------------------------------ transformers' checkpoints
# Written by tools/make_eomt_fixtures.py with transformers' EomtForUniversalSegmentation (DINOv2-style encoder) and
# EomtDinov3ForUniversalSegmentation; the .io.npz holds what transformers computed.
FIXTURE_NAMES = ("hf_eomt", "hf_eomt_dinov3")


def reference(name: str) -> dict[str, torch.Tensor]:
    with np.load(FIXTURES / f"{name}.io.npz") as arrays:
        return {key: torch.from_numpy(arrays[key]) for key in arrays.files}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_transformers_checkpoint_loads_with_its_logits(name):
    model = load_model(FIXTURES / name).eval()
    expected = reference(name)
    assert isinstance(model, EoMT) and model.config.class_names == ["sky", "road", "cat"]
    assert model.config.pos_embed == ("rope" if "dinov3" in name else "learned")  # told by its tensors
    with torch.no_grad():
        out = model(expected["input_nchw"])
    torch.testing.assert_close(out.class_logits, expected["class_logits"], rtol=0, atol=1e-4)
    torch.testing.assert_close(out.mask_logits, expected["mask_logits"], rtol=0, atol=1e-4)


def test_transformers_dinov3_checkpoint_matches_on_a_non_square_grid():
    model = load_model(FIXTURES / "hf_eomt_dinov3").eval()
    expected = reference("hf_eomt_dinov3")
    with torch.no_grad():
        out = model(expected["input_wide"])  # 32x48: a 4x6 grid
    torch.testing.assert_close(out.class_logits, expected["class_logits_wide"], rtol=0, atol=1e-4)
    torch.testing.assert_close(out.mask_logits, expected["mask_logits_wide"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_masked_attention_matches_transformers_with_every_query_masked(name):
    """transformers with attn_mask_probs at 1 masks every query by its predicted mask before each query block (no
    random draw); its predictions before those blocks and the final one are forward_train's with probabilities 1."""
    model = load_model(FIXTURES / name).eval()
    expected = reference(name)
    assert (expected["masked_mask_logits"][-1] - expected["mask_logits"]).abs().max() > 1e-2  # masking mattered
    with torch.no_grad():
        predictions = model.forward_train(expected["input_nchw"], [1.0] * model.settings.blocks)
    assert len(predictions) == len(expected["masked_class_logits"])
    for index, prediction in enumerate(predictions):
        torch.testing.assert_close(prediction.class_logits, expected["masked_class_logits"][index], rtol=0, atol=1e-4)
        torch.testing.assert_close(prediction.mask_logits, expected["masked_mask_logits"][index], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_export_to_hf_loads_back_in_transformers_with_the_same_logits(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    model = load_model(FIXTURES / name).eval()
    expected = reference(name)
    folder = export_checkpoint(model, tmp_path / name, to="hf")
    reference_class = "EomtDinov3ForUniversalSegmentation" if "dinov3" in name else "EomtForUniversalSegmentation"
    theirs = getattr(transformers, reference_class).from_pretrained(folder).eval()
    with torch.no_grad():
        output = theirs(pixel_values=expected["input_nchw"])
    torch.testing.assert_close(output.class_queries_logits, expected["class_logits"], rtol=0, atol=1e-4)
    torch.testing.assert_close(output.masks_queries_logits, expected["mask_logits"], rtol=0, atol=1e-4)
    again = load_model(folder)
    assert again.config == model.config.replace(preprocessing=again.config.preprocessing)


def test_a_file_with_annealing_unfinished_is_read_with_a_warning(tmp_path):
    folder = tmp_path / "eomt"
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / "hf_eomt" / "config.json").read_text())
    tensors = load_file(FIXTURES / "hf_eomt" / "model.safetensors")
    tensors["attn_mask_probs"] = torch.ones_like(tensors["attn_mask_probs"])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="attn_mask_probs"):
        load_model(folder)


def test_a_checkpoint_without_its_config_is_refused_clearly(tmp_path):
    folder = tmp_path / "eomt"
    folder.mkdir()
    save_file(load_file(FIXTURES / "hf_eomt" / "model.safetensors"), folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="num_blocks"):
        load_model(folder)


def test_released_preset_builds():
    config = variant_config("eomt-L/16")
    assert config.head == EoMTConfig(queries=200, blocks=4, upscale_blocks=2)
    assert (config.num_classes, config.register_tokens) == (133, 4)
    with torch.device("meta"):
        model = create_model(config)
    assert isinstance(model, EoMT) and len(model.upscale) == 2
