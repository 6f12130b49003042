"""MAE (models/mae.py) and its transformers checkpoints (checkpoint/hf_mae.py): parity with transformers'
ViTMAEForPreTraining both ways, the visible-only encoder against full attention with masked keys, masking,
patchify, reconstruction pictures and what masking refuses."""

import json
import math

import pytest
import torch

from conftest import FIXTURES
from vitlab.checkpoint.hf_mae import load_mae, save_mae_hf
from vitlab.checkpoint.io import read_safetensors
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError, UsageError
from vitlab.models.mae import (
    MAEConfig,
    MaskedAutoencoder,
    check_maskable,
    decoder_position_table,
    kept_patches,
    random_masking,
)
from vitlab.models.vit import VisionTransformer

TINY = dict(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=0)
TINY_DECODER = dict(decoder_dim=16, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=32)


def tiny_mae(norm_pix_loss: bool = True, **encoder: object) -> MaskedAutoencoder:
    return MaskedAutoencoder(
        VisionTransformer(ViTConfig(**{**TINY, **encoder})), MAEConfig(norm_pix_loss=norm_pix_loss, **TINY_DECODER)
    ).eval()


@torch.no_grad()
def perturb(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    """Move every parameter off its initial value (zero tokens, unit norms, zero biases) so that no mapping
    mistake can hide behind a symmetric value."""
    for name, parameter in model.named_parameters():
        if not name.endswith(skip):
            parameter.add_(torch.randn_like(parameter) * 0.1)


def hf_tiny_mae(norm_pix_loss: bool):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTMAEConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        decoder_hidden_size=16,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=32,
        mask_ratio=0.75,
        norm_pix_loss=norm_pix_loss,
    )
    return transformers.ViTMAEForPreTraining(config).eval()


def max_differences(ours, theirs) -> dict[str, float]:
    return {
        "loss": (ours.loss - theirs.loss).abs().item(),
        "pred": (ours.pred - theirs.logits).abs().max().item(),
        "mask": (ours.mask - theirs.mask).abs().max().item(),
    }


# ------------------------------------------------------------------------------------------ transformers parity
@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_transformers_mae_converted_gives_the_same_loss_pred_and_mask(tmp_path, norm_pix_loss):
    theirs = hf_tiny_mae(norm_pix_loss)
    perturb(theirs)
    theirs.save_pretrained(tmp_path)
    ours = load_mae(tmp_path)
    assert ours.config == MAEConfig(mask_ratio=0.75, norm_pix_loss=norm_pix_loss, **TINY_DECODER)
    images, noise = torch.randn(3, 3, 32, 32), torch.rand(3, 16)
    with torch.no_grad():
        expected = theirs(pixel_values=images, noise=noise)
        out = ours(images, noise=noise)
        latent = ours.forward_encoder(images, noise)[0]
        expected_latent = theirs.vit(pixel_values=images, noise=noise).last_hidden_state
    print("transformers -> vitlab max abs differences:", max_differences(out, expected))
    torch.testing.assert_close(latent, expected_latent, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.pred, expected.logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.mask, expected.mask, rtol=0, atol=0)
    assert torch.equal(out.ids_restore, expected.ids_restore)


@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_save_mae_hf_loads_in_transformers_with_the_same_loss(tmp_path, norm_pix_loss):
    transformers = pytest.importorskip("transformers")
    ours = tiny_mae(norm_pix_loss, pos_embed="sincos2d", layer_norm_eps=1e-6)
    perturb(ours)
    save_mae_hf(ours, tmp_path)
    theirs, info = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.config.norm_pix_loss is norm_pix_loss
    images, noise = torch.randn(3, 3, 32, 32), torch.rand(3, 16)
    with torch.no_grad():
        expected = theirs.eval()(pixel_values=images, noise=noise)
        out = ours(images, noise=noise)
    print("vitlab -> transformers max abs differences:", max_differences(out, expected))
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.pred, expected.logits, rtol=0, atol=1e-4)


