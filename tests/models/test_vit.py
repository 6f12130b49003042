import pytest
import torch

from vitlab.config import ViTConfig
from vitlab.errors import UsageError
from vitlab.layers.pos_embed import sincos_2d_pos_embed
from vitlab.models import VisionTransformer, create_model, model_stats
from vitlab.variants import variant_config

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5)


def randomise(model: VisionTransformer) -> VisionTransformer:
    """Give zero-initialised parts (head, class token) values so tests see them."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(classifier="gap"),
        dict(classifier="gap", class_token=True),
        dict(classifier="gap", fc_norm=True),
        dict(representation_size=24),
        dict(pos_embed="sincos2d"),
        dict(image_size=(16, 24), patch_size=(4, 8)),
        dict(num_classes=0),
    ],
)
def test_forward_shapes_for_every_head_kind(fields):
    config = ViTConfig(**{**TINY, **fields})
    model = randomise(create_model(config))
    logits = model(torch.randn(2, 3, *config.image_size))
    assert logits.shape == (2, config.num_classes or config.embed_dim)


def test_forward_follows_the_papers_equations():
    model = randomise(create_model(ViTConfig(**TINY)))
    images = torch.randn(2, 3, 16, 16)
    from vitlab.layers.patch_embed import patchify

    z = patchify(images, 4) @ model.patch_embed.linear_weight() + model.patch_embed.proj.bias  # x_p E
    z = torch.cat([model.cls_token.expand(2, -1, -1), z], dim=1) + model.pos_embed  # eq. 1
    for block in model.blocks:
        z = z + block.attn(block.norm1(z))  # eq. 2
        z = z + block.mlp(block.norm2(z))  # eq. 3
    y = model.norm(z[:, 0])  # eq. 4
    torch.testing.assert_close(model(images), model.head(y), rtol=1e-4, atol=1e-5)


def test_gap_pools_the_mean_of_patch_tokens_after_the_norm():
    model = randomise(create_model(ViTConfig(**TINY, classifier="gap")))
    images = torch.randn(2, 3, 16, 16)
    tokens = model.forward_features(images)
    assert tokens.shape == (2, 16, 32)
    torch.testing.assert_close(model(images), model.head(tokens.mean(1)))


def test_intermediates_match_the_default_path():
    model = randomise(create_model(ViTConfig(**TINY)))
    images = torch.randn(2, 3, 16, 16)
    out = model.forward_analysis(images)
    torch.testing.assert_close(out["logits"], model(images), rtol=1e-5, atol=1e-5)
    assert len(out["attentions"]) == 3 and out["attentions"][0].shape == (2, 4, 17, 17)
    assert len(out["hidden_states"]) == 3 and out["hidden_states"][-1].shape == (2, 17, 32)
    torch.testing.assert_close(out["attentions"][1].sum(-1), torch.ones(2, 4, 17))


def test_attention_callback_receives_only_the_asked_layers_one_at_a_time():
    model = randomise(create_model(ViTConfig(**TINY)))
    seen = []
    out = model.forward_analysis(
        torch.randn(1, 3, 16, 16),
        attention_layers=[-1, 0],
        hidden_states=False,
        attention_callback=lambda layer, weights: seen.append((layer, weights.shape)),
    )
    assert seen == [(0, (1, 4, 17, 17)), (2, (1, 4, 17, 17))]
    assert "attentions" not in out and "hidden_states" not in out


def test_dropout_and_drop_path_are_off_at_inference():
    model = randomise(create_model(ViTConfig(**TINY, dropout=0.5, attention_dropout=0.5, drop_path=0.5)))
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(model(images), model(images))
    model.train()
    assert not torch.allclose(model(images), model(images))


def test_set_image_size_resamples_position_embedding_and_keeps_the_class_row():
    model = randomise(create_model(ViTConfig(**TINY)))
    class_row = model.pos_embed[:, 0].clone()
    model.set_image_size(32)
    assert model.pos_embed.shape == (1, 1 + 64, 32) and model.config.grid_size == (8, 8)
    assert torch.equal(model.pos_embed[:, 0], class_row)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


@pytest.mark.parametrize("fields", [dict(), dict(classifier="gap"), dict(pos_embed="sincos2d")])
def test_dynamic_image_size_is_exact_at_the_trained_size_and_equals_resampling_elsewhere(fields):
    model = randomise(create_model(ViTConfig(**{**TINY, **fields})))
    if fields.get("pos_embed") == "sincos2d":  # a fixed table is not learned: put back the one it always holds
        with torch.no_grad():
            model.pos_embed[0, 1:] = sincos_2d_pos_embed((4, 4), 32)
    images = torch.randn(2, 3, 16, 16)
    fixed = model(images)
    model.dynamic_size = True
    assert torch.equal(model(images), fixed)  # interpolating to the same grid moves nothing
    other = torch.randn(2, 3, 20, 28)  # grid 5 x 7 instead of 4 x 4
    resampled = randomise(create_model(ViTConfig(**{**TINY, **fields})))
    resampled.load_state_dict(model.state_dict())
    resampled.set_image_size((20, 28))
    torch.testing.assert_close(model(other), resampled(other), rtol=0, atol=1e-6)
    with pytest.raises(Exception, match="does not divide"):
        model(torch.randn(1, 3, 18, 16))


def test_explicit_attention_kernel_gives_the_same_logits():
    model = randomise(create_model(ViTConfig(**TINY)))
    images = torch.randn(2, 3, 16, 16)
    fused = model(images)
    model.set_attention_kernel("explicit")
    _, layout = model.prepare_tokens(images)
    assert model.block_context(layout, 2).attention.kernel == "explicit"  # the kernel goes to the blocks per call
    torch.testing.assert_close(model(images), fused, rtol=0, atol=1e-5)
    with pytest.raises(UsageError, match="must be 'sdpa' or 'explicit'"):
        model.set_attention_kernel("flash")


def test_wrong_input_size_is_a_clear_error():
    model = create_model(ViTConfig(**TINY)).eval()
    with pytest.raises(UsageError, match=r"expects images of shape \(B, 3, 16, 16\), got \(1, 3, 20, 20\)"):
        model(torch.randn(1, 3, 20, 20))


def test_reset_head_is_zero_and_remove_representation():
    model = randomise(create_model(ViTConfig(**TINY, representation_size=24)))
    model.remove_representation()
    model.reset_head(7)
    assert model.head.weight.shape == (7, 32) and not model.head.weight.any() and not model.head.bias.any()
    assert model.config.num_classes == 7 and model.config.representation_size is None
    assert torch.equal(model(torch.randn(2, 3, 16, 16)), torch.zeros(2, 7))


@pytest.mark.parametrize(
    "name, millions",
    [
        ("Ti/16", 5.72),
        ("S/16", 22.05),
        ("B/16", 86.57),
        ("L/16", 304.33),
        ("H/14", 632.05),
        ("R50+B/16", 98.66),
    ],
)
def test_parameter_counts_match_the_reference_models(name, millions):
    params, gflops = model_stats(variant_config(name))
    assert round(params / 1e6, 2) == millions
    assert gflops > 0


def test_flop_count_of_b16_is_the_known_figure():
    # 17.56 GMACs per 224x224 image is the figure timm and fvcore report for ViT-B/16.
    _, gflops = model_stats(variant_config("B/16"))
    assert abs(gflops - 35.13) < 0.01


def test_extrapolated_stats_equal_a_full_count():
    config = variant_config("digits-8")
    full = sum(p.numel() for p in create_model(config).parameters())
    assert model_stats(config)[0] == full


def test_attention_layers_index_as_python_lists_do_and_out_of_range_is_refused():
    model = create_model("digits-8").eval()
    images = torch.randn(1, 1, 8, 8)
    out = model.forward_analysis(images, attention_layers=[-1, 0], hidden_states=False)
    assert len(out["attentions"]) == 2  # the last block and the first
    with pytest.raises(UsageError, match="layer 4 is out of range for a 4-block model; use 0..3 or -4..-1"):
        model.forward_analysis(images, attention_layers=[4])  # once wrapped silently to block 0
    with pytest.raises(UsageError, match="out of range"):
        model.forward_analysis(images, attention_layers=[-5])


# ------------------------------------------------------------------------------------------------ dense outputs
@pytest.mark.parametrize(
    "fields", [dict(), dict(register_tokens=2, pos_embed="rope"), dict(distilled=True), dict(classifier="gap")]
)
def test_forward_intermediates_grids_are_the_tokens_of_the_plain_forward(fields):
    model = randomise(create_model(ViTConfig(**{**TINY, **fields, "image_size": (16, 24)})))
    images = torch.randn(2, 3, 16, 24)
    prefix = model.config.num_prefix_tokens
    with torch.no_grad():
        final, grids = model.forward_intermediates(images, norm=True)
        tokens = model.forward_features(images)
        states = model.forward_analysis(images, attention_layers=None)["hidden_states"]
    assert len(grids) == 3 and grids[-1].shape == (2, 32, 4, 6)  # (B, D, rows, cols) of a non-square grid
    torch.testing.assert_close(final, tokens, rtol=0, atol=0)
    patches = tokens[:, prefix:].reshape(2, 4, 6, 32).permute(0, 3, 1, 2)  # row-major patches on their grid
    assert torch.equal(grids[-1], patches)
    for grid, state in zip(grids, states):
        assert torch.equal(grid.flatten(2).transpose(1, 2), model.norm(state)[:, prefix:])


def test_forward_intermediates_chooses_blocks_formats_and_prefix_tokens_as_timm_does():
    model = randomise(create_model(ViTConfig(**TINY, register_tokens=2)))
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        states = model.forward_analysis(images, attention_layers=None)["hidden_states"]
        last_two = model.forward_intermediates(images, 2, output_fmt="NLC", intermediates_only=True)
        chosen = model.forward_intermediates(images, [0, -1], return_prefix_tokens=True, intermediates_only=True)
        early_final, early = model.forward_intermediates(images, [0], stop_early=True, output_fmt="NLC")
    assert [torch.equal(got, state[:, 3:]) for got, state in zip(last_two, states[1:])] == [True, True]
    (first, first_prefix), (last, last_prefix) = chosen
    assert first.shape == (2, 32, 4, 4) and first_prefix.shape == (2, 3, 32)
    assert torch.equal(first_prefix, states[0][:, :3]) and torch.equal(last_prefix, states[2][:, :3])
    assert torch.equal(early[0], states[0][:, 3:]) and torch.equal(early_final, model.norm(states[0]))
    with pytest.raises(UsageError, match="the last 4 blocks of a 3-block model"):
        model.forward_intermediates(images, 4)
    with pytest.raises(UsageError, match="layer 3 is out of range"):
        model.forward_intermediates(images, [3])
    with pytest.raises(UsageError, match="output_fmt must be 'NCHW' or 'NLC'"):
        model.forward_intermediates(images, output_fmt="NHWC")


def test_forward_intermediates_of_patches_with_their_own_grids_come_as_sequences():
    from vitlab.data.naflex import pad_patch_inputs

    model = randomise(create_model(ViTConfig(**TINY, pos_embed="rope")))
    inputs = pad_patch_inputs([torch.randn(3, 8, 12), torch.randn(3, 16, 4)], 4)
    with pytest.raises(UsageError, match="ask output_fmt='NLC'"):
        model.forward_intermediates(inputs)
    with torch.no_grad():
        final, states = model.forward_intermediates(inputs, output_fmt="NLC")
    assert states[-1].shape == (2, inputs.patches.shape[1], 32) and final.shape[1] == 1 + inputs.patches.shape[1]


# ------------------------------------------------------------------------------------------------ any input size
@pytest.mark.parametrize("fields", [dict(pos_embed="rope", register_tokens=2), dict(pos_embed="none")])
def test_positions_without_a_table_take_any_size_as_a_reloaded_model_does(fields):
    """DINOv3 takes (B, 3, 40, 64) as transformers' DINOv3ViTModel does: no table to resample, no reload."""
    model = randomise(create_model(ViTConfig(**{**TINY, **fields})))
    images = torch.randn(2, 3, 40, 64)
    reloaded = randomise(create_model(ViTConfig(**{**TINY, **fields, "image_size": (40, 64)})))
    reloaded.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model(images), reloaded(images))
    with pytest.raises(Exception, match="patch size 4 does not divide image height 42; use an image size of 40"):
        model(torch.randn(1, 3, 42, 64))


