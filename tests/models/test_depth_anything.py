"""Depth Anything (models/depth_anything.py, layers/dpt.py, checkpoint/families/depth_anything.py): transformers'
`DepthAnythingForDepthEstimation` loads by content and gives the `predicted_depth` transformers computed, at the
backbone's own size and at a non-square one, for the relative and the metric head; it goes back out in
transformers' layout; the presets build with the released parameter counts; what vitlab does not build is refused.

The fixtures (tests/fixtures/hf_depth_anything*, tiny random models, every parameter perturbed) were written by
transformers 5.24 through tools/make_depth_fixtures.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES
from vitlab.checkpoint import families
from vitlab.checkpoint.families import depth_anything as family
from vitlab.checkpoint.formats import export_checkpoint, load_model
from vitlab.checkpoint.io import Weights
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError
from vitlab.head_configs import DPTConfig
from vitlab.layers.dpt import REASSEMBLE_FACTORS
from vitlab.models.depth_anything import DepthAnything
from vitlab.models.registry import create_model
from vitlab.variants import variant_config

TOLERANCE = 1e-4
FIXTURE_NAMES = ["hf_depth_anything", "hf_depth_anything_metric"]
SIZES = [("input_nchw", "depth"), ("input_wide", "depth_wide")]  # 16x16 (its own grid) and 20x28 (5x7)


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{name}.io.npz", allow_pickle=False) as io:
        return dict(io)


def depth_of(model: torch.nn.Module, images: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.from_numpy(images))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_a_transformers_checkpoint_gives_its_predicted_depth_square_and_not(name):
    io = reference(name)
    tensors = load_file(FIXTURES / name / "model.safetensors")
    sidecar = json.loads((FIXTURES / name / "config.json").read_text())
    for told_by in (dict(sidecar=sidecar), {}):  # its model_type, or its key signature alone
        assert families.family_of(Weights(name, "safetensors", tensors, **told_by)).name == "hf-depth-anything"
    model = load_model(FIXTURES / name)
    assert isinstance(model, DepthAnything) and model.config.family == "depth_anything"
    # out_indices [1, 2, 4, 5] count the embeddings as stage 0: blocks 0, 1, 3 and 4 of five.
    assert model.settings.layers == (0, 1, 3, 4) and model.config.num_classes == 0
    assert (model.settings.depth_range, model.settings.max_depth) == (
        ("metric", 20.0) if name.endswith("metric") else ("relative", 1.0)
    )
    for inputs, expected in SIZES:
        depth = depth_of(model, io[inputs])
        assert depth.shape == io[inputs].shape[:1] + io[inputs].shape[2:]  # (B, H, W): the input's pixels
        torch.testing.assert_close(depth, torch.from_numpy(io[expected]), atol=TOLERANCE, rtol=0)


def test_the_relative_reference_has_pixels_on_both_sides_of_its_relu():
    """Parity on an all-zero map would test nothing: the relative fixture's ReLU passes some pixels and not others,
    and its values vary by far more than the tolerance."""
    for _, expected in SIZES:
        depth = reference("hf_depth_anything")[expected]
        assert 0.05 < (depth > 0).mean() < 0.95 and depth.max() > 100 * TOLERANCE


def test_positions_resampled_otherwise_miss_the_non_square_reference():
    """The 5x7 grid takes the 4x4 table resampled bicubic, as DINOv2 does; bilinear would not give transformers'
    depth (so the non-square parity above checks the resampling)."""
    io = reference("hf_depth_anything_metric")
    model = load_model(FIXTURES / "hf_depth_anything_metric")
    model.encoder.config = model.encoder.config.replace(pos_resample="bilinear")  # the encoder reads its own
    assert float((depth_of(model, io["input_wide"]) - torch.from_numpy(io["depth_wide"])).abs().max()) > 10 * TOLERANCE


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_export_to_transformers_reloads_with_the_same_depth(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    io = reference(name)
    model = load_model(FIXTURES / name)
    folder = export_checkpoint(model, tmp_path / "hf", to="hf")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "depth_anything"
    theirs = transformers.DepthAnythingForDepthEstimation.from_pretrained(folder).eval()
    back = load_model(folder)
    for inputs, expected in SIZES:
        with torch.no_grad():
            predicted = theirs(pixel_values=torch.from_numpy(io[inputs])).predicted_depth
        torch.testing.assert_close(predicted, torch.from_numpy(io[expected]), atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(depth_of(back, io[inputs]), torch.from_numpy(io[expected]), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("size, millions", [("S", 24.8), ("B", 97.5), ("L", 335.3)])
def test_the_presets_have_the_released_parameter_counts(size, millions):
    """Depth-Anything-V2's README: Small 24.8M, Base 97.5M, Large 335.3M parameters (positions for 518x518)."""
    config = variant_config(f"depth-anything-v2-{size}/14", image_size=518)
    with torch.device("meta"):
        model = create_model(config)
    assert isinstance(model, DepthAnything)
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - millions) < 0.05


def test_a_preset_runs_at_any_size_of_whole_patches():
    model = create_model(variant_config("depth-anything-v2-S/14", image_size=28)).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 28, 42)).shape == (1, 28, 42)


def test_the_family_table_says_the_reassemble_factors_the_layers_build():
    assert family.REASSEMBLE_FACTORS == REASSEMBLE_FACTORS


def fixture_with_config(tmp_path, **changes) -> str:
    """A copy of the relative fixture whose config.json has `changes` (backbone_config's under "backbone")."""
    folder = tmp_path / "changed"
    shutil.copytree(FIXTURES / "hf_depth_anything", folder)
    config = json.loads((folder / "config.json").read_text())
    config["backbone_config"].update(changes.pop("backbone", {}))
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    "changes, said",
    [
        (dict(reassemble_factors=[4, 2, 1, 1]), "reassemble factors [4, 2, 1, 1]"),
        (dict(reassemble_hidden_size=8), "reassemble_hidden_size 8 other than the backbone's width 16"),
        (dict(backbone_config=dict(model_type="bit")), "a 'bit' backbone (DPT-hybrid's is 'bit')"),
        (dict(backbone=dict(use_swiglu_ffn=True)), "DINOv2's SwiGLU MLP"),
    ],
)
def test_what_vitlab_does_not_build_is_one_clear_error(tmp_path, changes, said):
    with pytest.raises(CheckpointError, match="vitlab does not build") as error:
        load_model(fixture_with_config(tmp_path, **changes))
    assert said in str(error.value)


def test_a_config_that_is_no_depth_model_is_refused():
    with pytest.raises(ConfigError, match="head is a DPTConfig"):
        DepthAnything(ViTConfig(image_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=0))
    with pytest.raises(ConfigError, match="four entries"):
        ViTConfig(head=DPTConfig(layers=(1, 2, 3), neck_sizes=(4, 8, 12, 16)), num_classes=0)
