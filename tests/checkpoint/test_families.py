"""ViT families beyond the paper's model, through every command: a checkpoint of each loads by content and
works in info, eval, predict, finetune (new head), fewshot, linear-probe, analyze and export."""

import json

import pytest
import torch
from PIL import Image

from conftest import FIXTURES
from vitlab import load_model
from vitlab.cli import main
from vitlab.config import ViTConfig

# (family, checkpoint in tests/fixtures, has a classification head, a config field that marks the family)
FAMILIES = [
    ("DeiT, timm distilled", "timm_deit_distilled.safetensors", True, "distilled"),
    ("DeiT, HF with teacher", "hf_deit_teacher", True, "distilled"),
    ("DINO, HF ViTModel", "hf_dino", False, None),
    ("DINO, timm", "timm_dino.safetensors", False, None),
    ("MAE encoder, HF ViTMAEForPreTraining", "hf_mae", False, None),
    ("MAE fine-tuned, timm avg + fc_norm", "timm_vit_avg_cls.safetensors", True, "fc_norm"),
    ("DINOv2, HF Dinov2Model", "hf_dinov2", False, "layer_scale"),
    ("DINOv2 with registers, HF", "hf_dinov2_registers", False, "register_tokens"),
    ("DINOv2 with registers, timm", "timm_dinov2_registers.safetensors", False, "register_tokens"),
    ("DINOv2 with SwiGLU (giant, Web-SSL), HF", "hf_dinov2_swiglu", False, "mlp=swiglu"),
    ("CLIP image tower, HF with projection", "hf_clip_vision", False, "projection"),
    ("CLIP, whole HF CLIPModel (image tower)", "hf_clip", False, "pre_norm"),
    ("CLIP image tower, timm QuickGELU", "timm_clip_quickgelu.safetensors", False, "projection"),
    ("SigLIP image tower, HF", "hf_siglip_vision", False, None),
    ("SigLIP image tower, timm", "timm_siglip.safetensors", False, None),
    ("DINOv3, HF DINOv3ViTModel", "hf_dinov3", False, "register_tokens"),
    ("DINOv3 with SwiGLU, HF", "hf_dinov3_swiglu", False, "layer_scale"),
    ("AIMv2 image tower, HF", "hf_aimv2_vision", False, "patch_norm"),
    ("SigLIP 2 NaFlex image tower, HF", "hf_siglip2_vision", False, "family"),
    ("Perception Encoder core, timm", "timm_pe_core.safetensors", False, "pos_embed=pe_rope"),
]


# A family whose loaded model is the same architecture as an earlier row's (encoder and head config equal, checked
# below): analyze and export see only the built model, so they run once, on the earlier row (~3 s a family); the
# commands that read the checkpoint's own file and format (info, eval, predict, fewshot, linear-probe, finetune) run
# on every row.
SAME_ARCHITECTURE_AS = {
    "MAE encoder, HF ViTMAEForPreTraining": "hf_dino",
    "CLIP, whole HF CLIPModel (image tower)": "hf_clip_vision",
    "CLIP image tower, timm QuickGELU": "hf_clip_vision",
    "SigLIP image tower, timm": "hf_siglip_vision",
}


def architecture(config: ViTConfig) -> dict:
    """The parts of a config the built model's forward depends on (not its preprocessing or provenance)."""
    saved = config.to_dict()
    return {part: saved[part] for part in ("encoder", "head")}


@pytest.fixture
def digit_png(tmp_path):
    path = tmp_path / "seven.png"
    Image.new("L", (16, 16), 0).save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family, weights, has_head, marker", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_checkpoint_works_in_every_command(tmp_path, capsys, digit_png, family, weights, has_head, marker):
    checkpoint = str(FIXTURES / weights)
    assert main(["info", checkpoint, "--json"]) == 0
    config = ViTConfig.from_dict(json.loads(capsys.readouterr().out)["config"])
    assert (config.num_classes not in (0, 16)) == has_head  # 0: no head; 16: CLIP's projection
    if marker:
        key, _, value = marker.partition("=")
        assert str(getattr(config, key)) == value if value else getattr(config, key)
    eval_args = ["eval", checkpoint, "--dataset", "digits", "--out", str(tmp_path / "eval"), "--json"]
    if has_head:
        assert main(eval_args) == 0
        assert json.loads(capsys.readouterr().out)["count"] == 359
        assert main(["predict", checkpoint, str(digit_png), "--format", "json"]) == 0
        assert len(json.loads(capsys.readouterr().out)[0]["predictions"]) == 3
    else:  # an encoder: one clear message that says what works instead
        assert main(eval_args) != 0 and main(["predict", checkpoint, str(digit_png)]) != 0
        errors = capsys.readouterr().err
        assert errors.count("not classes") == 2  # "gives features, not classes" / "embeddings, not classes"
    assert main(["fewshot", checkpoint, "--dataset", "digits", "--shots", "1,2", "--seeds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feature_dim"] == 32
    assert main(["linear-probe", checkpoint, "--dataset", "digits", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["test_top1"] <= 1
    assert (
        main(
            [
                "finetune",
                "--from",
                checkpoint,
                "--dataset",
                "digits",
                "--classes",
                "0-4",
                "--epochs",
                "1",
                "--out-dir",
                str(tmp_path),
                "--set",
                "run_name=ft",
                "--set",
                "progress=false",
                "--set",
                "max_train_images=100",  # the head, the data and the path are the test; not how well it learns
            ]
        )
        == 0
    )
    tuned = load_model(tmp_path / "ft")
    assert tuned.config.num_classes == 5 and tuned.head.out_features == 5
    if tuned.config.distilled:
        assert tuned.head_dist.out_features == 5
    if family in SAME_ARCHITECTURE_AS:
        twin = load_model(FIXTURES / SAME_ARCHITECTURE_AS[family]).config
        assert architecture(config) == architecture(twin)  # analyze and export ran on that row
        return
    assert (
        main(
            [
                "analyze",
                checkpoint,
                "--images",
                "digits",
                "--out",
                str(tmp_path / "analysis"),
                "--num-images",
                "2",
                "--distance-images",
                "8",
            ]
        )
        == 0
    )
    assert (tmp_path / "analysis" / "report.html").is_file()
    if config.class_token:  # DINO's well-known pictures; SigLIP has no class token to draw
        assert (tmp_path / "analysis" / "class_token_attention.png").is_file()
    pytest.importorskip("onnxruntime")
    export = ["export", checkpoint, "-o", str(tmp_path / "model.onnx"), "--dynamic-batch"]
    if config.naflex_contract is not None:  # each image its own grid: no one size
        assert main(export) == 2 and "an exported graph takes images of one size" in capsys.readouterr().err
        return
    assert main(export) == 0
    assert (tmp_path / "model.onnx").is_file()


def test_a_distilled_model_averages_its_two_heads():
    model = load_model(FIXTURES / "timm_deit_distilled.safetensors")
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(images)
        expected = (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
        torch.testing.assert_close(model(images), expected)
        out = model.forward_analysis(images, attention_layers=None)
        torch.testing.assert_close(out["logits"], expected)
        torch.testing.assert_close(out["pre_logits"], (tokens[:, 0] + tokens[:, 1]) / 2)
