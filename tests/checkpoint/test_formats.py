"""Parity with the reference implementations: every fixture written by the official JAX code, timm or
transformers loads and reproduces the logits that code computed."""

import json

import numpy as np
import pytest
import torch

from conftest import FIXTURES, REFERENCE_CHECKPOINTS, reference_io
from vitlab import export_checkpoint, load_model, read_checkpoint
from vitlab.errors import CheckpointError


@pytest.mark.parametrize(
    "name, weights, kind",
    [
        ("jax_vit_token", "jax_vit_token.npz", "jax"),
        ("timm_vit_token", "timm_vit_token.safetensors", "timm"),
        ("hf_vit", "hf_vit", "hf"),
        ("hf_vit", "hf_vit/model.safetensors", "hf"),
    ],
)
def test_kind_is_detected_from_content_not_extension(tmp_path, name, weights, kind):
    source = FIXTURES / weights
    disguised = tmp_path / "weights.bin"
    if source.is_dir():
        assert read_checkpoint(source)[2] == kind
        return
    disguised.write_bytes(source.read_bytes())
    sidecar = source.with_suffix(".json")
    if sidecar.exists():
        (tmp_path / "weights.json").write_text(sidecar.read_text())
    elif (source.parent / "config.json").exists():
        (tmp_path / "config.json").write_text((source.parent / "config.json").read_text())
    assert read_checkpoint(disguised)[2] == kind


def test_official_gelu_is_the_tanh_approximation():
    config, _, _ = read_checkpoint(FIXTURES / "jax_vit_token.npz")
    assert config.mlp_activation == "gelu_tanh" and config.layer_norm_eps == 1e-6
    # With the exact GELU the logits move by far more than the tolerance: the choice is not cosmetic.
    images, expected = reference_io("jax_vit_token")
    model = load_model(FIXTURES / "jax_vit_token.npz")
    for block in model.blocks:
        block.mlp.act.approximate = "none"
    with torch.no_grad():
        assert (model(images) - expected).abs().max() > 1e-5


def test_hf_layer_norm_eps_is_read_from_its_config():
    config, _, _ = read_checkpoint(FIXTURES / "hf_vit")
    assert config.layer_norm_eps == 1e-12


def test_hybrid_config_is_inferred_from_the_arrays():
    config, state, _ = read_checkpoint(FIXTURES / "jax_hybrid_r_vit.npz")
    assert config.resnet_layers == (1, 1) and config.resnet_width_factor == 0.5
    assert config.image_size == (32, 32) and config.grid_size == (4, 4)


def test_timm_without_sidecar_needs_a_head_count(tmp_path):
    lone = tmp_path / "w.safetensors"
    lone.write_bytes((FIXTURES / "timm_vit_token.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="head count of a width-32 model cannot be read.*--num-heads"):
        load_model(lone)
    images, expected = reference_io("timm_vit_token")
    with torch.no_grad():
        assert (load_model(lone, num_heads=4)(images) - expected).abs().max() <= 1e-4


@pytest.mark.run_level
@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
@pytest.mark.parametrize("to", ["vitlab", "timm", "hf"])
def test_every_fixture_converts_and_round_trips(tmp_path, name, weights, to):
    model = load_model(FIXTURES / weights)
    if to == "hf" and (
        model.config.classifier != "token"
        or model.config.fc_norm
        or model.config.resnet_layers
        or model.config.representation_size
        # DINOv2's files go back to Dinov2Model (families/dinov2.py); timm's DINOv2 has no family, so HF's ViT
        or (model.config.family != "dinov2" and (model.config.layer_scale is not None or model.config.register_tokens))
        or model.config.pre_norm
    ):
        with pytest.raises(CheckpointError, match="Hugging Face"):
            export_checkpoint(model, tmp_path / "out", to=to)
        return
    if to == "timm" and model.config.resnet_layers is not None:
        with pytest.raises(CheckpointError, match="hybrids"):
            export_checkpoint(model, tmp_path / "out.safetensors", to=to)
        return
    written = export_checkpoint(model, tmp_path / ("out" if to == "hf" else "out.safetensors"), to=to)
    images, expected = reference_io(name)
    reloaded = load_model(written)
    assert reloaded.config == model.config
    with torch.no_grad():
        assert (reloaded(images) - expected).abs().max().item() <= 1e-4


def test_timm_export_writes_timm_constructor_arguments(tmp_path):
    model = load_model(FIXTURES / "jax_vit_token.npz")
    weights = export_checkpoint(model, tmp_path / "vit.safetensors", to="timm")
    args = json.loads(weights.with_suffix(".json").read_text())
    assert args["act_layer"] == "gelu_tanh" and args["num_heads"] == 4 and args["global_pool"] == "token"
    from safetensors.torch import load_file

    assert set(load_file(weights)) == set(model.state_dict())


def test_lone_weights_with_a_non_square_position_table_need_an_image_size(tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(FIXTURES / "hf_vit" / "model.safetensors")
    state["vit.embeddings.position_embeddings"] = state["vit.embeddings.position_embeddings"][:, :16]  # 15 patch rows
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "num_attention_heads": 4}))  # no image_size
    with pytest.raises(CheckpointError, match="15 position rows are not a square grid"):
        read_checkpoint(tmp_path / "model.safetensors")


