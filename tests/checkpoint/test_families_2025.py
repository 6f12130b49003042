"""The 2025 backbones (issue 35): DINOv3, AIMv2 and SigLIP 2 NaFlex load by content from transformers' and timm's
layouts with the reference code's outputs, and go back out in transformers' layout.

The transformers fixtures (tests/fixtures/hf_dinov3*, hf_aimv2_vision, hf_siglip2_vision) were written by
transformers itself (tools/make_hf_fixtures.py). timm cannot be installed here (it needs torchvision), so the timm
files below are built in this test from timm's published key names and shapes (timm/models/eva.py and
vision_transformer.py, read at commit aa4b5850), with the weights of a transformers fixture mapped by this test's
own table, independent of vitlab's converters: equal outputs then check both mappings at once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import FIXTURES
from vitlab import load_model, read_checkpoint
from vitlab.checkpoint.families.siglip2 import patch_input_from_processor
from vitlab.checkpoint.formats import export_checkpoint
from vitlab.errors import CheckpointError
from vitlab.layers.patch_embed import patchify

TOLERANCE = 1e-4


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}.io.npz", allow_pickle=False) as io:
        return dict(io)


def outputs(model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(last hidden state after the final norm, pooled output) of a vitlab model."""
    with torch.no_grad():
        out = model.forward_analysis(inputs, attention_layers=None, hidden_states=False)
    return out["encoder"], out["pre_logits"]


def assert_close(actual: torch.Tensor, expected: np.ndarray) -> None:
    torch.testing.assert_close(actual, torch.from_numpy(expected), atol=TOLERANCE, rtol=0)


# ------------------------------------------------------------------------------ transformers' layouts
@pytest.mark.parametrize("name", ["hf_dinov3", "hf_dinov3_swiglu", "hf_aimv2_vision", "hf_siglip2_vision"])
def test_a_transformers_checkpoint_gives_its_hidden_states_and_pooled_output(name):
    io = reference(name)
    model = load_model(FIXTURES / name)
    assert model.config.family == {"hf_a": "aimv2", "hf_s": "siglip2"}.get(name[:4], "dinov3")
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])


def test_dinov3_rotary_positions_follow_a_non_square_grid_with_nothing_resampled():
    io = reference("hf_dinov3_swiglu")  # patch 8: 40x64 is a 5x8 grid, the model made for 32x32
    model = load_model(FIXTURES / "hf_dinov3_swiglu")
    assert model.config.mlp == "swiglu" and not model.config.key_bias and model.pos_embed is None
    model.dynamic_size = True
    hidden, pooled = outputs(model, torch.from_numpy(io["input_wide"]))
    assert hidden.shape[1] == 1 + 2 + 5 * 8
    assert_close(hidden, io["last_hidden_state_wide"])
    assert_close(pooled, io["features_wide"])


def test_siglip2_naflex_runs_each_image_at_its_own_aspect_ratio_in_one_padded_batch():
    io = reference("hf_siglip2_vision")
    model = load_model(FIXTURES / "hf_siglip2_vision")
    assert model.config.pos_resample == "bilinear_antialias"
    batch = patch_input_from_processor(
        torch.from_numpy(io["naflex_pixel_values"]),
        torch.from_numpy(io["naflex_pixel_attention_mask"]),
        torch.from_numpy(io["naflex_spatial_shapes"]),
    )
    hidden, pooled = outputs(model, batch)
    valid = torch.from_numpy(io["naflex_pixel_attention_mask"]).bool()
    assert_close(hidden[valid], io["naflex_last_hidden_state"][valid.numpy()])  # padding tokens are not compared
    assert_close(pooled, io["naflex_features"])


