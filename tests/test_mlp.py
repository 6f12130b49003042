"""layers/mlp.py: without autograd the GELU runs in place on fc1's output; the results must be identical to the
autograd path's, the input untouched, and training unaffected."""

import pytest
import torch

from vitlab.layers.mlp import Mlp


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "quick_gelu"])
def test_inference_gives_the_training_path_values_and_leaves_the_input_alone(activation):
    torch.manual_seed(0)
    mlp = Mlp(16, 64, activation).eval()
    x = torch.randn(2, 5, 16)
    before = x.clone()
    with_grad = mlp(x)
    assert with_grad.requires_grad  # the out-of-place path, recorded for backward
    with torch.no_grad():
        no_grad = mlp(x)
    with torch.inference_mode():
        inference = mlp(x)
    assert torch.equal(with_grad.detach(), no_grad) and torch.equal(no_grad, inference)
    assert torch.equal(x, before)


def test_training_still_backpropagates_through_the_activation():
    torch.manual_seed(0)
    mlp = Mlp(8, 32)
    x = torch.randn(3, 4, 8, requires_grad=True)
    mlp(x).square().sum().backward()
    assert x.grad is not None and mlp.fc1.weight.grad.abs().sum() > 0
    # The GELU's derivative is used: replacing it with identity changes fc1's gradient.
    gradient = mlp.fc1.weight.grad.clone()
    mlp.zero_grad()
    mlp.act = torch.nn.Identity()
    mlp(x).square().sum().backward()
    assert not torch.allclose(gradient, mlp.fc1.weight.grad)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("where", ["fc1", "every module"])
def test_a_forward_hook_sees_fc1s_own_output(mode, where):
    """A hook on fc1 (or a global one) keeps fc1's output; the in-place GELU must not overwrite what it kept."""
    torch.manual_seed(0)
    mlp = Mlp(16, 64).eval()
    x = torch.randn(2, 5, 16)
    seen = {}

    def keep(module, inputs, output):
        if module is mlp.fc1:
            seen["fc1"] = output

    register = mlp.fc1.register_forward_hook if where == "fc1" else torch.nn.modules.module.register_module_forward_hook
    handle = register(keep)
    try:
        with mode():
            out = mlp(x)
            expected = torch.nn.functional.linear(x, mlp.fc1.weight, mlp.fc1.bias)
    finally:
        handle.remove()
    assert torch.equal(seen["fc1"], expected)  # pre-GELU values
    with torch.no_grad():
        assert torch.equal(out, mlp(x))  # and the block's output is what it is without the hook


def test_a_hook_on_the_activation_is_called():
    mlp = Mlp(8, 32).eval()
    calls = []
    mlp.act.register_forward_hook(lambda module, inputs, output: calls.append(output))
    with torch.no_grad():
        mlp(torch.randn(1, 3, 8))
    assert len(calls) == 1


def test_without_observers_inference_overwrites_fc1s_output_in_place(monkeypatch):
    """The fast path stays: with no hook anywhere the GELU is the in-place one (no second (B, T, 4D) buffer)."""
    mlp = Mlp(8, 32).eval()
    calls = []
    real = torch.ops.aten.gelu_

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "gelu_", counting)
    with torch.no_grad():
        mlp(torch.randn(1, 3, 8))
    with torch.inference_mode():
        mlp(torch.randn(1, 3, 8))
    assert len(calls) == 2


def test_swiglu_gates_with_silu_under_timms_names():
    from vitlab.layers.mlp import SwiGLU

    torch.manual_seed(0)
    mlp = SwiGLU(8, 12).eval()
    assert set(dict(mlp.named_parameters())) == {
        "fc1_g.weight",
        "fc1_g.bias",
        "fc1_x.weight",
        "fc1_x.bias",
        "fc2.weight",
        "fc2.bias",
    }
    x = torch.randn(2, 3, 8)
    gate, value = mlp.fc1_g(x), mlp.fc1_x(x)
    expected = mlp.fc2(gate * torch.sigmoid(gate) * value)
    torch.testing.assert_close(mlp(x), expected)


def test_the_mlp_table_has_every_name_the_config_takes_and_a_block_takes_its_factory():
    from vitlab.config import MLPS
    from vitlab.layers.block import Block
    from vitlab.layers.mlp import MLP_LAYERS, Mlp, SwiGLU, mlp_factory

    assert tuple(MLP_LAYERS) == MLPS
    assert isinstance(Block(16, 2, 24, mlp_layer=mlp_factory("swiglu")).mlp, SwiGLU)
    plain = Block(16, 2, 24, mlp_layer=mlp_factory("mlp", "quick_gelu")).mlp
    assert isinstance(plain, Mlp) and type(plain.act).__name__ == "QuickGELU"