def test_a_dynamic_size_keeps_each_sizes_table_while_nothing_trains_it():
    model = randomise(create_model(ViTConfig(**TINY)))
    model.dynamic_size = True
    images = torch.randn(2, 3, 20, 28)
    with torch.no_grad():
        first = model(images)
        assert len(model.positions.kept) == 1
        assert torch.equal(model(images), first) and len(model.positions.kept) == 1  # the kept table, reused
        model(torch.randn(1, 3, 24, 24))
        assert len(model.positions.kept) == 2
        model.pos_embed.data.mul_(2)  # a write no version counter sees, as a fused optimiser step's
        moved = model(images)
    assert not torch.allclose(moved, first)
    fresh = randomise(create_model(ViTConfig(**TINY)))
    fresh.load_state_dict(model.state_dict())
    fresh.set_image_size((20, 28))
    with torch.no_grad():
        torch.testing.assert_close(moved, fresh(images), rtol=0, atol=1e-6)
    model.train()
    logits = model(images)  # training: made afresh every call, so gradients reach the stored table
    logits.sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0
    version = model.pos_embed._version
    torch.optim.AdamW(model.parameters(), lr=0.1, fused=True).step()  # writes in place, moves no version counter
    assert model.pos_embed._version == version
    model.eval()
    stepped = create_model(ViTConfig(**TINY)).eval()
    stepped.load_state_dict(model.state_dict())
    stepped.set_image_size((20, 28))
    with torch.no_grad():
        torch.testing.assert_close(model(images), stepped(images), rtol=0, atol=1e-6)  # the step is seen