def test_a_siglip2_folder_without_its_processor_reads_naflex_on_its_num_patches_and_says_so(capsys):
    """Issue: config.json and weights alone (what `Siglip2VisionModel.save_pretrained` writes) were read as a
    stretch to the table's square; the model type is NaFlex, with config.json's num_patches as the budget."""
    from vitlab.checkpoint.families import siglip2

    siglip2.NOTED.clear()
    contract = load_model(FIXTURES / "hf_siglip2_vision").config.preprocessing
    assert (contract.mode, contract.patch, contract.max_patches, contract.upscale) == ("naflex", 4, 16, True)
    said = capsys.readouterr()
    assert said.out == "" and "no preprocessor_config.json beside it" in said.err
    assert "on at most 16 patches of 4x4 (config.json's num_patches)" in said.err
    load_model(FIXTURES / "hf_siglip2_vision")
    assert capsys.readouterr().err == ""  # once per checkpoint and process


def test_a_whole_model_folder_and_model_type_alone_choose_the_same_rows():
    for name, row in [("hf_dinov3", "hf-dinov3"), ("hf_aimv2_vision", "hf-aimv2"), ("hf_siglip2_vision", "hf-siglip2")]:
        config, _, kind = read_checkpoint(FIXTURES / name)
        assert kind == "hf" and config.family is not None, row


@pytest.mark.parametrize("name", ["hf_dinov3", "hf_dinov3_swiglu", "hf_aimv2_vision", "hf_siglip2_vision"])
def test_vitlab_writes_them_back_in_transformers_layout_and_transformers_loads_them_equal(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    io = reference(name)
    model = load_model(FIXTURES / name)
    export_checkpoint(model, tmp_path / "out", to="hf")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    reference_class = {
        "dinov3_vit": transformers.DINOv3ViTModel,
        "aimv2_vision_model": transformers.Aimv2VisionModel,
        "siglip2_vision_model": transformers.Siglip2VisionModel,
    }
    reloaded = reference_class[written["model_type"]].from_pretrained(tmp_path / "out").eval()
    images = torch.from_numpy(io["input_nchw"])
    with torch.no_grad():
        if written["model_type"] == "siglip2_vision_model":  # NaFlex takes cut patches: the 4x4 grid, all valid
            output = reloaded(
                pixel_values=patchify(images, 4),
                pixel_attention_mask=torch.ones(2, 16, dtype=torch.long),
                spatial_shapes=torch.tensor([[4, 4]] * 2),
            )
        else:
            output = reloaded(pixel_values=images)
    assert_close(output.last_hidden_state, io["last_hidden_state"])
    assert_close(output.pooler_output, io["features"])


def test_a_model_in_no_family_layout_is_refused_by_the_family_writer(tmp_path):
    model = load_model(FIXTURES / "hf_vit")
    model.config = model.config.replace(family="pe")
    with pytest.raises(CheckpointError, match="does not write pe models in transformers' layout"):
        export_checkpoint(model, tmp_path / "out", to="hf")
    plain = load_model(FIXTURES / "hf_vit")
    with pytest.raises(CheckpointError, match="a DINOv3 checkpoint needs rotary positions"):
        from vitlab.checkpoint.families.dinov3 import state_dict_to_hf

        state_dict_to_hf(plain.state_dict(), plain.config.replace(family="dinov3"))


# ------------------------------------------------------------------------------ timm's layouts
def timm_dinov3_from_hf(hf: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """The transformers DINOv3 fixture's weights under timm's EVA names (eva.py, `vit_*_patch16_dinov3_qkvb`):
    fused qkv weight, q_bias and v_bias (the zero key bias is a buffer timm does not save), gamma_1/gamma_2."""
    out = {
        "cls_token": hf["embeddings.cls_token"],
        "reg_token": hf["embeddings.register_tokens"],
        "patch_embed.proj.weight": hf["embeddings.patch_embeddings.weight"],
        "patch_embed.proj.bias": hf["embeddings.patch_embeddings.bias"],
        "norm.weight": hf["norm.weight"],
        "norm.bias": hf["norm.bias"],
    }
    for i in range(depth):
        layer, block = f"layer.{i}.", f"blocks.{i}."
        out[block + "attn.qkv.weight"] = torch.cat([hf[layer + f"attention.{p}_proj.weight"] for p in ("q", "k", "v")])
        out[block + "attn.q_bias"] = hf[layer + "attention.q_proj.bias"]
        out[block + "attn.v_bias"] = hf[layer + "attention.v_proj.bias"]
        out[block + "attn.proj.weight"] = hf[layer + "attention.o_proj.weight"]
        out[block + "attn.proj.bias"] = hf[layer + "attention.o_proj.bias"]
        out[block + "gamma_1"] = hf[layer + "layer_scale1.lambda1"]
        out[block + "gamma_2"] = hf[layer + "layer_scale2.lambda1"]
        for part in ("norm1", "norm2"):
            for kind in ("weight", "bias"):
                out[f"{block}{part}.{kind}"] = hf[f"{layer}{part}.{kind}"]
        mlp = (
            [("gate_proj", "fc1_g"), ("up_proj", "fc1_x"), ("down_proj", "fc2")]
            if layer + "mlp.gate_proj.weight" in hf
            else [("up_proj", "fc1"), ("down_proj", "fc2")]
        )
        for theirs, timm_name in mlp:
            for kind in ("weight", "bias"):
                out[f"{block}mlp.{timm_name}.{kind}"] = hf[f"{layer}mlp.{theirs}.{kind}"]
    return out


@pytest.mark.parametrize("name", ["hf_dinov3", "hf_dinov3_swiglu"])
def test_a_timm_dinov3_file_gives_the_reference_outputs(tmp_path, name):
    io = reference(name)
    hf = load_file(FIXTURES / name / "model.safetensors")
    depth = json.loads((FIXTURES / name / "config.json").read_text())["num_hidden_layers"]
    save_file(timm_dinov3_from_hf(hf, depth), tmp_path / "dinov3.safetensors")
    # timm's DINOv3 heads are 64 wide; this 32-wide fixture has 4 heads of 8, which a file cannot say.
    model = load_model(tmp_path / "dinov3.safetensors", num_heads=4)
    assert read_checkpoint(tmp_path / "dinov3.safetensors", {"num_heads": 4})[2] == "timm"
    assert model.config.pos_embed == "rope" and model.config.register_tokens == 2
    model.config = model.config.replace(image_size=io["input_nchw"].shape[-1])  # timm's default input is 256
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])


