"""Parity with the reference implementations: each reference checkpoint reproduces the logits its own code
computed, and vitlab's exports give the same logits in transformers."""

import pytest
import torch

from conftest import FIXTURES, REFERENCE_CHECKPOINTS, reference_io
from vitlab import load_model
from vitlab.checkpoint.formats import export_checkpoint


@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
def test_reference_checkpoint_reproduces_its_logits(name, weights):
    images, expected = reference_io(name)
    model = load_model(FIXTURES / weights)
    with torch.no_grad():
        logits = model(images)
    assert (logits - expected).abs().max().item() <= 1e-4


def test_hf_export_loads_in_transformers_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = load_model(FIXTURES / "jax_vit_token.npz")  # tanh GELU: checks the activation is carried over
    export_checkpoint(model, tmp_path / "hf", to="hf")
    theirs = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    images, expected = reference_io("jax_vit_token")
    with torch.no_grad():
        assert (theirs(pixel_values=images).logits - expected).abs().max().item() <= 1e-4


def test_transformers_model_of_paper_shape_matches(tmp_path):
    """A randomly initialised transformers ViT (6 heads of 64, the paper's head width) saved with
    save_pretrained gives the same logits through vitlab."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=384,
        num_hidden_layers=2,
        num_attention_heads=6,
        intermediate_size=1536,
        num_labels=7,
    )
    theirs = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(pixel_values=images).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["hf_deit_teacher", "timm_deit_distilled"])
def test_deit_hf_export_loads_in_transformers_with_the_same_logits(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    model = load_model(FIXTURES / (name if name.startswith("hf") else f"{name}.safetensors"))
    export_checkpoint(model, tmp_path / "hf", to="hf")
    theirs = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == "DeiTForImageClassificationWithTeacher"
    images, expected = reference_io(name)
    with torch.no_grad():
        assert (theirs(pixel_values=images).logits - expected).abs().max().item() <= 1e-4
