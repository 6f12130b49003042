"""models/checkpointing.py: activation checkpointing per block gives the gradients of a run without it, bit for bit,
with drop-path and dropout drawing (the recomputation must replay their random numbers), in the ViT, EoMT's query
blocks, a dense head's encoder, MAE's decoder and the hybrid's ResNet stages; and it runs only while training with
gradients on."""

from __future__ import annotations

import pytest
import torch

from runfiles import MICRO, micro_config, weights
from vitlab.config import ViTConfig
from vitlab.head_configs import EoMTConfig, LinearSegmentationConfig
from vitlab.layers.drop import DropPath
from vitlab.models import checkpointing, create_model
from vitlab.models.mae import MAEConfig, MaskedAutoencoder
from vitlab.train import assemble
from vitlab.train.loop import train

# Depth 3 so that drop-path draws in two blocks (its rate rises from 0 at the first); dropout draws everywhere.
TINY = dict(
    image_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5,
    drop_path=0.3, dropout=0.1,
)  # fmt: skip


def counted(monkeypatch) -> dict[str, int]:
    """Counts of checkpointed calls and of drop-path's draws (forward calls of a drop-path that draws) from now on."""
    counts = {"checkpointed": 0, "drop_path": 0}
    real_checkpoint, real_drop_path = checkpointing.checkpoint, DropPath.forward

    def counting_checkpoint(*args, **kwargs):
        counts["checkpointed"] += 1
        return real_checkpoint(*args, **kwargs)

    def counting_drop_path(self, x):
        counts["drop_path"] += self.training and self.drop_prob > 0
        return real_drop_path(self, x)

    monkeypatch.setattr(checkpointing, "checkpoint", counting_checkpoint)
    monkeypatch.setattr(DropPath, "forward", counting_drop_path)
    return counts


def gradients(model: torch.nn.Module, loss_of, seed: int = 0, checkpointed: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter's gradient after one backward pass of loss_of(model), random numbers drawn from `seed`."""
    model.train()
    checkpointing.set_grad_checkpointing(model, checkpointed)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss_of(model).backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}


def assert_identical(plain: dict[str, torch.Tensor], checkpointed: dict[str, torch.Tensor]) -> None:
    assert plain.keys() == checkpointed.keys() and plain
    for name in plain:
        assert torch.equal(plain[name], checkpointed[name]), name


def classifier_loss(model) -> torch.Tensor:
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return model(images).logsumexp(dim=-1).sum()


@pytest.mark.parametrize(
    "changes, kernel, fast_paths",
    [
        ({}, "sdpa", True),  # the class-token head: the last block computes its token alone (fast_paths item 1)
        ({}, "explicit", True),  # the explicit attention's own backward (fast_paths item 3)
        ({"attention_dropout": 0.1, "classifier": "gap"}, "sdpa", False),  # the plain layers, every token
    ],
    ids=["fast-sdpa", "fast-explicit", "plain-gap"],
)
def test_vit_gradients_are_bit_identical_and_drop_path_is_replayed(monkeypatch, changes, kernel, fast_paths):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**TINY, **changes))
    model.set_attention_kernel(kernel)
    model.fast_paths = fast_paths
    counts = counted(monkeypatch)
    plain = gradients(model, classifier_loss)
    assert counts == {"checkpointed": 0, "drop_path": 4}  # 2 in each block but the first (rate 0)
    checkpointed = gradients(model, classifier_loss, checkpointed=True)
    # Every block checkpointed, and each one's drop-path ran again in the backward: its draws were replayed.
    assert counts == {"checkpointed": 3, "drop_path": 4 + 8}
    assert_identical(plain, checkpointed)
    # The draws matter: another seed drops other samples, so equal gradients above are not equal by chance.
    other = gradients(model, classifier_loss, seed=1)
    assert not all(torch.equal(plain[name], other[name]) for name in plain)


