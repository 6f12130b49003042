"""`vitlab info MODEL --trace` (vitlab.analysis.trace): the walk of one image ends in the model's own output, its
steps' parameters add up to the model's, and it works for the paper's variants, hybrids and the families."""

import pytest
import torch

from conftest import FIXTURES
from vitlab.analysis.trace import trace
from vitlab.cli import main
from vitlab.config import ViTConfig
from vitlab.models.vit import VisionTransformer
from vitlab.variants import variant_config

SMALL = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=5)
CASES = {
    "token": {},
    "gap": dict(classifier="gap", class_token=False),
    "map": dict(classifier="map"),
    "layer_weighted": dict(classifier="layer_weighted"),
    "registers": dict(register_tokens=2, classifier="gap"),
    "distilled": dict(distilled=True),
    "relative": dict(pos_embed="relative"),
    "every_block": dict(pos_embed_placement="every_block"),
    "sincos": dict(pos_embed="sincos2d"),
    "representation": dict(representation_size=24),
    "layer_scale": dict(layer_scale=0.1),
}


@pytest.mark.parametrize("case", CASES)
def test_the_walk_ends_in_the_models_output(case):
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(in_chans=3, **SMALL, **CASES[case])).eval()
    for parameter in model.parameters():  # zero heads would make every output equal
        torch.nn.init.normal_(parameter, std=0.1) if parameter.requires_grad else None
    image = torch.randn(1, 3, 16, 16)
    steps = trace(model, image)
    torch.testing.assert_close(steps[-1].tensor, model(image), rtol=0, atol=1e-6)
    assert sum(step.params for step in steps) == sum(p.numel() for p in model.parameters())
    assert steps[0].tensor.shape == (1, 3, 16, 16) and steps[1].tensor.shape == (1, 16, 48)  # 16 patches of 4x4x3


def test_a_hybrid_walks_through_its_resnet_stem():
    model = VisionTransformer(variant_config("R26+S/32", image_size=64, num_classes=3, depth=1)).eval()
    image = torch.randn(1, 3, 64, 64)
    steps = trace(model, image)
    assert steps[1].name.startswith("ResNet stem")
    torch.testing.assert_close(steps[-1].tensor, model(image), rtol=0, atol=1e-5)


def test_the_cli_traces_a_variant_and_a_checkpoint_with_activation_statistics(capsys):
    assert main(["info", "B/16", "--trace"]) == 0
    out = capsys.readouterr().out
    assert "cut into 196 patches of 16x16x3, each flattened" in out and "(1, 196, 768)" in out
    assert "(1, 197, 768)" in out and "block 12 of 12" in out and "(eq. 4)" in out
    assert "parameters used on the way: 86,567,656" in out
    assert main(["info", str(FIXTURES / "hf_dinov2"), "--trace"]) == 0
    out = capsys.readouterr().out
    assert "mean     std" in out and "prepend the class token" in out
    header, rule = out.splitlines()[1:3]
    assert len(rule) == len(header.rstrip()) and set(rule.strip()) == {"-"}  # the rule runs under every column
    assert "note: scaled per channel by LayerScale's learned gamma" in out  # DINOv2's ls1 / ls2


def test_the_trace_shows_the_rotary_step_with_its_equation_and_the_patch_norm(capsys):
    assert main(["info", str(FIXTURES / "hf_dinov3"), "--trace"]) == 0
    out = capsys.readouterr().out
    assert "block 1: 2-D rotary positions: turn the patch tokens' queries and keys (theta 100; the 3 prefix" in out
    assert "q' = q cos(a) + rotate_half(q) sin(a),  a(r, c) = 2 pi [y f; x f; y f; x f]" in out
    assert "block 2 of 2: the same seven steps" in out
    assert main(["info", str(FIXTURES / "hf_aimv2_vision"), "--trace"]) == 0
    out = capsys.readouterr().out
    assert "note: then a RMSNorm of every projected patch" in out or "of every projected patch" in out
    assert "pool: attention pooling from a learned query (AIMv2)" in out
