"""models/fast_paths.py: each speed path against the plain layers. The in-place GELU must be bit-identical; the
other two change the shapes of matrix products (so the summation order), and are held to float32 rounding:
rtol 1e-5 over sums of at most 64 products of O(1) values (a few ulps each, eps 1.2e-7)."""

import copy

import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.layers.attention import KERNELS, PLAIN, Attention, AttentionContext
from vitlab.layers.block import Block
from vitlab.layers.mlp import Mlp
from vitlab.models import create_model, fast_paths

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5)


def randomised(config: ViTConfig):
    torch.manual_seed(0)
    model = create_model(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def backward_nodes(tensor):
    """The names of every node of the autograd graph behind `tensor`."""
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def counting_in_place_gelu(monkeypatch) -> list:
    calls = []
    real = torch.ops.aten.gelu_

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "gelu_", counting)
    return calls


# ------------------------------------------------------------------------------------------------ GELU in place
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "quick_gelu"])
def test_the_in_place_gelu_is_bit_identical_and_leaves_the_input_alone(activation):
    torch.manual_seed(0)
    mlp = Mlp(16, 64, activation).eval()
    x = torch.randn(2, 5, 16)
    before = x.clone()
    with torch.no_grad():
        plain = mlp(x)
        fast = fast_paths.mlp(mlp, x)
    with torch.inference_mode():
        inference = fast_paths.mlp(mlp, x)
    assert torch.equal(plain, fast) and torch.equal(plain, inference)
    assert torch.equal(x, before)


def test_without_observers_inference_overwrites_fc1s_output_in_place(monkeypatch):
    calls = counting_in_place_gelu(monkeypatch)
    mlp = Mlp(8, 32).eval()
    with torch.no_grad():
        fast_paths.mlp(mlp, torch.randn(1, 3, 8))
    with torch.inference_mode():
        fast_paths.mlp(mlp, torch.randn(1, 3, 8))
    fast_paths.mlp(mlp, torch.randn(1, 3, 8))  # autograd keeps fc1's output: out of place
    assert len(calls) == 2


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("where", ["fc1", "mlp", "every module"])
def test_a_forward_hook_sees_fc1s_own_output(mode, where):
    """A hook that could keep fc1's output turns the in-place GELU off: what it kept is not overwritten."""
    torch.manual_seed(0)
    mlp = Mlp(16, 64).eval()
    x = torch.randn(2, 5, 16)
    seen = {}

    def keep(module, inputs, output):
        if module is mlp.fc1:
            seen["fc1"] = output

    if where == "mlp":  # a hook on the MLP runs it through its own forward, which keeps fc1's output as it is
        handle = mlp.register_forward_hook(lambda module, inputs, output: None)
        handle_fc1 = mlp.fc1.register_forward_hook(keep)
    else:
        register = (
            mlp.fc1.register_forward_hook if where == "fc1" else torch.nn.modules.module.register_module_forward_hook
        )
        handle, handle_fc1 = register(keep), None
    try:
        with mode():
            out = fast_paths.mlp(mlp, x)
            expected = torch.nn.functional.linear(x, mlp.fc1.weight, mlp.fc1.bias)
    finally:
        handle.remove()
        if handle_fc1 is not None:
            handle_fc1.remove()
    assert torch.equal(seen["fc1"], expected)  # pre-GELU values
    with torch.no_grad():
        assert torch.equal(out, mlp(x))


# ------------------------------------------------------------------------------------------------ explicit backward
def test_training_with_the_explicit_kernel_takes_the_hand_written_backward_and_matches_sdpa():
    torch.manual_seed(0)
    attention = Attention(embed_dim=16, num_heads=4).train()
    x = torch.randn(2, 7, 16, requires_grad=True)
    sdpa_out = attention(x)
    sdpa_grads = torch.autograd.grad(sdpa_out.square().sum(), [x, attention.qkv.weight])
    explicit_out = fast_paths.attend(attention, x, AttentionContext(kernel="explicit"))
    assert "_ExplicitAttentionBackward" in backward_nodes(explicit_out)  # the hand-written backward is in the graph
    assert "_ExplicitAttentionBackward" not in backward_nodes(attention(x, kernel="explicit"))  # the plain layer's
    explicit_grads = torch.autograd.grad(explicit_out.square().sum(), [x, attention.qkv.weight])
    torch.testing.assert_close(explicit_out, sdpa_out, rtol=1e-5, atol=1e-6)
    for got, expected in zip(explicit_grads, sdpa_grads):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ query trimming