def test_vitlab_writes_dinov3_back_in_timm_eva_names(tmp_path):
    from vitlab.checkpoint.families import family

    model = load_model(FIXTURES / "hf_dinov3")
    written = family("timm-dinov3").from_vitlab(model.state_dict(), model.config)
    hf = load_file(FIXTURES / "hf_dinov3" / "model.safetensors")
    expected = timm_dinov3_from_hf(hf, model.config.depth)
    assert set(written) == set(expected)
    assert all(torch.equal(written[key], expected[key]) for key in expected)


def timm_aimv2_from_hf(hf: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """The transformers AIMv2 fixture's encoder under timm's names (vision_transformer.py, `aimv2_*`): RmsNorm
    norms with weights only, `patch_embed.norm`, SwiGLU `fc1_g`/`fc1_x`/`fc2`, no biases; timm's AIMv2 has no
    attention-pooling head (it averages the tokens), so the head's tensors are left out."""
    out = {
        "patch_embed.proj.weight": hf["embeddings.patch_embed.weight"],
        "patch_embed.proj.bias": hf["embeddings.patch_embed.bias"],
        "patch_embed.norm.weight": hf["embeddings.rms_norm.weight"],
        "pos_embed": hf["embeddings.position_embedding.weight"][None],
        "norm.weight": hf["rms_norm.weight"],
    }
    for i in range(depth):
        layer, block = f"encoder.layers.{i}.", f"blocks.{i}."
        out[block + "norm1.weight"] = hf[layer + "rms_norm1.weight"]
        out[block + "norm2.weight"] = hf[layer + "rms_norm2.weight"]
        out[block + "attn.qkv.weight"] = torch.cat([hf[layer + f"attention.{p}_proj.weight"] for p in ("q", "k", "v")])
        out[block + "attn.proj.weight"] = hf[layer + "attention.out_proj.weight"]
        for theirs, timm_name in [("gate_proj", "fc1_g"), ("up_proj", "fc1_x"), ("down_proj", "fc2")]:
            out[f"{block}mlp.{timm_name}.weight"] = hf[f"{layer}ffn.{theirs}.weight"]
    return out


def test_a_timm_aimv2_file_gives_the_reference_hidden_states_and_timm_average(tmp_path):
    io = reference("hf_aimv2_vision")
    hf = load_file(FIXTURES / "hf_aimv2_vision" / "model.safetensors")
    save_file(timm_aimv2_from_hf(hf, 2), tmp_path / "aimv2.safetensors")
    model = load_model(tmp_path / "aimv2.safetensors", num_heads=4)
    config = model.config
    assert (config.norm, config.mlp, config.patch_norm, config.qkv_bias, config.proj_bias, config.mlp_bias) == (
        "rmsnorm",
        "swiglu",
        True,
        False,
        False,
        False,
    )
    assert config.layer_norm_eps == 1e-5 and config.classifier == "gap" and not config.class_token
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["last_hidden_state"].mean(axis=1))  # timm's AIMv2 pools by the mean


