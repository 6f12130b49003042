"""Issue 51's backbones: DINOv2 with SwiGLU (the giant model, Web-SSL), C-RADIO, TIPSv2 and EUPE load by content
from the layouts they come in with the reference code's outputs.

The transformers fixtures (tests/fixtures/hf_dinov2_swiglu, ...) were written by transformers itself
(tools/make_backbone_fixtures.py): tiny random configs, every parameter perturbed (std 0.05)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from vitlab import load_model, read_checkpoint

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


# ------------------------------------------------------------------------------ DINOv2 with SwiGLU, Web-SSL
def test_a_dinov2_file_with_swiglu_gives_its_hidden_states_and_pooled_output():
    """Dinov2Model with use_swiglu_ffn (facebook/dinov2-giant, facebook/webssl-dino*): the fused `weights_in`
    (gate rows, then value rows) is vitlab's SwiGLU; transformers rounds the hidden width, 2/3 of 64 up to 48."""
    io = reference("hf_dinov2_swiglu")
    config, _, kind = read_checkpoint(FIXTURES / "hf_dinov2_swiglu")
    assert kind == "hf" and (config.mlp, config.mlp_dim, config.layer_scale) == ("swiglu", 48, 1.0)
    hidden, pooled = outputs(load_model(FIXTURES / "hf_dinov2_swiglu"), torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])


def test_webssl_is_a_family_of_the_dinov2_layout():
    from vitlab.checkpoint.families import model_families

    assert {model.name: model.layouts for model in model_families()}["webssl"] == ("hf-dinov2",)


@pytest.mark.parametrize("name", ["hf_dinov2", "hf_dinov2_registers", "hf_dinov2_swiglu"])
def test_vitlab_writes_dinov2_back_and_transformers_loads_it_equal(tmp_path, name):
    """`export --to hf` of a DINOv2 file: Dinov2Model's layout (Dinov2WithRegistersModel's with registers, the class
    token's folded position a zero row again; SwiGLU's gate and value fused back into `weights_in`), every tensor
    found by transformers, and the reloaded model equal to transformers' own on the fixture; `bench` compares with the
    same class."""
    transformers = pytest.importorskip("transformers")
    from vitlab.checkpoint.families import reference_class
    from vitlab.checkpoint.formats import export_checkpoint

    io = reference(name)
    model = load_model(FIXTURES / name)
    export_checkpoint(model, tmp_path / "out", to="hf")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    expected_class = "Dinov2WithRegistersModel" if model.config.register_tokens else "Dinov2Model"
    assert model.config.family == "dinov2" and written["architectures"] == [expected_class]
    assert reference_class(model.config) == expected_class
    dinov2_class = getattr(transformers, expected_class)
    reloaded, loading = dinov2_class.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(loading.values()), loading  # no tensor missing, unexpected or mismatched
    original = dinov2_class.from_pretrained(FIXTURES / name).eval()
    images = torch.from_numpy(io["input_nchw"])
    with torch.no_grad():
        theirs, ours = original(pixel_values=images), reloaded.eval()(pixel_values=images)
    for output in ("last_hidden_state", "pooler_output"):
        torch.testing.assert_close(getattr(ours, output), getattr(theirs, output), atol=1e-5, rtol=0)
    assert_close(ours.pooler_output, io["features"])
    assert_close(outputs(model, images)[1], io["features"])  # vitlab's pooled output is Dinov2Model's pooler_output


def test_a_dinov2_model_transformers_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.errors import CheckpointError

    model = load_model(FIXTURES / "hf_dinov2_swiglu")
    model.config = model.config.replace(mlp_dim=44)  # no whole mlp_ratio gives a SwiGLU 44 wide (a multiple of 8)
    with pytest.raises(CheckpointError, match="transformers' DINOv2 needs an MLP width a whole mlp_ratio builds"):
        export_checkpoint(model, tmp_path / "out", to="hf")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ C-RADIO