def lone_copy(tmp_path, weights: str):
    """The weights file alone, without the sidecar JSON that would state its arguments."""
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes((FIXTURES / weights).read_bytes())
    return lone


def test_timm_avg_pool_with_class_token_is_read_from_fc_norm(tmp_path):
    """timm's global_pool='avg' keeps the class token and adds fc_norm; the pool is the mean of the patch tokens.
    Read from the content alone (no sidecar), it once loaded as a class-token head, 0.7 off in the logits."""
    config, _, _ = read_checkpoint(lone_copy(tmp_path, "timm_vit_avg_cls.safetensors"), {"num_heads": 4})
    assert config.class_token and config.fc_norm and config.classifier == "gap"
    images, expected = reference_io("timm_vit_avg_cls")
    with torch.no_grad():
        logits = load_model(tmp_path / "lone.safetensors", num_heads=4)(images)
    assert (logits - expected).abs().max().item() <= 1e-4


def test_a_sidecar_global_pool_decides_against_the_default_rule(tmp_path):
    lone = lone_copy(tmp_path, "timm_vit_avg_cls.safetensors")
    (tmp_path / "lone.json").write_text(json.dumps({"num_heads": 4, "global_pool": "token", "fc_norm": True}))
    config, _, _ = read_checkpoint(lone)
    assert config.classifier == "token" and config.fc_norm  # timm's token pool followed by fc_norm


def test_a_non_square_checkpoint_loads_at_the_size_given(tmp_path):
    lone = lone_copy(tmp_path, "timm_vit_48x32.safetensors")
    images, expected = reference_io("timm_vit_48x32")
    assert images.shape[-2:] == (48, 32)
    with pytest.raises(CheckpointError, match="24 position rows are not a square grid.*--image-size HxW"):
        load_model(lone, num_heads=4)
    model = load_model(lone, num_heads=4, image_size=(48, 32))
    assert model.config.image_size == (48, 32) and model.config.grid_size == (6, 4)
    with torch.no_grad():
        assert (model(images) - expected).abs().max().item() <= 1e-4
    with pytest.raises(CheckpointError, match="image size 48x40 does not fit.*6x5 grid.*24 patch rows"):
        load_model(lone, num_heads=4, image_size=(48, 40))
    # 32x48 (a 4x6 grid) also has 24 rows: a table's orientation cannot be read from it, only its row count.