def test_a_timm_siglip2_file_is_siglip_layout():
    """timm's `vit_*_siglip*.v2_webli` models are SigLIP's timm layout (the existing `timm_siglip` fixture): the
    same names and MAP head, so they load as that fixture does."""
    config, _, kind = read_checkpoint(FIXTURES / "timm_siglip.safetensors")
    assert kind == "timm" and config.classifier == "map" and not config.class_token


# ------------------------------------------------------------------------------ training-time rope augmentation
def test_rope_coordinate_augmentation_acts_in_training_only():
    model = load_model(FIXTURES / "hf_dinov3")
    assert model.config.rope_rescale == 2.0  # DINOv3's released configuration
    images = torch.from_numpy(reference("hf_dinov3")["input_nchw"])
    torch.manual_seed(0)
    with torch.no_grad():
        evaluated = [outputs(model, images)[0] for _ in range(2)]
        model.train()
        trained = [model.forward_features(images) for _ in range(2)]
    assert torch.equal(evaluated[0], evaluated[1])
    assert not torch.allclose(trained[0], trained[1])  # a new rescale drawn per batch


def test_dinov3_key_bias_stays_zero_through_training_after_loading():
    """No key bias (DINOv3): the keys' third of the fused bias is zero after loading and no optimiser step moves
    it, while the query and value biases train."""
    model = load_model(FIXTURES / "hf_dinov3").train()
    bias = model.blocks[0].attn.qkv.bias
    dim = model.config.embed_dim
    before = bias.detach().clone()
    assert not before[dim : 2 * dim].any()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    images = torch.from_numpy(reference("hf_dinov3")["input_nchw"])
    for _ in range(2):
        optimizer.zero_grad()
        model.forward_features(images).square().mean().backward()
        optimizer.step()
    assert not bias[dim : 2 * dim].any()
    assert not torch.equal(bias[:dim], before[:dim]) and not torch.equal(bias[2 * dim :], before[2 * dim :])


@pytest.mark.run_level
def test_dinov3_exports_to_onnx_with_a_dynamic_size_its_rotary_tables_computed_in_the_graph(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    from vitlab.cli import main

    assert main(["export", str(FIXTURES / "hf_dinov3_swiglu"), "-o", str(tmp_path / "m.onnx"), "--dynamic-size"]) == 0
    io = reference("hf_dinov3_swiglu")
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    for images, expected in ((io["input_nchw"], io["features"]), (io["input_wide"], io["features_wide"])):
        (pooled,) = session.run(None, {session.get_inputs()[0].name: images})
        np.testing.assert_allclose(pooled, expected, atol=TOLERANCE, rtol=0)  # 32x32, then the 5x8 grid


@pytest.mark.slow
def test_a_fine_tuned_dinov3_is_served(tmp_path):
    """A backbone is refused by `serve` (features, not classes: issue 36 serves embeddings); fine-tuned, it serves
    predictions as `vitlab predict` gives them."""
    from serving import Server, png
    from vitlab.cli import main

    args = ["finetune", "--from", str(FIXTURES / "hf_dinov3"), "--dataset", "digits", "--epochs", "1"]
    args += ["--set", "max_train_images=100"]  # a fine-tuned model is what is served, not how well it learned
    assert main([*args, "--out-dir", str(tmp_path), "--set", "run_name=ft", "--set", "progress=false"]) == 0
    server = Server(tmp_path / "ft")
    try:
        status, _, body = server.post_image(png(np.full((16, 16), 128, dtype=np.uint8)))
    finally:
        server.stop()
    assert status == 200 and len(json.loads(body)["predictions"]) > 0


def test_dinov3_exported_to_timm_is_the_eva_layout_and_reads_back_equal(tmp_path):
    from vitlab.cli import main

    out = tmp_path / "dinov3-timm.safetensors"
    assert main(["convert", str(FIXTURES / "hf_dinov3"), str(out), "--to", "timm"]) == 0
    written = load_file(out)
    assert "blocks.0.gamma_1" in written and "blocks.0.attn.q_bias" in written and "blocks.0.ls1.gamma" not in written
    args = json.loads(out.with_suffix(".json").read_text())
    assert args["rope_type"] == "dinov3" and args["num_reg_tokens"] == 2 and args["global_pool"] == "token"
    io = reference("hf_dinov3")
    hidden, pooled = outputs(load_model(out), torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])


