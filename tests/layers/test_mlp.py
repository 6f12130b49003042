"""layers/mlp.py: the paper's MLP and SwiGLU (the in-place GELU of inference is a speed path: test_fast_paths.py)."""

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