def test_eomt_query_blocks_with_masked_attention_are_bit_identical(monkeypatch):
    config = ViTConfig(**{**TINY, "depth": 3}, head=EoMTConfig(queries=3, blocks=2, upscale_blocks=1))
    torch.manual_seed(0)
    model = create_model(config)
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))

    def loss_of(eomt):  # every prediction the loss reads; the second query block masks half its queries at random
        predictions = eomt.forward_train(images, [1.0, 0.5])
        return sum(p.class_logits.logsumexp(-1).sum() + p.mask_logits.sigmoid().sum() for p in predictions)

    counts = counted(monkeypatch)
    plain = gradients(model, loss_of)
    checkpointed = gradients(model, loss_of, checkpointed=True)
    assert counts["checkpointed"] == 3  # the encoder's first block, then the two query blocks
    assert_identical(plain, checkpointed)


@pytest.mark.parametrize(
    "config",
    [
        ViTConfig(**{**TINY, "num_classes": 3}, head=LinearSegmentationConfig()),
        # The hybrid: its ResNet stages checkpointed with the blocks (GroupNorm needs 32 channels: width 0.5).
        ViTConfig(**{**TINY, "patch_size": 1}, resnet_layers=(1, 1), resnet_width_factor=0.5),
    ],
    ids=["linear-segmenter", "hybrid"],
)
def test_a_dense_head_and_the_hybrid_are_bit_identical(config):
    torch.manual_seed(0)
    model = create_model(config)
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    plain = gradients(model, lambda m: m(images).square().mean())
    assert_identical(plain, gradients(model, lambda m: m(images).square().mean(), checkpointed=True))


def test_mae_decoder_blocks_are_checkpointed_and_bit_identical(monkeypatch):
    torch.manual_seed(0)
    encoder = create_model(ViTConfig(**{**TINY, "num_classes": 0}))
    mae = MaskedAutoencoder(encoder, MAEConfig(decoder_dim=16, decoder_depth=2, decoder_heads=2, decoder_mlp_dim=32))
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    counts = counted(monkeypatch)
    plain = gradients(mae, lambda m: m(images).loss)
    checkpointed = gradients(mae, lambda m: m(images).loss, checkpointed=True)
    assert counts["checkpointed"] == 3 + 2  # the encoder's blocks and the decoder's
    assert_identical(plain, checkpointed)


def test_bf16_autocast_recomputes_the_same_bf16_products():
    torch.manual_seed(0)
    model = create_model(ViTConfig(**TINY))

    def loss_of(vit):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return classifier_loss(vit).float()

    assert_identical(gradients(model, loss_of), gradients(model, loss_of, checkpointed=True))


def test_nothing_is_checkpointed_in_evaluation_or_without_gradients(monkeypatch):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**TINY))
    model.set_grad_checkpointing()
    counts = counted(monkeypatch)
    images = torch.randn(2, 3, 16, 16)
    model.eval()(images).sum().backward()
    with torch.no_grad():
        model.train()(images)
    assert counts["checkpointed"] == 0
    model.set_grad_checkpointing(False)
    model(images).sum().backward()
    assert counts["checkpointed"] == 0 and not model.grad_checkpointing


@pytest.mark.slow
def test_compiled_checkpointed_blocks_give_the_eager_gradients():
    # aot_eager: Dynamo's trace of the checkpointed regions and AOTAutograd's recomputation, without Inductor's
    # code generation (minutes on this CPU). No random draws: a compiled graph draws from its own generator.
    torch.manual_seed(0)
    model = create_model(ViTConfig(**{**TINY, "drop_path": 0.0, "dropout": 0.0}))
    eager = gradients(model, classifier_loss)
    compiled = torch.compile(model, backend="aot_eager")
    model.set_grad_checkpointing()
    model.zero_grad(set_to_none=True)
    classifier_loss(compiled).backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, eager[name], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_the_setting_trains_to_the_same_weights(tmp_path, monkeypatch):
    counts = counted(monkeypatch)
    memory_saved = []  # the run that trades compute for memory also stops the command's kept heap (hardware.py)
    monkeypatch.setattr(assemble, "save_memory_over_speed", lambda: memory_saved.append(True))
    settings = dict(epochs=1, batch_size=64, max_train_images=256, drop_path=0.2, model_overrides=dict(MICRO, depth=2))
    train(micro_config(tmp_path, run_name="plain", **settings))
    assert counts["checkpointed"] == 0 and memory_saved == []
    train(micro_config(tmp_path, run_name="checkpointed", grad_checkpointing=True, **settings))
    assert counts["checkpointed"] > 0 and memory_saved == [True]
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "checkpointed")
    for name in a:
        assert torch.equal(a[name], b[name]), name