def radio_outputs(model, pixels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summary, features, last_hidden_state) of a vitlab C-RADIO model for [0, 1] pixels, normalised first with
    the config's statistics (RadioModel's input conditioner)."""
    mean, std = (torch.tensor(values).view(-1, 1, 1) for values in (model.config.image_mean, model.config.image_std))
    hidden, pooled = outputs(model, (torch.from_numpy(pixels) - mean) / std)
    return pooled, hidden[:, model.config.num_prefix_tokens :], hidden


@pytest.mark.parametrize("name", ["hf_radio", "hf_radio_swiglu"])
def test_a_radio_file_gives_its_summary_features_and_hidden_states_at_its_size_and_a_non_square_one(name):
    io = reference(name)
    config, _, kind = read_checkpoint(FIXTURES / name)
    assert kind == "hf" and config.family == "radio" and config.pos_embed == "cpe" and not config.final_norm
    assert config.summary_tokens == (0, 2) and config.num_prefix_tokens == 5 and not config.prefix_positions
    assert config.mlp == ("swiglu" if name.endswith("swiglu") else "mlp")
    model = load_model(FIXTURES / name)
    model.dynamic_size = True
    for suffix in ("", "_wide"):  # the model's size, then 16x24 (patch 4) or 40x64 (patch 8)
        summary, features, hidden = radio_outputs(model, io["pixels" + suffix])
        assert_close(summary, io["summary" + suffix])
        assert_close(features, io["features" + suffix])
        assert_close(hidden, io["last_hidden_state" + suffix])


def test_the_cropped_table_is_resized_to_the_longer_side_then_cut():
    """A 4x6 grid of the 8x8 table: the table resized to 6x6, its first four rows kept (not a 4x6 resize)."""
    import torch.nn.functional as F

    model = load_model(FIXTURES / "hf_radio")
    table = model.pos_embed.detach().reshape(1, 8, 8, -1).permute(0, 3, 1, 2)  # (1, D, 8, 8)
    square = F.interpolate(table, size=(6, 6), mode="bilinear", align_corners=False)
    expected = square[:, :, :4, :].flatten(2).transpose(1, 2)  # (1, 24, D)
    torch.testing.assert_close(model.positions.table(model, (4, 6)), expected)


@pytest.mark.parametrize("name", ["hf_radio", "hf_radio_swiglu"])
def test_vitlab_writes_radio_back_and_transformers_loads_it_equal(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    from vitlab.checkpoint.formats import export_checkpoint

    io = reference(name)
    export_checkpoint(load_model(FIXTURES / name), tmp_path / "out", to="hf")
    reloaded = transformers.RadioModel.from_pretrained(tmp_path / "out").eval()
    for suffix in ("", "_wide"):
        with torch.no_grad():
            output = reloaded(pixel_values=torch.from_numpy(io["pixels" + suffix]))
        assert_close(output.summary, io["summary" + suffix])
        assert_close(output.features, io["features" + suffix])
        assert_close(output.last_hidden_state, io["last_hidden_state" + suffix])


@pytest.mark.slow
def test_radio_works_in_the_commands(tmp_path, capsys):
    """info, embed, knn, fewshot, linear-probe, analyze, finetune, dense features and ONNX export on the tiny
    C-RADIO (16x16 digits at patch 4): the summary (2 tokens of 32) is its 64-wide pooled output."""
    from vitlab.cli import main

    checkpoint = str(FIXTURES / "hf_radio")
    assert main(["info", checkpoint, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["config"]
    assert info["provenance"]["family"] == "radio" and info["encoder"]["pos_embed"] == "cpe"
    assert info["head"]["summary_tokens"] == [0, 2]
    out = str(tmp_path / "embed.parquet")
    assert main(["embed", checkpoint, "--dataset", "digits", "--split", "test", "-o", out, "--workers", "0"]) == 0
    assert main(["knn", checkpoint, "--dataset", "digits", "--json"]) == 0
    capsys.readouterr()
    assert main(["fewshot", checkpoint, "--dataset", "digits", "--shots", "1,2", "--seeds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feature_dim"] == 64
    assert main(["linear-probe", checkpoint, "--dataset", "digits", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["test_top1"] <= 1
    analysis = ["analyze", checkpoint, "--images", "digits", "--out", str(tmp_path / "analysis")]
    assert main([*analysis, "--num-images", "2", "--distance-images", "8"]) == 0
    assert (tmp_path / "analysis" / "report.html").is_file()
    finetune = ["finetune", "--from", checkpoint, "--dataset", "digits", "--classes", "0-4", "--epochs", "1"]
    finetune += ["--set", "max_train_images=100"]  # the new head is the test, not how well one epoch learns
    assert main([*finetune, "--out-dir", str(tmp_path), "--set", "run_name=ft", "--set", "progress=false"]) == 0
    tuned = load_model(tmp_path / "ft")
    assert tuned.head.in_features == 64 and tuned.head.out_features == 5
    dense = ["dense", checkpoint, "--dataset", "digits", "--split", "test", "-o", str(tmp_path / "dense")]
    assert main([*dense, "--size", "16x24", "--workers", "0"]) == 0
    pytest.importorskip("onnxruntime")
    assert main(["export", checkpoint, "-o", str(tmp_path / "model.onnx"), "--dynamic-batch"]) == 0


def test_radios_torch_hub_release_is_refused_with_what_to_load_instead(tmp_path):
    """NVlabs/RADIO's `.pth.tar` (hubconf.py: {"state_dict": base_model.*, input_conditioner.*, "args": an
    argparse.Namespace}), made here of the fixture's tensors: weights_only=True refuses the Namespace, and the message
    names it and points at the Hugging Face files, not at re-saving a state dict that would lack the settings."""
    import argparse

    from safetensors.torch import load_file

    from vitlab.errors import CheckpointError

    renamed = {"radio_model.model.": "base_model.", "radio_model.input_conditioner.": "input_conditioner."}
    state = {
        new + key.removeprefix(old): value
        for key, value in load_file(FIXTURES / "hf_radio" / "model.safetensors").items()
        for old, new in renamed.items()
        if key.startswith(old)
    }
    args = argparse.Namespace(model="vit_huge_patch16_224", teachers=[{"name": "clip", "use_summary": True}])
    torch.save({"state_dict": state, "args": args}, tmp_path / "c-radio_v3-b_half.pth.tar")
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(tmp_path / "c-radio_v3-b_half.pth.tar")
    message = str(refused.value)
    assert "argparse.Namespace" in message and "NVlabs/RADIO's torch.hub release" in message
    assert "hf-hub:nvidia/C-RADIOv4-H" in message and "re-save its state_dict" not in message
    torch.save({"state_dict": {"blocks.0.x": torch.zeros(1)}, "args": args}, tmp_path / "other.pth")
    with pytest.raises(CheckpointError, match="argparse.Namespace.*re-save its state_dict"):
        read_checkpoint(tmp_path / "other.pth")  # another file with a Namespace: the general advice


# ------------------------------------------------------------------------------ EUPE
def test_an_eupe_file_is_timm_dinov3_with_a_qkv_bias_and_gives_the_dinov3_reference(tmp_path):
    """timm's EUPE models (`vit_*_patch16_dinov3_qkvb.eupe_lvd1689m`) are its DINOv3 EVA layout with q_bias and
    v_bias: the transformers DINOv3 fixture under timm's names (test_families_2025's own table) reads as one and
    gives DINOv3ViTModel's outputs."""
    from safetensors.torch import load_file, save_file
    from test_families_2025 import timm_dinov3_from_hf

    io = reference("hf_dinov3")
    hf = load_file(FIXTURES / "hf_dinov3" / "model.safetensors")
    save_file(timm_dinov3_from_hf(hf, 2), tmp_path / "eupe.safetensors")
    config, _, kind = read_checkpoint(tmp_path / "eupe.safetensors", {"num_heads": 4})
    assert kind == "timm" and config.family == "dinov3" and config.qkv_bias and not config.key_bias
    model = load_model(tmp_path / "eupe.safetensors", num_heads=4)
    model.config = model.config.replace(image_size=16)  # timm's EUPE input is 256
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])