def test_transformers_layout_round_trip_keeps_configs_and_weights(tmp_path):
    ours = tiny_mae(pos_embed="sincos2d", image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
    perturb(ours, skip=("pos_embed",))  # a fixed sin-cos table stays one: it loads back as "sincos2d"
    save_mae_hf(ours, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "vit_mae" and written["decoder_hidden_size"] == 16
    # The same tensors as a PyTorch file (pytorch_model.bin, as older transformers wrote) load the same.
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (bin_folder / name).write_text((tmp_path / name).read_text())
    torch.save(read_safetensors(tmp_path / "model.safetensors")[0], bin_folder / "pytorch_model.bin")
    for back in (load_mae(tmp_path), load_mae(bin_folder)):
        assert back.config == ours.config
        # The preprocessing contract, unrecorded in ours, is written out and read back as what it resolves to.
        expected_encoder = ours.encoder.config.replace(preprocessing=back.encoder.config.preprocessing)
        assert back.encoder.config.to_dict() == expected_encoder.to_dict()
        for name, tensor in ours.state_dict().items():
            assert torch.equal(back.state_dict()[name], tensor), name


def test_save_mae_hf_refuses_what_transformers_cannot_hold(tmp_path):
    for encoder, fragment in (
        (dict(register_tokens=2), "register_tokens=2"),
        (dict(classifier="gap"), "class_token=False"),
        (dict(pos_embed="learned_2d"), "learned_2d"),
        (dict(image_size=(32, 48)), "square"),
    ):
        with pytest.raises(CheckpointError, match=fragment):
            save_mae_hf(tiny_mae(**encoder), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_load_mae_refuses_a_checkpoint_saved_without_masking():
    """The MAE fixture was saved by transformers with mask_ratio 0 (for its encoder's features): no pre-training
    loss exists for it, and the message says so rather than failing in the loss."""
    with pytest.raises(CheckpointError, match="mask_ratio must be a number in"):
        load_mae(FIXTURES / "hf_mae")


def test_fresh_decoder_table_is_maes_sincos_layout():
    """[sin x, cos x, sin y, cos y] per patch (x the column), zero prefix rows, as MAE's get_2d_sincos_pos_embed."""
    rows, cols, dim = 2, 3, 8
    table = decoder_position_table((rows, cols), dim, num_prefix_tokens=1)
    omega = 1.0 / 10000 ** (torch.arange(dim // 4) / (dim // 4))
    assert torch.equal(table[0], torch.zeros(dim))
    for row in range(rows):
        for col in range(cols):
            x, y = col * omega, row * omega
            expected = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()])
            torch.testing.assert_close(table[1 + row * cols + col], expected)


# ------------------------------------------------------------------------------------------ the masked encoder
def test_visible_only_encoder_equals_full_sequence_with_masked_keys():
    """Running the blocks on the kept tokens only is the same as running them on every token with the removed
    patches left out of every attention (reference: explicit softmax with -inf on their keys)."""
    mae = tiny_mae(register_tokens=2, pos_embed="learned")
    perturb(mae)
    encoder = mae.encoder
    images, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 16)
    prefix, keep = 3, kept_patches(16, 0.75)  # class token + 2 registers
    ids_keep = noise.argsort(dim=1)[:, :keep]
    removed = torch.ones(2, 16, dtype=torch.bool).scatter(1, ids_keep, False)
    key_removed = torch.cat([torch.zeros(2, prefix, dtype=torch.bool), removed], dim=1)  # (B, T)
    with torch.no_grad():
        latent = mae.forward_encoder(images, noise)[0]
        x, _ = encoder.prepare_tokens(images)
        for block in encoder.blocks:
            heads, head_dim = block.attn.num_heads, block.attn.head_dim
            qkv = torch.nn.functional.linear(block.norm1(x), block.attn.qkv.weight, block.attn.qkv.bias)
            q, k, v = qkv.reshape(2, x.shape[1], 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            logits = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
            weights = logits.masked_fill(key_removed[:, None, None, :], float("-inf")).softmax(dim=-1)
            attended = (weights @ v).transpose(1, 2).reshape(x.shape)
            x = x + block.attn.proj(attended)
            x = x + block.mlp(block.norm2(x))
        x = encoder.norm(x)
    kept = torch.gather(x[:, prefix:], 1, ids_keep[..., None].expand(-1, -1, x.shape[-1]))
    torch.testing.assert_close(latent, torch.cat([x[:, :prefix], kept], dim=1), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "fields",
    [
        dict(pos_embed="rope", register_tokens=2),
        dict(pos_embed_placement="every_block"),
        dict(pos_embed="learned_2d", pos_embed_placement="every_block_shared"),
        dict(pos_embed="sincos2d", pos_embed_placement="every_block_shared", prefix_positions=False),
    ],
)
def test_the_kept_patches_keep_their_coordinates_in_every_block(fields):
    """Rotary positions and tables added before every block follow the kept patches' coordinates: the visible-only
    encoder equals the whole sequence with the removed patches marked as padding (never read as keys)."""
    mae = tiny_mae(**fields)
    perturb(mae, skip=("pos_embed",) if fields.get("pos_embed") == "sincos2d" else ())
    encoder = mae.encoder
    images, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 16)
    prefix, keep = encoder.config.num_prefix_tokens, kept_patches(16, 0.75)
    ids_keep = noise.argsort(dim=1)[:, :keep]
    with torch.no_grad():
        latent = mae.forward_encoder(images, noise)[0]
        x, layout = encoder.prepare_tokens(images)
        layout.valid = torch.zeros(2, 16, dtype=torch.bool).scatter(1, ids_keep, True)
        x = encoder.norm(encoder.forward_blocks(x, layout)[0])
    kept = torch.gather(x[:, prefix:], 1, ids_keep[..., None].expand(-1, -1, x.shape[-1]))
    torch.testing.assert_close(latent, torch.cat([x[:, :prefix], kept], dim=1), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "encoder",
    [
        dict(classifier="gap"),
        dict(register_tokens=2),
        dict(pos_embed="none"),
        dict(pos_embed="learned_2d", distilled=True),
    ],
)
def test_any_prefix_and_absolute_position_kind_trains(encoder):
    mae = tiny_mae(**encoder).train()
    out = mae(torch.randn(2, 3, 32, 32))
    prefix = mae.encoder.config.num_prefix_tokens
    assert out.pred.shape == (2, 16, 8 * 8 * 3) and torch.isfinite(out.loss)
    assert mae.decoder_pos_embed.shape == (1, prefix + 16, 16) and not mae.decoder_pos_embed.requires_grad
    assert torch.equal(mae.decoder_pos_embed[0, :prefix], torch.zeros(prefix, 16))
    out.loss.backward()
    assert mae.mask_token.grad is not None and mae.encoder.patch_embed.proj.weight.grad is not None


def test_masking_keeps_the_smallest_noise_and_restores_the_order():
    noise = torch.rand(4, 16)
    ids_keep, mask, ids_restore = random_masking(noise, 0.75)
    assert ids_keep.shape == (4, 4) and kept_patches(16, 0.75) == 4
    assert mask.sum(dim=1).tolist() == [12.0] * 4
    assert torch.equal(mask.gather(1, ids_keep), torch.zeros(4, 4))
    ids_shuffle = noise.argsort(dim=1)
    assert torch.equal(ids_shuffle.gather(1, ids_restore), torch.arange(16).expand(4, 16))
    assert torch.equal(
        noise.gather(1, ids_keep).amax(dim=1) < noise.masked_fill(mask == 0, 2).amin(dim=1),
        torch.ones(4, dtype=torch.bool),
    )


def test_masking_is_deterministic_under_a_seeded_generator():
    mae = tiny_mae()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        first = mae(images, generator=torch.Generator().manual_seed(7))
        again = mae(images, generator=torch.Generator().manual_seed(7))
        other = mae(images, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first.mask, again.mask) and torch.equal(first.loss, again.loss)
    assert not torch.equal(first.mask, other.mask)
    with pytest.raises(UsageError, match=r"noise must have shape \(batch, patches\) = \(4, 16\)"):
        mae(images, noise=torch.rand(4, 15))


# ------------------------------------------------------------------------------------------ pixels
def test_patchify_round_trip_on_a_non_square_grid_of_grey_images():
    mae = tiny_mae(image_size=(16, 24), patch_size=(8, 4), in_chans=1)
    images = torch.randn(2, 1, 16, 24)
    patches = mae.patchify(images)
    assert patches.shape == (2, 2 * 6, 8 * 4)
    assert torch.equal(mae.unpatchify(patches), images)
    assert torch.equal(patches[1, 6 + 2], images[1, 0, 8:16, 8:12].reshape(-1))  # row 1, column 2: row-major pixels


def test_patchify_is_transformers_order():
    """nchpwq -> nhwpqc: within a patch the pixels run row, column, then channel."""
    mae = tiny_mae()
    images = torch.randn(2, 3, 32, 32)
    expected = torch.einsum("nchpwq->nhwpqc", images.reshape(2, 3, 4, 8, 4, 8)).reshape(2, 16, 192)
    assert torch.equal(mae.patchify(images), expected)


@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_reconstruction_pastes_the_visible_patches_and_undoes_norm_pix(norm_pix_loss):
    mae = tiny_mae(norm_pix_loss)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = mae(images)
        masked, reconstructed, pasted = mae.reconstruction(images, out.pred, out.mask)
    visible = out.mask == 0
    assert torch.equal(mae.patchify(pasted)[visible], mae.patchify(images)[visible])
    assert torch.equal(mae.patchify(masked)[visible], mae.patchify(images)[visible])
    assert not mae.patchify(masked)[~visible].any()
    assert torch.equal(mae.patchify(pasted)[~visible], mae.patchify(reconstructed)[~visible])
    # A perfect prediction of the loss's target reconstructs the image itself.
    target = mae.patchify(images)
    if norm_pix_loss:
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6) ** 0.5
    torch.testing.assert_close(mae.reconstruction(images, target, out.mask)[1], images, rtol=0, atol=1e-5)
    assert mae.loss(images, target, out.mask).item() == pytest.approx(0, abs=1e-10)


# ------------------------------------------------------------------------------------------ what it refuses
@pytest.mark.parametrize(
    "fields, fragment",
    [
        (dict(pos_embed="relative"), "relative position attention"),
        (dict(image_size=64, patch_size=1, resnet_layers=(1,)), "ResNet hybrid"),
    ],
)
def test_check_maskable_refuses_with_the_reason(fields, fragment):
    config = ViTConfig(**{**TINY, **fields})
    with pytest.raises(UsageError, match=fragment):
        check_maskable(config)
    with pytest.raises(UsageError, match=fragment):
        MaskedAutoencoder(VisionTransformer(config), MAEConfig(**TINY_DECODER))


def test_mae_config_round_trips_through_json_and_validates():
    config = MAEConfig(mask_ratio=0.6, norm_pix_loss=False, **TINY_DECODER)
    assert MAEConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert MAEConfig().norm_pix_loss is True and MAEConfig().decoder_dim == 512
    for bad, fragment in (
        (dict(mask_ratio=0), "in \\(0, 1\\)"),
        (dict(mask_ratio=1.0), "in \\(0, 1\\)"),
        (dict(decoder_dim=24, decoder_heads=5), "does not divide by decoder_heads 5"),
        (dict(decoder_dim=18, decoder_heads=2), "divisible by 4"),
        (dict(decoder_depth=0), "decoder_depth"),
        (dict(norm_pix_loss="yes"), "norm_pix_loss"),
    ):
        with pytest.raises(ConfigError, match=fragment):
            MAEConfig(**bad)
    with pytest.raises(ConfigError, match="unknown MAE config keys"):
        MAEConfig.from_dict({"mask_ratio": 0.5, "decoder_width": 3})
    with pytest.raises(
        ConfigError, match="keeps int\\(16 x 0.05\\) = 0 of the encoder's 16 patches; use a ratio of at most 0.9375"
    ):
        MaskedAutoencoder(VisionTransformer(ViTConfig(**TINY)), MAEConfig(mask_ratio=0.95, **TINY_DECODER))