def test_the_image_tower_of_a_whole_siglip2_model_loads_with_its_text_half_set_aside(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=4)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=99)
    whole = transformers.Siglip2Model(
        transformers.Siglip2Config(vision_config={**vision, "num_patches": 16}, text_config=text)
    ).eval()
    whole.save_pretrained(tmp_path / "siglip2")
    model = load_model(tmp_path / "siglip2")
    assert model.config.family == "siglip2" and model.config.image_size == (16, 16)
    images = torch.randn(2, 3, 16, 16)
    patches = images.reshape(2, 3, 4, 4, 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, -1)
    with torch.no_grad():
        expected = whole.vision_model(
            pixel_values=patches,
            pixel_attention_mask=torch.ones(2, 16, dtype=torch.long),
            spatial_shapes=torch.tensor([[4, 4]] * 2),
        ).pooler_output
    torch.testing.assert_close(outputs(model, images)[1], expected, atol=TOLERANCE, rtol=0)


def test_dinov3_fine_tunes_at_a_higher_resolution_with_layer_wise_decay_and_nothing_to_resample(tmp_path):
    from vitlab.cli import main
    from vitlab.train.optim import param_groups

    source = load_model(FIXTURES / "hf_dinov3")
    groups = param_groups(source, weight_decay=0.05, lr=1.0, layer_decay=0.5)
    rates = {round(group["lr"], 6) for group in groups}
    assert rates == {0.125, 0.25, 0.5, 1.0}  # embeddings (patches, class and register tokens), 2 blocks, head
    args = ["finetune", "--from", str(FIXTURES / "hf_dinov3"), "--dataset", "digits", "--classes", "0-4"]
    args += ["--image-size", "32", "--epochs", "1", "--out-dir", str(tmp_path), "--set", "max_train_images=100"]
    assert main([*args, "--set", "run_name=ft", "--set", "layer_decay=0.75", "--set", "progress=false"]) == 0
    tuned = load_model(tmp_path / "ft")
    assert tuned.config.image_size == (32, 32) and tuned.pos_embed is None and tuned.head.out_features == 5
    assert tuned.config.family == "dinov3" and tuned.config.register_tokens == 2