# ------------------------------------------------------------------------------ TIPSv2
def test_a_tipsv2_tower_gives_its_hidden_states_and_pooled_output_at_its_size_and_a_smaller_one():
    """Tipsv2VisionModel: DINOv2 with one register, told by config.json's model_type; its table shrunk to a 2x3
    grid bilinearly with antialiasing (DINOv2 would resize bicubic); [0, 1] pixels, no mean or std."""
    io = reference("hf_tipsv2_vision")
    config, _, kind = read_checkpoint(FIXTURES / "hf_tipsv2_vision")
    assert kind == "hf" and config.family == "tipsv2" and config.register_tokens == 1
    assert config.pos_resample == "bilinear_antialias" and (config.image_mean, config.image_std) == ((0.0,), (1.0,))
    model = load_model(FIXTURES / "hf_tipsv2_vision")
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])
    model.dynamic_size = True
    hidden, pooled = outputs(model, torch.from_numpy(io["input_small"]))
    assert_close(hidden, io["last_hidden_state_small"])
    assert_close(pooled, io["features_small"])


def test_a_tipsv2_file_is_told_by_its_tensor_names_without_its_config(tmp_path):
    """TIPS's own names (`register_tokens`, `mlp.c_fc`), which Tipsv2VisionModel's files keep, tell it from timm's
    ViT without config.json."""
    import shutil

    shutil.copy(FIXTURES / "hf_tipsv2_vision" / "model.safetensors", tmp_path / "model.safetensors")
    config = read_checkpoint(tmp_path / "model.safetensors", {"num_heads": 4})[0]
    assert config.family == "tipsv2" and config.register_tokens == 1 and config.image_size == (16, 16)


