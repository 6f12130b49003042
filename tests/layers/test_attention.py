import torch

from vitlab.layers.attention import Attention
from vitlab.layers.block import Block
from vitlab.layers.drop import DropPath


def test_explicit_softmax_path_equals_fused_path_and_weights_are_distributions():
    attention = Attention(embed_dim=16, num_heads=4).eval()
    x = torch.randn(2, 5, 16)
    fused = attention(x)
    explicit, weights = attention(x, return_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)
    assert weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


def test_attention_matches_a_hand_written_multi_head_attention():
    attention = Attention(embed_dim=8, num_heads=2).eval()
    x = torch.randn(1, 3, 8)
    q, k, v = attention.qkv(x).split(8, dim=-1)
    heads = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        a = torch.softmax(q[..., sl] @ k[..., sl].transpose(-1, -2) / 2.0, dim=-1)  # sqrt(head_dim) = 2
        heads.append(a @ v[..., sl])
    expected = attention.proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_block_is_pre_norm_residual():
    block = Block(8, 2, 16).eval()
    x = torch.randn(2, 3, 8)
    mid = x + block.attn(block.norm1(x))
    expected = mid + block.mlp(block.norm2(mid))
    torch.testing.assert_close(block(x), expected)
    out, weights = block(x, return_attention=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert weights.shape == (2, 2, 3, 3)


def test_drop_path_is_identity_at_eval_and_unbiased_in_training():
    drop = DropPath(0.25)
    x = torch.ones(20000, 1)
    assert torch.equal(drop.eval()(x), x)
    out = drop.train()(x)
    kept = out != 0
    assert 0.72 < kept.float().mean() < 0.78
    assert torch.allclose(out[kept], torch.tensor(1 / 0.75))


def test_explicit_attention_backward_equals_autograds_in_float64():
    """The hand-written backward (layers/explicit_attention.py) gives the gradients autograd derives from the three
    plain ops, in float64 where rounding cannot hide a wrong term, and passes gradcheck."""
    from vitlab.layers.explicit_attention import explicit_attention

    torch.manual_seed(0)
    batch, tokens, heads, head_dim = 3, 5, 2, 4
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, dtype=torch.float64, requires_grad=True)
    scale = head_dim**-0.5

    def by_autograd(x):
        q, k, v = x.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = ((q * scale) @ k.transpose(-2, -1)).softmax(-1) @ v
        return out.transpose(1, 2).reshape(batch, tokens, heads * head_dim)

    upstream = torch.randn(batch, tokens, heads * head_dim, dtype=torch.float64)
    expected_out = by_autograd(qkv)
    (expected_grad,) = torch.autograd.grad(expected_out, qkv, upstream)
    out = explicit_attention(qkv, heads, scale)
    (grad,) = torch.autograd.grad(out, qkv, upstream)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: explicit_attention(x, heads, scale), (qkv,))


def test_separate_projections_give_the_fused_projections_queries_keys_and_values():
    # The form OpenVINO's export converts (three projections by the fused weight's thirds): the same numbers in
    # float64, where only summation order could differ; with the keys' bias held at zero (DINOv3) while gradients
    # flow, and without biases.
    for settings in ({}, {"key_bias": False}, {"qkv_bias": False}):
        attention = Attention(embed_dim=16, num_heads=4, **settings).double()
        if attention.qkv.bias is not None:
            torch.nn.init.normal_(attention.qkv.bias)
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        fused = attention.queries_keys_values(x)
        attention.separate_projections = True
        apart = attention.queries_keys_values(x)
        for name, expected, actual in zip("qkv", fused, apart):
            torch.testing.assert_close(actual, expected, msg=f"{name} of {settings}")
        if not attention.key_bias:  # the keys' third of the bias takes no part, as in the fused projection
            k_without_bias = attention.split_heads(x @ attention.qkv.weight[16:32].T)
            torch.testing.assert_close(apart[1], k_without_bias)
