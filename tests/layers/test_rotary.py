"""2-D rotary positions (layers/rotary.py): DINOv3's formulation, checked against transformers' DINOv3 code, and
the property that makes it a *relative* position code."""

import pytest
import torch

from vitlab.layers.patch_layout import PatchLayout
from vitlab.layers.rotary import RotaryTable, normalized_centres, rotary_angles


def grid_coords(rows: int, cols: int) -> torch.Tensor:
    return PatchLayout((rows, cols)).full_coords()  # (1, rows * cols, 2)


@pytest.mark.parametrize("rows,cols,head_dim,theta", [(4, 4, 16, 100.0), (5, 8, 32, 100.0), (3, 7, 64, 10000.0)])
def test_angles_and_rotation_equal_transformers_dinov3(rows, cols, head_dim, theta):
    dinov3 = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    from transformers import DINOv3ViTConfig

    config = DINOv3ViTConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, patch_size=4, image_size=64, rope_theta=theta
    )
    reference = dinov3.DINOv3ViTRopePositionEmbedding(config).eval()
    cos, sin = reference(torch.zeros(1, 3, rows * 4, cols * 4))  # (N, head_dim)
    angles = rotary_angles(normalized_centres(grid_coords(rows, cols), torch.tensor([[rows, cols]])), head_dim, theta)
    table = RotaryTable.from_angles(angles, num_prefix_tokens=1)
    torch.testing.assert_close(table.cos[0, 0], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(table.sin[0, 0], sin, rtol=0, atol=1e-6)
    q, k = torch.randn(2, 2, 1 + rows * cols, head_dim), torch.randn(2, 2, 1 + rows * cols, head_dim)
    expected_q, expected_k = dinov3.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(table.rotate(q), expected_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(table.rotate(k), expected_k, rtol=0, atol=1e-6)


def test_the_prefix_tokens_are_never_turned():
    angles = rotary_angles(normalized_centres(grid_coords(3, 3), torch.tensor([[3, 3]])), 8, 100.0)
    x = torch.randn(1, 2, 3 + 9, 8)
    turned = RotaryTable.from_angles(angles, num_prefix_tokens=3).rotate(x)
    assert torch.equal(turned[:, :, :3], x[:, :, :3])
    assert not torch.allclose(turned[:, :, 3:], x[:, :, 3:])
    # A rotation keeps each token's length.
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))


def test_query_key_products_depend_on_the_offset_only():
    """q . k of two turned tokens is the same for every pair of patches with the same (row, col) offset."""
    rows = cols = 6
    head_dim = 16
    coords = grid_coords(rows, cols)
    angles = rotary_angles(normalized_centres(coords, torch.tensor([[rows, cols]])), head_dim, 100.0)
    table = RotaryTable.from_angles(angles, num_prefix_tokens=0)
    q, k = torch.randn(head_dim), torch.randn(head_dim)
    turned_q = table.rotate(q.expand(1, 1, rows * cols, head_dim))[0, 0]
    turned_k = table.rotate(k.expand(1, 1, rows * cols, head_dim))[0, 0]

    def product(query: tuple[int, int], key: tuple[int, int]) -> torch.Tensor:
        return turned_q[query[0] * cols + query[1]] @ turned_k[key[0] * cols + key[1]]

    torch.testing.assert_close(product((0, 0), (2, 1)), product((3, 4), (5, 5)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(product((1, 2), (1, 0)), product((4, 5), (4, 3)), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(product((0, 0), (2, 1)), product((0, 0), (1, 2)))