def test_the_image_tower_of_a_whole_tipsv2_model_loads_with_its_text_half_set_aside(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vision = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=99)
    whole = transformers.Tipsv2Model(transformers.Tipsv2Config(vision_config=vision, text_config=text)).eval()
    whole.save_pretrained(tmp_path / "tipsv2")
    model = load_model(tmp_path / "tipsv2")
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        expected = whole.vision_model(pixel_values=images).pooler_output
    assert model.config.family == "tipsv2"
    torch.testing.assert_close(outputs(model, images)[1], expected, atol=TOLERANCE, rtol=0)


def tipsv2_tower(transformers, **fields):
    """A tiny Tipsv2VisionModel built from a config alone, every parameter perturbed as the fixtures' are."""
    torch.manual_seed(0)
    shape = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    tower = transformers.Tipsv2VisionModel(transformers.Tipsv2VisionConfig(**shape, **fields)).eval()
    with torch.no_grad():
        for parameter in tower.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return tower


@pytest.mark.parametrize(
    "tower, mlp",
    [
        (None, ("mlp", 64)),  # the fixture, also at 8x12 (its table shrunk with antialiasing on both sides)
        (dict(mlp_ratio=2, use_swiglu_ffn=True), ("swiglu", 48)),  # the giant's fused w12: 2/3 of 64, rounded up
        (dict(mlp_ratio=1.875), ("mlp", 60)),  # a float mlp_ratio, as SO400M's
    ],
    ids=["fixture", "swiglu", "float_mlp_ratio"],
)
def test_vitlab_writes_a_tipsv2_tower_back_and_transformers_loads_it_equal(tmp_path, tower, mlp):
    transformers = pytest.importorskip("transformers")
    from vitlab.checkpoint.families import reference_class
    from vitlab.checkpoint.formats import export_checkpoint

    io = reference("hf_tipsv2_vision")
    if tower is None:
        source, inputs = FIXTURES / "hf_tipsv2_vision", [io["input_nchw"], io["input_small"]]
    else:
        source, inputs = tmp_path / "tower", [io["input_nchw"]]
        tipsv2_tower(transformers, **tower).save_pretrained(source)
    model = load_model(source)
    assert (model.config.mlp, model.config.mlp_dim) == mlp
    export_checkpoint(model, tmp_path / "out", to="hf")
    assert reference_class(model.config) == "Tipsv2VisionModel"
    reloaded, loading = transformers.Tipsv2VisionModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(loading.values()), loading  # no tensor missing, unexpected or mismatched
    original = transformers.Tipsv2VisionModel.from_pretrained(source).eval()
    model.dynamic_size = True
    for images in map(torch.from_numpy, inputs):
        with torch.no_grad():
            theirs, ours = original(pixel_values=images), reloaded.eval()(pixel_values=images)
        for output in ("last_hidden_state", "pooler_output"):
            torch.testing.assert_close(getattr(ours, output), getattr(theirs, output), atol=1e-5, rtol=0)
        torch.testing.assert_close(outputs(model, images)[1], theirs.pooler_output, atol=TOLERANCE, rtol=0)


