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