# ------------------------------------------------------------------------------ Perception Encoder, timm's layout
def perception_encoder_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny PE core (timm `Eva`, attn_type "rope"): width 32, 4 heads, 2 blocks, patch 4 on 16x16, a class
    token, a learned table with its row, the pre-encoder norm, a bias-free patch projection, the attention pool
    (2 heads, MLP 4x) and a 16-wide projection head; random values, as timm's names and shapes are."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.1):
        return torch.randn(*shape, generator=generator) * scale

    def norm(prefix):
        return {prefix + ".weight": 1 + rand(32), prefix + ".bias": rand(32)}

    state = {
        "cls_token": rand(1, 1, 32),
        "pos_embed": rand(1, 17, 32),
        "patch_embed.proj.weight": rand(32, 3, 4, 4),
        **norm("norm_pre"),
        **norm("norm"),
        "attn_pool.latent": rand(1, 1, 32),
        "attn_pool.q.weight": rand(32, 32),
        "attn_pool.q.bias": rand(32),
        "attn_pool.kv.weight": rand(64, 32),
        "attn_pool.kv.bias": rand(64),
        "attn_pool.proj.weight": rand(32, 32),
        "attn_pool.proj.bias": rand(32),
        **norm("attn_pool.norm"),
        "attn_pool.mlp.fc1.weight": rand(128, 32),
        "attn_pool.mlp.fc1.bias": rand(128),
        "attn_pool.mlp.fc2.weight": rand(32, 128),
        "attn_pool.mlp.fc2.bias": rand(32),
        "head.weight": rand(16, 32),
        "head.bias": torch.zeros(16),
    }
    for i in range(2):
        block = f"blocks.{i}."
        state.update({**norm(block + "norm1"), **norm(block + "norm2")})
        state.update(
            {
                block + "attn.qkv.weight": rand(96, 32, scale=0.3),
                block + "attn.qkv.bias": rand(96),
                block + "attn.proj.weight": rand(32, 32),
                block + "attn.proj.bias": rand(32),
                block + "mlp.fc1.weight": rand(64, 32),
                block + "mlp.fc1.bias": rand(64),
                block + "mlp.fc2.weight": rand(32, 64),
                block + "mlp.fc2.bias": rand(32),
            }
        )
    return state