def test_a_tipsv2_tower_transformers_cannot_hold_is_refused_naming_tips_in_the_rows_it_shares_with_dinov2(tmp_path):
    """The rows TIPSv2's writer shares with DINOv2's (hf.dinov2_style_checks) name TIPS, and keep TIPS's order."""
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.errors import CheckpointError

    model = load_model(FIXTURES / "hf_tipsv2_vision")
    model.config = model.config.replace(qk_norm=True, image_size=(16, 32))
    expected = (
        "transformers' TIPSv2 image tower needs TIPS's blocks (LayerNorm, every bias but perhaps the qkv's, no "
        "query-key norm), a square input size and patch (TIPS's square position table); export this model as "
        "vitlab's own file"
    )
    with pytest.raises(CheckpointError) as refused:
        export_checkpoint(model, tmp_path / "out", to="hf")
    assert str(refused.value) == expected
    assert not (tmp_path / "out").exists()


def timm_tipsv2_from_hf(hf: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """The transformers TIPSv2 fixture's weights under timm's names (vision_transformer.py,
    `vit_*_patch14_reg1_tipsv2`: VisionTransformer with reg_tokens=1, no_embed_class=True, init_values=1.0), as
    timm's `_convert_dinov2` makes them: `register_tokens` -> `reg_token`, the class token's position row added to
    the class token (neither prefix token has a position), `mlp.c_fc` / `mlp.c_proj` -> `mlp.fc1` / `mlp.fc2`, the
    mask token dropped."""
    table = hf["pos_embed"]  # (1, 1 + N, D): the class token's row, then the patches'
    out = {
        "cls_token": hf["cls_token"] + table[:, :1],
        "reg_token": hf["register_tokens"],
        "pos_embed": table[:, 1:],
        "patch_embed.proj.weight": hf["patch_embed.proj.weight"],
        "patch_embed.proj.bias": hf["patch_embed.proj.bias"],
        "norm.weight": hf["norm.weight"],
        "norm.bias": hf["norm.bias"],
    }
    renamed = {"mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for i in range(depth):
        block = f"blocks.{i}."
        for name in ["norm1", "attn.qkv", "attn.proj", "norm2", "mlp.c_fc", "mlp.c_proj"]:
            for kind in ("weight", "bias"):
                out[f"{block}{renamed.get(name, name)}.{kind}"] = hf[f"{block}{name}.{kind}"]
        out[block + "ls1.gamma"] = hf[block + "ls1.gamma"]
        out[block + "ls2.gamma"] = hf[block + "ls2.gamma"]
    return out


def test_a_timm_tipsv2_file_gives_the_reference_outputs_at_its_size_and_a_smaller_one(tmp_path):
    """timm's `vit_*_patch14_reg1_tipsv2.webli` on the hub: its tensors and config.json (architecture, the fixture's
    shape as model_args, timm's pretrained cfg: no mean or std). The architecture makes it TIPSv2 (its table shrunk
    bilinearly with antialiasing, as Tipsv2VisionModel does), so the fixture's outputs come back at 16x16 and 8x12."""
    from safetensors.torch import load_file, save_file

    io = reference("hf_tipsv2_vision")
    hf = load_file(FIXTURES / "hf_tipsv2_vision" / "model.safetensors")
    folder = tmp_path / "vit_base_patch14_reg1_tipsv2.webli"
    folder.mkdir()
    save_file(timm_tipsv2_from_hf(hf, 2), folder / "model.safetensors")
    timm_config = {
        "architecture": "vit_base_patch14_reg1_tipsv2",
        "num_classes": 0,
        "num_features": 32,
        "global_pool": "token",
        "model_args": {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 4, "img_size": 16},
        "pretrained_cfg": {
            "tag": "webli",
            "input_size": [3, 16, 16],
            "interpolation": "bicubic",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": [0.0, 0.0, 0.0],
            "std": [1.0, 1.0, 1.0],
            "num_classes": 0,
        },
    }
    (folder / "config.json").write_text(json.dumps(timm_config))
    config, _, kind = read_checkpoint(folder)
    assert kind == "timm" and config.family == "tipsv2" and config.register_tokens == 1
    assert not config.prefix_positions and config.classifier == "token" and config.layer_scale is not None
    assert (
        config.pos_resample == "bilinear_antialias"
        and set(config.image_mean) == {0.0}
        and set(config.image_std) == {1.0}
    )
    model = load_model(folder)
    hidden, pooled = outputs(model, torch.from_numpy(io["input_nchw"]))
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])
    model.dynamic_size = True
    hidden, pooled = outputs(model, torch.from_numpy(io["input_small"]))
    assert_close(hidden, io["last_hidden_state_small"])
    assert_close(pooled, io["features_small"])


