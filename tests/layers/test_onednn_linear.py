"""The oneDNN fp32 linear: the same logits and gradients as nn.Linear, parameters and keys untouched."""

import copy

import pytest
import torch
from torch import nn

from conftest import FIXTURES, REFERENCE_CHECKPOINTS, reference_io
from vitlab import create_model, load_model
from vitlab.layers.onednn_linear import (
    OneDNNLinear,
    fp32_kernel,
    fp32_kernels_of,
    onednn_available,
    use_fp32_kernel,
)

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN linear")


@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
def test_reference_logits_within_1e4_on_onednn(name, weights):
    images, expected = reference_io(name)
    model = load_model(FIXTURES / weights)
    use_fp32_kernel(model, "onednn")
    assert any(isinstance(m, OneDNNLinear) for m in model.modules())
    with torch.no_grad():
        logits = model(images)
    assert (logits - expected).abs().max().item() <= 1e-4


def test_training_step_gradients_match_torch(monkeypatch):
    from vitlab.layers import onednn_linear

    calls = []
    real_apply = onednn_linear.OneDNNLinearFunction.apply
    monkeypatch.setattr(onednn_linear.OneDNNLinearFunction, "apply", lambda *args: calls.append(1) or real_apply(*args))
    torch.manual_seed(0)
    plain = create_model("digits-8").train()
    fast = copy.deepcopy(plain)
    use_fp32_kernel(fast, "torch", "onednn")
    images, labels = torch.randn(6, 1, 8, 8), torch.arange(6) % 10
    for model in (plain, fast):
        nn.functional.cross_entropy(model(images), labels).backward()
    assert calls  # the oneDNN forward ran
    for (name, ours), theirs in zip(fast.named_parameters(), plain.parameters()):
        assert ours.grad is not None, name
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_packed_weight_follows_an_update():
    torch.manual_seed(0)
    model = create_model("digits-8")
    use_fp32_kernel(model, "onednn")
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        model(images)  # packs
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)  # as an optimizer step would
        after = model(images)
        use_fp32_kernel(model, "torch")
        torch.testing.assert_close(after, model(images), rtol=1e-5, atol=1e-5)


def test_class_swap_keeps_keys_and_copies_and_the_context_restores():
    model = create_model("digits-8")
    keys = list(model.state_dict())
    use_fp32_kernel(model, "torch", "onednn")
    with torch.no_grad(), fp32_kernel(model, "onednn"):
        assert fp32_kernels_of(model) == ("onednn", "onednn")
        model(torch.randn(2, 1, 8, 8))
        copied = copy.deepcopy(model)  # EMA and bench copy models: the packed weights stay behind
    assert fp32_kernels_of(model) == ("torch", "onednn") and fp32_kernels_of(copied) == ("onednn", "onednn")
    assert list(model.state_dict()) == keys == list(copied.state_dict())
    use_fp32_kernel(model, "torch", "torch")
    assert not any(isinstance(m, OneDNNLinear) for m in model.modules())
    with pytest.raises(ValueError, match="fp32 kernel"):
        use_fp32_kernel(model, "mkl")


def test_bf16_autocast_and_bf16_weights_keep_nn_linear(monkeypatch):
    from vitlab.layers import onednn_linear

    def refuse(*args):
        raise AssertionError("oneDNN's fp32 linear ran on bf16")

    monkeypatch.setattr(onednn_linear, "onednn_linear", refuse)
    monkeypatch.setattr(onednn_linear.OneDNNLinearFunction, "apply", refuse)
    model = create_model("digits-8")
    use_fp32_kernel(model, "onednn", "onednn")
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(images).dtype == torch.bfloat16  # autocast's own linear, not an fp32 oneDNN one
    assert model.to(torch.bfloat16)(images.bfloat16()).dtype == torch.bfloat16


def test_a_model_copied_under_inference_mode_runs():
    model = create_model("digits-8")
    images = torch.randn(2, 1, 8, 8)
    with torch.inference_mode():
        copied = copy.deepcopy(model)  # inference tensors: no version counter
        use_fp32_kernel(copied, "onednn")
        torch.testing.assert_close(copied(images), model(images), rtol=1e-5, atol=1e-5)


def test_a_learning_bias_beside_a_frozen_weight_gets_its_gradient():
    layer = nn.Linear(4, 3)
    use_fp32_kernel(layer, "onednn", "torch")
    layer.weight.requires_grad_(False)
    layer(torch.randn(2, 4)).sum().backward()
    assert layer.bias.grad is not None
