import pytest
import torch

from vitlab.errors import ConfigError
from vitlab.layers.patch_embed import PatchEmbed, patchify, unpatchify


def test_patchify_cuts_row_major_patches_with_channels_innermost():
    images = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    patches = patchify(images, 2)
    assert patches.shape == (2, 6, 12)
    # Patch 4 is grid row 1, column 1: pixels rows 2-3, columns 2-3; its first entries are pixel (2, 2) in C=0,1,2.
    expected_first_pixel = images[0, :, 2, 2]
    assert torch.equal(patches[0, 4, :3], expected_first_pixel)
    assert torch.equal(unpatchify(patches, 2, (2, 3)), images)


def test_non_square_patches_round_trip():
    images = torch.randn(1, 3, 8, 12)
    assert torch.equal(unpatchify(patchify(images, (4, 3)), (4, 3), (2, 4)), images)


def test_strided_conv_equals_linear_projection_of_flattened_patches():
    """The paper's eq. 1 (x_p E + b) and the stride-P convolution are the same map."""
    embed = PatchEmbed((4, 2), in_chans=3, embed_dim=8)
    images = torch.randn(2, 3, 8, 6)
    linear = patchify(images, (4, 2)) @ embed.linear_weight() + embed.proj.bias
    torch.testing.assert_close(embed(images), linear, rtol=1e-5, atol=1e-5)


def test_size_the_patch_does_not_divide_is_a_clear_error():
    with pytest.raises(ConfigError, match="patch size 4 does not divide image width 10"):
        patchify(torch.randn(1, 3, 8, 10), 4)


def test_no_layer_imports_the_model_config():
    """The dependency runs config -> layers, never back: a layer takes plain arguments, so it can be reused and
    tested without a ViTConfig, and `vitlab.config` can use layer helpers (`patch_grid`) without a cycle."""
    import ast
    from pathlib import Path

    import vitlab.layers

    for path in sorted(Path(vitlab.layers.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "vitlab":
                modules = [f"vitlab.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            assert not any(m == "vitlab.config" or m.startswith("vitlab.config.") for m in modules), path.name