def test_a_model_without_dynamic_size_names_both_ways_to_another_size():
    model = create_model(ViTConfig(**TINY)).eval()
    with pytest.raises(UsageError, match=r"set model.dynamic_size = True .* or load it with image_size=\(20, 20\)"):
        model(torch.randn(1, 3, 20, 20))


def test_forward_intermediates_keeps_the_model_whole_and_only_the_chosen_blocks():
    model = randomise(create_model(ViTConfig(**TINY)))
    images = torch.randn(2, 3, 16, 16)
    depths = []
    model.blocks[0].register_forward_hook(lambda module, args, out: depths.append(len(model.blocks)))
    with torch.no_grad():
        model.forward_intermediates(images, [0], stop_early=True)
        every = model.forward_analysis(images, attention_layers=None)["hidden_states"]
        tokens, layout = model.prepare_tokens(images)
        _, kept = model.forward_blocks(tokens, layout, keep_states={1})
    assert depths[0] == 3  # the blocks are never swapped for a shorter list, even while the call runs
    assert len(kept) == 1 and torch.equal(kept[0], every[1])


def test_old_names_are_told_not_ignored():
    model = create_model(ViTConfig(**TINY))
    with pytest.raises(UsageError, match="forward_analysis"):
        model.forward_intermediates(torch.randn(1, 3, 16, 16), "all")
    with pytest.raises(UsageError, match="no block chosen"):
        model.forward_intermediates(torch.randn(1, 3, 16, 16), [])
    with pytest.warns(DeprecationWarning, match="dynamic_size"):
        model.dynamic_image_size = True
    assert model.dynamic_size is True