def test_a_square_checkpoint_given_a_size_is_resampled_to_it():
    """Its 4x4 grid of position rows is interpolated (bilinear, as the official fine-tuning code) to the 6x4 grid of
    24x16 images, the class token's row kept: the table's values, not only its shape (a table laid out 4x6, or a
    fresh one, has that shape too)."""
    square = load_model(FIXTURES / "timm_vit_token.safetensors")
    model = load_model(FIXTURES / "timm_vit_token.safetensors", image_size=(24, 16))
    assert model.config.image_size == (24, 16) and model.pos_embed.shape[1] == 1 + 6 * 4
    table = square.pos_embed.detach()  # (1, 1 + 4 * 4, D)
    grid = table[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)  # (1, D, 4, 4)
    resized = torch.nn.functional.interpolate(grid, size=(6, 4), mode="bilinear", align_corners=False)
    expected = torch.cat([table[:, :1], resized.permute(0, 2, 3, 1).reshape(1, 6 * 4, -1)], dim=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=1e-6)


def test_a_non_square_official_npz_loads_at_the_size_given(tmp_path):
    """No official non-square checkpoint is at hand, so one is cut from the square fixture: its 4x4 position grid
    cropped to the top 4x2 rows, as a model for 16x8 images. It must load at that size and equal the square
    model given the same cropped table."""
    with np.load(FIXTURES / "jax_vit_token.npz", allow_pickle=False) as arrays:
        cut = dict(arrays)
    key = "Transformer/posembed_input/pos_embedding"
    table = cut[key]  # (1, 1 + 16, D)
    grid = table[:, 1:].reshape(1, 4, 4, -1)[:, :, :2].reshape(1, 8, -1)
    cut[key] = np.concatenate([table[:, :1], grid], axis=1)
    np.savez(tmp_path / "cut.npz", **cut)
    with pytest.raises(CheckpointError, match="8 position rows are not a square grid"):
        load_model(tmp_path / "cut.npz")
    model = load_model(tmp_path / "cut.npz", image_size=(16, 8))
    reference = load_model(FIXTURES / "jax_vit_token.npz")
    reference.set_image_size((16, 8))  # then overwrite the resampled table with the same crop
    with torch.no_grad():
        reference.pos_embed.copy_(torch.from_numpy(cut[key]))
        images = torch.randn(2, 3, 16, 8)
        assert torch.equal(model(images), reference(images))


def test_every_command_that_loads_a_checkpoint_takes_image_size_as_hxw():
    from vitlab.cli import build_parser

    parser = build_parser()
    commands = {
        "info": ["C"],
        "convert": ["C", "OUT"],
        "eval": ["C"],
        "predict": ["C", "img.png"],
        "export": ["C"],
        "analyze": ["C", "--images", "digits"],
        "fewshot": ["C", "--dataset", "digits"],
        "linear-probe": ["C", "--dataset", "digits"],
        "finetune": ["--from", "C", "--dataset", "digits"],
        "bench": ["--checkpoint", "C"],
    }
    for command, rest in commands.items():
        args = parser.parse_args([command, *rest, "--image-size", "48x32"])
        assert args.image_size == (48, 32), command