def test_timm_names_tipsv2s_giant_with_24_heads():
    from vitlab.checkpoint.timm import hints_from_timm_json

    hints = hints_from_timm_json({"architecture": "vit_giant_patch14_reg1_tipsv2.webli"})
    assert hints["num_heads"] == 24 and hints["family"] == "tipsv2"
    assert hints_from_timm_json({"architecture": "vit_so400m_patch14_reg1_tipsv2.webli"})["num_heads"] == 16


# ------------------------------------------------------------------------------ timm's packed SwiGLU (DINOv2's giant)
def timm_dinov2_from_hf(hf: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """The transformers DINOv2 SwiGLU fixture's weights under timm's names (vision_transformer.py,
    `vit_giant_patch14_dinov2`): fused qkv, LayerScale `ls1.gamma` / `ls2.gamma`, and timm's `SwiGLUPacked` MLP, one
    `mlp.fc1` of the gate's rows then the value's (GluMlp with gate_last=False: act(first half) * second half), the
    order of transformers' `weights_in`."""
    out = {
        "cls_token": hf["embeddings.cls_token"],
        "pos_embed": hf["embeddings.position_embeddings"],  # (1, 1 + N, D): timm's DINOv2 gives the class token a row
        "patch_embed.proj.weight": hf["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": hf["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": hf["layernorm.weight"],
        "norm.bias": hf["layernorm.bias"],
    }
    for i in range(depth):
        layer, block = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            parts = [hf[f"{layer}attention.attention.{part}.{kind}"] for part in ("query", "key", "value")]
            out[f"{block}attn.qkv.{kind}"] = torch.cat(parts)
            for theirs, timm_name in [
                ("attention.output.dense", "attn.proj"),
                ("norm1", "norm1"),
                ("norm2", "norm2"),
                ("mlp.weights_in", "mlp.fc1"),
                ("mlp.weights_out", "mlp.fc2"),
            ]:
                out[f"{block}{timm_name}.{kind}"] = hf[f"{layer}{theirs}.{kind}"]
        out[block + "ls1.gamma"] = hf[layer + "layer_scale1.lambda1"]
        out[block + "ls2.gamma"] = hf[layer + "layer_scale2.lambda1"]
    return out


def test_a_timm_dinov2_giant_file_with_packed_swiglu_gives_the_reference_outputs(tmp_path):
    """timm's `vit_giant_patch14_dinov2` packs its SwiGLU into one `mlp.fc1` twice as wide as `fc2` reads: the timm
    row splits it into vitlab's gate and value, and the transformers fixture under those names gives Dinov2Model's
    outputs."""
    from safetensors.torch import load_file, save_file

    from vitlab.checkpoint.timm import hints_from_timm_json

    io = reference("hf_dinov2_swiglu")
    hf = load_file(FIXTURES / "hf_dinov2_swiglu" / "model.safetensors")
    state = timm_dinov2_from_hf(hf, 2)
    assert state["blocks.0.mlp.fc1.weight"].shape == (96, 32) and state["blocks.0.mlp.fc2.weight"].shape == (32, 48)
    save_file(state, tmp_path / "giant.safetensors")
    config, _, kind = read_checkpoint(tmp_path / "giant.safetensors", {"num_heads": 4})
    assert kind == "timm" and (config.mlp, config.mlp_dim, config.register_tokens) == ("swiglu", 48, 0)
    hidden, pooled = outputs(
        load_model(tmp_path / "giant.safetensors", num_heads=4), torch.from_numpy(io["input_nchw"])
    )
    assert_close(hidden, io["last_hidden_state"])
    assert_close(pooled, io["features"])
    assert hints_from_timm_json({"architecture": "vit_giant_patch14_dinov2.lvd142m"})["num_heads"] == 24


# ------------------------------------------------------------------------------ the commands on issue 51's fixtures
COMMAND_FIXTURES = ["hf_radio", "hf_tipsv2_vision", "hf_dinov2_swiglu"]


def reference_patches(model, name: str) -> tuple[torch.Tensor, np.ndarray]:
    """(the model's input, the reference's patch tokens (B, N, D)) of a fixture: C-RADIO's `features` for pixels
    normalised as vitlab's preprocessing does, the others' last hidden state less its prefix tokens."""
    io = reference(name)
    if name == "hf_radio":
        mean, std = (
            torch.tensor(values).view(-1, 1, 1) for values in (model.config.image_mean, model.config.image_std)
        )
        return (torch.from_numpy(io["pixels"]) - mean) / std, io["features"]
    return torch.from_numpy(io["input_nchw"]), io["last_hidden_state"][:, model.config.num_prefix_tokens :]


@pytest.mark.parametrize("name", COMMAND_FIXTURES)
def test_dense_features_are_the_reference_patch_tokens(name):
    """What `vitlab dense` stores (`dense_features`, the last block after the model's final norm; C-RADIO has none)
    is the reference's patch tokens on their grid."""
    from vitlab.dense.features import dense_features

    model = load_model(FIXTURES / name)
    images, expected = reference_patches(model, name)
    grid = dense_features(model, images).grids[0]  # (B, D, rows, cols)
    assert grid.shape[-2:] == (4, 4)
    assert_close(grid.flatten(2).transpose(1, 2), expected)


async def asgi_request(app, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request through the ASGI app, as uvicorn makes it: (status, body)."""
    path, _, query = target.partition("?")
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"content-type", b"image/png"), (b"content-length", str(len(body)).encode())],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("test", 80),
        "client": ("test", 1),
        "root_path": "",
    }
    messages: list[dict] = []
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


@pytest.mark.parametrize("name", COMMAND_FIXTURES)
def test_the_families_serve_predictions_patches_and_explanations(tmp_path, name):
    """`vitlab serve` on each fixture given a 3-class head (an encoder alone is refused: it has no classes): the
    app started as uvicorn starts it (its batcher in the lifespan), a 30x20 photo's classes, patch colours and
    attention map."""
    import asyncio
    import io as bytes_io

    from PIL import Image

    pytest.importorskip("starlette")
    from vitlab.checkpoint.io import save_model
    from vitlab.serve.app import create_app
    from vitlab.serve.engine import Engine

    model = load_model(FIXTURES / name)
    torch.manual_seed(0)
    model.reset_head(3, ["a", "b", "c"])
    engine = Engine(save_model(model, tmp_path / "model.safetensors"), precision="fp32", device="cpu")
    app = create_app(engine)
    buffer = bytes_io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((20, 30, 3)) * 255).astype(np.uint8)).save(buffer, format="PNG")

    async def session() -> list[tuple[int, bytes]]:
        to_app, from_app = asyncio.Queue(), asyncio.Queue()
        lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, to_app.get, from_app.put))
        await to_app.put({"type": "lifespan.startup"})
        assert (await from_app.get())["type"] == "lifespan.startup.complete"
        targets = ["/v1/predict", "/v1/patches", "/v1/explain?format=json"]
        answers = [await asgi_request(app, "POST", target, buffer.getvalue()) for target in targets]
        await to_app.put({"type": "lifespan.shutdown"})
        await lifespan
        return answers

    (predicted, prediction), (patched, patches), (explained, explanation) = asyncio.run(session())
    assert predicted == 200 and {p["label"] for p in json.loads(prediction)["predictions"]} == {"a", "b", "c"}
    assert patched == 200 and json.loads(patches)["grid"] == [4, 4]
    assert explained == 200 and np.asarray(json.loads(explanation)["map"]).shape == (4, 4)


@pytest.mark.run_level  # an ONNX export (torch.onnx's exporter: seconds)
@pytest.mark.parametrize("name", COMMAND_FIXTURES)
def test_the_families_export_to_onnx_and_analyze(tmp_path, capsys, name):
    """`vitlab export` (ONNX, checked against PyTorch by the command itself) and `vitlab analyze` on each fixture."""
    pytest.importorskip("onnxruntime")
    from vitlab.cli import main

    checkpoint = str(FIXTURES / name)
    assert main(["export", checkpoint, "-o", str(tmp_path / "model.onnx"), "--dynamic-batch"]) == 0
    assert "fp32 tolerance: max |logit diff| <= 0.0001: passed" in capsys.readouterr().out
    analysis = ["analyze", checkpoint, "--images", "digits", "--out", str(tmp_path / "analysis")]
    assert main([*analysis, "--num-images", "2", "--distance-images", "8"]) == 0
    assert (tmp_path / "analysis" / "report.html").is_file()