def timm_pe_forward(state: dict[str, torch.Tensor], images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's Eva forward for PE core, transcribed from eva.py, pos_embed_sincos.py (RotaryEmbeddingCat,
    interleaved pairs, grid_indexing "xy", grid_offset 1, temperature 10000) and attention_pool.py at commit
    aa4b5850, written apart from vitlab's code: (features after the final norm, the projected pooled output)."""
    import torch.nn.functional as F

    def layer_norm(x, prefix):
        return F.layer_norm(x, (32,), state[prefix + ".weight"], state[prefix + ".bias"], eps=1e-5)

    batch = len(images)
    x = F.conv2d(images, state["patch_embed.proj.weight"], stride=4).flatten(2).transpose(1, 2)  # (B, 16, 32)
    x = torch.cat([state["cls_token"].expand(batch, -1, -1), x], dim=1) + state["pos_embed"]
    x = layer_norm(x, "norm_pre")
    head_dim = 8
    bands = 1.0 / (10000 ** (torch.arange(0, head_dim // 4) / (head_dim // 4)))
    t = [torch.arange(4, dtype=torch.float32) + 1, torch.arange(4, dtype=torch.float32) + 1]  # (W, H) + offset
    grid = torch.stack(torch.meshgrid(t, indexing="xy"), dim=-1)  # (H, W, 2): [..., 0] column, [..., 1] row
    position = grid.unsqueeze(-1) * bands
    sin = position.sin().reshape(16, -1).repeat_interleave(2, -1)
    cos = position.cos().reshape(16, -1).repeat_interleave(2, -1)

    def rope(t):
        turned = torch.stack([-t[..., 1::2], t[..., ::2]], -1).reshape(t.shape)
        return torch.cat([t[:, :, :1], t[:, :, 1:] * cos + turned[:, :, 1:] * sin], dim=2)

    for i in range(2):
        block = f"blocks.{i}."
        qkv = F.linear(layer_norm(x, block + "norm1"), state[block + "attn.qkv.weight"], state[block + "attn.qkv.bias"])
        q, k, v = qkv.reshape(batch, 17, 3, 4, head_dim).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(rope(q), rope(k), v).transpose(1, 2).reshape(batch, 17, 32)
        x = x + F.linear(attended, state[block + "attn.proj.weight"], state[block + "attn.proj.bias"])
        hidden = F.gelu(
            F.linear(layer_norm(x, block + "norm2"), state[block + "mlp.fc1.weight"], state[block + "mlp.fc1.bias"])
        )
        x = x + F.linear(hidden, state[block + "mlp.fc2.weight"], state[block + "mlp.fc2.bias"])
    x = layer_norm(x, "norm")
    q = F.linear(state["attn_pool.latent"], state["attn_pool.q.weight"], state["attn_pool.q.bias"])
    q = q.reshape(1, 1, 2, 16).transpose(1, 2).expand(batch, -1, -1, -1)
    kv = F.linear(x, state["attn_pool.kv.weight"], state["attn_pool.kv.bias"]).reshape(batch, 17, 2, 2, 16)
    k, v = kv.permute(2, 0, 3, 1, 4)
    pooled = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, 1, 32)
    pooled = F.linear(pooled, state["attn_pool.proj.weight"], state["attn_pool.proj.bias"])
    hidden = F.gelu(
        F.linear(
            layer_norm(pooled, "attn_pool.norm"), state["attn_pool.mlp.fc1.weight"], state["attn_pool.mlp.fc1.bias"]
        )
    )
    pooled = pooled + F.linear(hidden, state["attn_pool.mlp.fc2.weight"], state["attn_pool.mlp.fc2.bias"])
    return x, F.linear(pooled[:, 0], state["head.weight"], state["head.bias"])


def test_a_timm_perception_encoder_gives_timms_outputs(tmp_path):
    state = perception_encoder_state()
    save_file(state, tmp_path / "pe.safetensors")
    args = {"architecture": "vit_pe_core_tiny_patch16_384", "model_args": {"num_heads": 4, "attn_pool_num_heads": 2}}
    (tmp_path / "pe.json").write_text(json.dumps(args))
    model = load_model(tmp_path / "pe.safetensors")
    config = model.config
    assert (config.family, config.pos_embed, config.rope_theta, config.pool_heads, config.num_classes) == (
        "pe",
        "pe_rope",
        10000.0,
        2,
        16,
    )
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    expected_hidden, expected_embedding = timm_pe_forward(state, images)
    with torch.no_grad():
        out = model.forward_analysis(images, attention_layers=None, hidden_states=False)
    torch.testing.assert_close(out["encoder"], expected_hidden, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out["logits"], expected_embedding, atol=TOLERANCE, rtol=0)
    # The same file without its JSON is told from a CLIP tower by its attention pool.
    (tmp_path / "pe.json").unlink()
    assert read_checkpoint(tmp_path / "pe.safetensors", {"num_heads": 4})[0].family == "pe"
    clip = load_file(FIXTURES / "timm_clip_quickgelu.safetensors")
    save_file(clip, tmp_path / "clip.safetensors")
    assert read_checkpoint(tmp_path / "clip.safetensors", {"num_heads": 4})[0].family != "pe"


def test_a_native_resolution_aimv2_computes_its_columns_first_sin_cos_table_for_each_grid(tmp_path):
    """AIMv2's native models (`is_native`) store no table: a fixed sin-cos one laid out [sin_w, cos_w, sin_h, cos_h]
    made for each image's grid (vitlab's sincos_order "columns_first"); written back, transformers reloads it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=4)
    reference_model = transformers.Aimv2VisionModel(
        transformers.Aimv2VisionConfig(**shape, image_size=16, is_native=True)
    )
    with torch.no_grad():
        for parameter in reference_model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    reference_model.eval().save_pretrained(tmp_path / "native")
    model = load_model(tmp_path / "native")
    assert (model.config.pos_embed, model.config.sincos_order) == ("sincos2d", "columns_first")
    model.dynamic_size = True
    export_checkpoint(model, tmp_path / "back", to="hf")
    reloaded = transformers.Aimv2VisionModel.from_pretrained(tmp_path / "back").eval()
    for size in ((16, 16), (12, 20)):  # its own grid, and a non-square one
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = reference_model(pixel_values=images)
            again = reloaded(pixel_values=images)
        hidden, pooled = outputs(model, images)
        for theirs in (expected, again):
            torch.testing.assert_close(hidden, theirs.last_hidden_state, atol=TOLERANCE, rtol=0)
            torch.testing.assert_close(pooled, theirs.pooler_output, atol=TOLERANCE, rtol=0)