def test_cli_info_and_convert_take_the_size_of_a_non_square_checkpoint(tmp_path, capsys):
    from vitlab.cli import main

    lone = lone_copy(tmp_path, "timm_vit_48x32.safetensors")
    assert main(["info", str(lone), "--num-heads", "4", "--image-size", "48x32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["encoder"]["image_size"] == [48, 32]
    out = tmp_path / "converted.safetensors"
    assert main(["convert", str(lone), str(out), "--num-heads", "4", "--image-size", "48x32"]) == 0
    images, expected = reference_io("timm_vit_48x32")
    with torch.no_grad():
        assert (load_model(out)(images) - expected).abs().max().item() <= 1e-4
    assert main(["info", str(lone), "--num-heads", "4"]) == 1
    assert "not a square grid" in capsys.readouterr().err


@pytest.mark.parametrize(
    "weights, teacher_heads", [("timm_deit_distilled.safetensors", True), ("hf_deit_teacher", True), ("hf_deit", False)]
)
def test_deit_layouts_read_the_distillation_token_and_heads(weights, teacher_heads):
    config, state, _ = read_checkpoint(FIXTURES / weights)
    assert config.distilled and config.num_prefix_tokens == 2 and config.grid_size == (4, 4)
    assert config.has_distillation_head == teacher_heads and ("head_dist.weight" in state) == teacher_heads


@pytest.mark.parametrize(
    "keys, named",
    [
        (
            ["layers.0.blocks.0.attn.relative_position_bias_table", "layers.0.downsample.norm.weight"],
            "Swin Transformer",
        ),
        (["patch_embed.proj.weight", "blocks.0.attn.relative_position_bias_table", "blocks.0.attn.qkv.weight"], "BEiT"),
        (["stages.0.blocks.0.conv_dw.weight"], "ConvNeXt"),
        (["visual.class_embedding", "visual.conv1.weight"], "open_clip CLIP"),
        (["foo.bar"], "no checkpoint layout vitlab knows"),
    ],
)
def test_other_architectures_get_one_message_naming_them_and_what_loads(tmp_path, keys, named):
    from safetensors.torch import save_file

    save_file({key: torch.zeros(2) for key in keys}, tmp_path / "w.safetensors")
    with pytest.raises(
        CheckpointError,
        # Every family of the table, oldest first; the image towers after the others.
        match=f"{named}.*vitlab loads the paper's ViT .*DeiT, DINO, MAE, DINOv2, .*Depth Anything, .*EoMT, .*DINOv3, .*"
        "and CLIP, SigLIP, AIMv2, SigLIP 2, Perception Encoder and TIPSv2 image towers",
    ):
        load_model(tmp_path / "w.safetensors")


def test_timm_clip_hub_config_names_quickgelu_and_a_fine_tuned_head_stays_a_classifier(tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(FIXTURES / "timm_clip_quickgelu.safetensors")
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps({"architecture": "vit_tiny_patch4_clip_quickgelu_16", "num_heads": 4})
    )
    config, _, _ = read_checkpoint(tmp_path)
    assert config.mlp_activation == "quick_gelu" and config.pre_norm and config.projection
    state["head.bias"] = torch.full_like(state["head.bias"], 0.1)  # a trained classifier's bias is not all zero
    save_file(state, tmp_path / "model.safetensors")
    assert not read_checkpoint(tmp_path)[0].projection


def test_a_bug_in_an_importer_is_not_reported_as_a_damaged_file(monkeypatch):
    from vitlab.checkpoint import timm as timm_layout

    def buggy(*args, **kwargs):
        raise TypeError("vitlab bug: unexpected argument")

    monkeypatch.setattr(timm_layout, "config_from_timm", buggy)
    with pytest.raises(TypeError, match="vitlab bug"):  # not "tensors with the names of a ViT checkpoint ..."
        read_checkpoint(FIXTURES / "timm_vit_token.safetensors")


@pytest.mark.parametrize("fields", [dict(norm="rmsnorm"), dict(mlp="swiglu"), dict(qk_norm=True)])
@pytest.mark.parametrize("to", ["timm", "hf"])
def test_blocks_another_layout_cannot_hold_are_refused_before_anything_is_written(fields, to, tmp_path):
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.config import ViTConfig
    from vitlab.errors import CheckpointError
    from vitlab.models import create_model

    model = create_model(
        ViTConfig(image_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=16, num_classes=2, **fields)
    )
    out = tmp_path / ("model.safetensors" if to == "timm" else "hf")
    with pytest.raises(CheckpointError, match="keep vitlab's format"):
        export_checkpoint(model, out, to)
    assert not out.exists()
    export_checkpoint(model, tmp_path / "own.safetensors", "vitlab")  # vitlab's own format holds any model


def test_models_with_the_2025_block_parts_round_trip_through_vitlabs_own_files(tmp_path):
    from vitlab.checkpoint.formats import export_checkpoint, load_model
    from vitlab.config import ViTConfig
    from vitlab.models import create_model

    config = ViTConfig(
        image_size=(8, 12),
        patch_size=4,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_dim=24,
        num_classes=3,
        norm="rmsnorm",
        mlp="swiglu",
        qk_norm=True,
        pos_embed="rope",
        register_tokens=2,
        layer_scale=0.5,
        rope_theta=50.0,
    )
    model = create_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    loaded = load_model(export_checkpoint(model, tmp_path / "m.safetensors", "vitlab"))
    assert loaded.config == config
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))