def test_attending_from_the_prefix_gives_the_full_calls_rows_and_gradients():
    """The last block of a class-token model computes the class token's output alone: the same values and
    gradients as the full block's first row, with either kernel."""
    torch.manual_seed(0)
    block = Block(embed_dim=16, num_heads=4, mlp_dim=32).train()
    x = torch.randn(3, 9, 16, requires_grad=True)
    for kernel in KERNELS:
        context = AttentionContext(kernel=kernel)
        full = block(x, context)[:, :1]
        (full_grad,) = torch.autograd.grad(full.sum(), x)
        pruned = fast_paths.run_block(block, x, context, queries=1)
        (pruned_grad,) = torch.autograd.grad(pruned.sum(), x)
        assert pruned.shape == (3, 1, 16)
        torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pruned_grad, full_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fields, pruned",
    [
        ({}, 1),
        ({"distilled": True}, 2),
        ({"register_tokens": 2}, 1),
        ({"classifier": "gap"}, None),
        ({"pos_embed": "relative"}, None),
        ({"classifier": "layer_weighted"}, None),
    ],
)
def test_a_class_token_head_skips_the_last_blocks_other_tokens_with_the_same_logits(fields, pruned, monkeypatch):
    config = ViTConfig(**{**TINY, **fields})
    model = randomised(config)
    assert fast_paths.head_tokens(config) == pruned
    images = torch.randn(4, 3, 16, 16)
    trimmed = []
    attend_first = fast_paths.attend_first

    def spy(attention, x, context, queries):  # what the last block computes, without a hook that would stop it
        trimmed.append(queries)
        return attend_first(attention, x, context, queries)

    monkeypatch.setattr(fast_paths, "attend_first", spy)
    logits = model(images)
    assert trimmed == ([pruned] if pruned else [])
    model.fast_paths = False
    torch.testing.assert_close(logits, model(images), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ through the weights
def spy_through_weights(monkeypatch) -> list:
    calls = []
    real = fast_paths.attend_first_through_weights

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(fast_paths, "attend_first_through_weights", spy)
    return calls


@pytest.mark.parametrize("queries", [1, 2])
@pytest.mark.parametrize("settings", [{}, {"key_bias": False}, {"qkv_bias": False}])
def test_queries_through_the_key_and_value_weights_give_the_projected_keys_rows(settings, queries, monkeypatch):
    """OpenVINO's last block (`Attention.queries_through_weights`) projects no key or value: the same rows as the
    projected keys and values give, in float64, where only the summation order differs; a key bias of any value
    (a constant per query under softmax) and a value bias included."""
    torch.manual_seed(0)
    attention = Attention(embed_dim=16, num_heads=4, **settings).double().eval()
    if attention.qkv.bias is not None:
        torch.nn.init.normal_(attention.qkv.bias, std=2.0)
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    expected = fast_paths.attend_first(attention, x, PLAIN, queries)
    calls = spy_through_weights(monkeypatch)
    attention.queries_through_weights = True
    got = fast_paths.attend_first(attention, x, PLAIN, queries)
    assert calls == [1] and got.shape == (3, queries, 16)
    torch.testing.assert_close(got, expected)


def test_a_wrapped_projection_a_hook_or_a_mask_keep_the_projected_keys(monkeypatch):
    """The path reads qkv's weight itself, so a wrapped projection (a LoRA-like layer adding its own term), a hook
    on it, or a mask over the keys sends the call through the projected keys and values."""

    class Adding(torch.nn.Module):  # a wrapper whose output is not its base layer's weight alone
        def __init__(self, base):
            super().__init__()
            self.base, self.weight, self.bias = base, base.weight, base.bias

        def forward(self, x):
            return self.base(x) + 0.5

    torch.manual_seed(0)
    attention = Attention(embed_dim=16, num_heads=4).eval()
    attention.queries_through_weights = True
    wrapped, hooked = copy.deepcopy(attention), copy.deepcopy(attention)
    wrapped.qkv = Adding(wrapped.qkv)
    hooked.qkv.register_forward_hook(lambda module, args, out: out * 2)
    x = torch.randn(2, 9, 16)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[..., -2:] = False
    calls = spy_through_weights(monkeypatch)
    plain = fast_paths.attend_first(attention, x, PLAIN, 1)
    assert calls == [1]
    for module, context in ((wrapped, PLAIN), (hooked, PLAIN), (attention, AttentionContext(attn_mask=mask))):
        got = fast_paths.attend_first(module, x, context, 1)
        module.queries_through_weights = False
        torch.testing.assert_close(got, fast_paths.attend_first(module, x, context, 1), rtol=0, atol=0)
        module.queries_through_weights = True
        assert not torch.allclose(got, plain)  # the wrapper, the hook and the mask each change the rows
    assert calls == [1]


# ------------------------------------------------------------------------------------------------ the switch
@pytest.mark.parametrize(
    "fields",
    [{}, {"classifier": "gap"}, {"pos_embed": "rope", "register_tokens": 2, "mlp": "swiglu"}, {"qk_norm": True}],
)
def test_the_switch_turns_every_path_off_and_both_give_the_same_model(fields, monkeypatch):
    model = randomised(ViTConfig(**{**TINY, **fields}))
    images = torch.randn(3, 3, 16, 16)
    calls = counting_in_place_gelu(monkeypatch)
    with torch.no_grad():
        fast = model(images), model.forward_features(images)
    uses_gelu = fields.get("mlp", "mlp") == "mlp"
    assert len(calls) == (2 * 3 if uses_gelu else 0)
    model.fast_paths = False
    with torch.no_grad():
        plain = model(images), model.forward_features(images)
    assert len(calls) == (2 * 3 if uses_gelu else 0)  # no GELU in place with the switch off
    for got, expected in zip(fast, plain):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    monkeypatch.undo()  # torch's own op tables must see the real gelu_ again
    model.train().set_attention_kernel("explicit")
    assert "_ExplicitAttentionBackward" not in backward_nodes(model(images))
    model.fast_paths = True
    explicit_applies = "pos_embed" not in fields and "qk_norm" not in fields  # no rotation, no qk norm
    assert ("_ExplicitAttentionBackward" in backward_nodes(model(images))) == explicit_applies


def test_a_hook_on_a_block_sees_its_whole_output_with_the_fast_paths_on():
    """A block with a hook runs through its own forward: the hook sees every token of the last block."""
    model = randomised(ViTConfig(**TINY))
    seen = []
    model.blocks[-1].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 16))
    assert seen == [(2, 17, 32)]


def test_a_backward_hook_or_a_block_of_its_own_kind_turns_the_fast_path_off_for_that_block():
    model = randomised(ViTConfig(**TINY)).train()
    fired = []
    model.blocks[1].register_full_backward_hook(lambda module, grad_in, grad_out: fired.append("block 1"))
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert fired == ["block 1"]

    class Halving(Block):  # a subclass whose forward is its own: it must run, not the equations of Block
        def forward(self, x, context=PLAIN, **options):
            out = super().forward(x, context, **options)
            return torch.cat([out[..., :16] / 2, out[..., 16:]], dim=-1)  # half the channels: no norm undoes it

    model.eval()
    with torch.no_grad():
        before = model.forward_features(torch.ones(1, 3, 16, 16))
        model.blocks[2].__class__ = Halving
        after = model.forward_features(torch.ones(1, 3, 16, 16))
    assert not torch.allclose(before, after)


def test_hooks_on_the_last_blocks_parts_see_every_token():
    model = randomised(ViTConfig(**TINY))
    shapes = []
    model.blocks[-1].mlp.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    with torch.no_grad():
        model(torch.randn(2, 3, 16, 16))
    assert shapes == [(2, 17, 32)]  # not the trimmed (B * 1, D) rows
