"""Issue 51's backbones: DINOv2 with SwiGLU (the giant model, Web-SSL), C-RADIO, TIPSv2 and EUPE load by content
from the layouts they come in with the reference code's outputs.

The transformers fixtures (tests/fixtures/hf_dinov2_swiglu, ...) were written by transformers itself
(tools/make_backbone_fixtures.py): tiny random configs, every parameter perturbed (std 0.05)."""

from __future__ import annotations

import numpy as np
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
