"""Transfer: fine-tuning any checkpoint kind at a new resolution, freezing, linear probing, few-shot."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, REFERENCE_CHECKPOINTS
from vitlab import load_model
from vitlab.data.datasets import load_dataset
from vitlab.errors import ConfigError, DataError
from vitlab.eval import fewshot
from vitlab.eval.fewshot import fewshot_accuracy, fit_least_squares, run_fewshot
from vitlab.train.config import finetune_config
from vitlab.train.loop import build_finetune_model, train


def quick(tmp_path, source, **changes):
    fields = dict(init_from=str(source), dataset="digits", epochs=1, batch_size=256, out_dir=str(tmp_path),
                  run_name="ft", progress=False, threads=1)
    fields.update(changes)
    return finetune_config(**fields)


def test_new_head_is_zero_representation_dropped_and_position_embedding_resampled(tmp_path):
    source = FIXTURES / "jax_vit_gap_repr.npz"  # gap head with a pre-logits layer, 16x16 images, patch 4
    pretrained = load_model(source)
    model = build_finetune_model(quick(tmp_path, source, image_size=32), load_dataset("digits"))
    assert model.config.representation_size is None and isinstance(model.pre_logits, torch.nn.Identity)
    assert model.head.weight.shape == (10, 32) and not model.head.weight.any() and not model.head.bias.any()
    assert model.config.grid_size == (8, 8) and model.pos_embed.shape == (1, 64, 32)
    token = build_finetune_model(quick(tmp_path, FIXTURES / "jax_vit_token.npz", image_size=24), load_dataset("digits"))
    assert torch.equal(token.pos_embed[:, 0], load_model(FIXTURES / "jax_vit_token.npz").pos_embed[:, 0])
    assert torch.equal(model.blocks[0].attn.qkv.weight, pretrained.blocks[0].attn.qkv.weight)


@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
def test_every_checkpoint_kind_fine_tunes(tmp_path, name, weights):
    summary = train(quick(tmp_path, FIXTURES / weights, classes=[0, 1, 2]))
    assert summary["status"] == "finished"
    model = load_model(tmp_path / "ft")
    assert model.config.num_classes == 3 and model.config.class_names == ["0", "1", "2"]


def test_frozen_blocks_do_not_move_and_the_rest_does(tmp_path):
    source = FIXTURES / "timm_vit_token.safetensors"
    before = load_model(source).state_dict()
    train(quick(tmp_path, source, freeze_blocks=1, epochs=2))
    after = load_file(tmp_path / "ft" / "model.safetensors")
    for name in ("patch_embed.proj.weight", "pos_embed", "cls_token", "blocks.0.attn.qkv.weight", "blocks.0.norm1.weight"):
        assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["blocks.1.mlp.fc1.weight"], before["blocks.1.mlp.fc1.weight"])
    assert after["head.weight"].abs().sum() > 0


def test_linear_probe_trains_only_the_head(tmp_path):
    source = FIXTURES / "hf_vit"
    before = load_model(source).state_dict()
    train(quick(tmp_path, source, linear_probe=True, epochs=2))
    after = load_file(tmp_path / "ft" / "model.safetensors")
    moved = sorted(name for name in after if name in before and not torch.equal(after[name], before[name]))
    assert moved == ["head.bias", "head.weight"]  # 10 classes before and after: only the (new) head moved
    assert after["head.weight"].abs().sum() > 0


@pytest.mark.parametrize("changes, error, message", [
    (dict(image_size=18), ConfigError, "cannot be fine-tuned at image size 18: patch size 4 does not divide image"),
    (dict(classes=[3]), DataError, "has a single class"),
    (dict(freeze_blocks=5), ConfigError, "freeze_blocks 5 is more than the model's 2 blocks"),
])
def test_bad_fine_tuning_requests_write_nothing(tmp_path, changes, error, message):
    with pytest.raises(error, match=message):
        train(quick(tmp_path, FIXTURES / "jax_vit_token.npz", **changes))
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_least_squares_solver_matches_a_direct_solve():
    torch.manual_seed(0)
    x, y, l2 = torch.randn(30, 6, dtype=torch.float64), torch.randn(30, 4, dtype=torch.float64), 0.7
    ours = fit_least_squares(x, y, l2)
    augmented = torch.cat([x, torch.ones(30, 1, dtype=torch.float64)], dim=1)
    stacked_x = torch.cat([augmented, l2 ** 0.5 * torch.eye(7, dtype=torch.float64)])
    stacked_y = torch.cat([y, torch.zeros(7, 4, dtype=torch.float64)])
    direct = torch.linalg.lstsq(stacked_x, stacked_y).solution
    torch.testing.assert_close(ours, direct)


def test_fewshot_separable_features_and_bad_shots():
    torch.manual_seed(0)
    centres = torch.randn(3, 8) * 5
    labels = torch.arange(3).repeat(20)
    features = centres[labels] + torch.randn(60, 8) * 0.1
    results = fewshot_accuracy(features, labels, features, labels, shots=[1, 5], seeds=2)
    assert results[5]["mean"] == 1.0 and len(results[1]["per_seed"]) == 2
    with pytest.raises(DataError, match="25 shots asked, but the smallest class has 20 training images"):
        fewshot_accuracy(features, labels, features, labels, shots=[25])


def test_features_are_cached(tmp_path, monkeypatch):
    import vitlab.checkpoint

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    loads = []
    real_load = vitlab.checkpoint.load_model
    monkeypatch.setattr(vitlab.checkpoint, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    first = run_fewshot(FIXTURES / "hf_vit", "digits", [1, 5], seeds=1, classes=[0, 1])
    assert len(loads) == 1  # both splits' features from one load

    monkeypatch.setattr(vitlab.checkpoint, "load_model", lambda *a, **k: pytest.fail("features not cached"))
    second = run_fewshot(FIXTURES / "hf_vit", "digits", [1, 5], seeds=1, classes=[0, 1])
    assert first["shots"] == second["shots"] and len(list((tmp_path / "features").iterdir())) == 2


@pytest.mark.parametrize("name, weights", REFERENCE_CHECKPOINTS)
def test_fewshot_and_linear_probe_on_every_checkpoint_kind(tmp_path, monkeypatch, name, weights):
    from vitlab.eval.fewshot import run_linear_probe

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    report = run_fewshot(FIXTURES / weights, "digits", [1, 5], seeds=2, classes=[0, 1, 2])
    expected_count = len(load_dataset("digits", "test", classes=[0, 1, 2]))
    assert set(report["shots"]) == {"1", "5"} and report["test_count"] == expected_count == 107
    assert 0 <= report["shots"]["5"]["mean"] <= 1
    assert 0 <= run_linear_probe(FIXTURES / weights, "digits", classes=[0, 1, 2])["test_top1"] <= 1


def test_eval_of_a_fine_tuned_run_uses_its_classes(tmp_path):
    from vitlab.eval.runner import run_evaluation

    train(quick(tmp_path, FIXTURES / "jax_vit_token.npz", classes=[5, 6, 7, 8, 9]))
    report = run_evaluation(tmp_path / "ft")
    assert report["count"] == 179 and report["class_names"] == ["5", "6", "7", "8", "9"]


@pytest.mark.parametrize("shots, classes, message", [
    ([1, 200], [0, 1], "200 shots asked, but the smallest class has 142 training images; use --shots up to 142"),
    ([1], [4], "single class"),
])
def test_bad_fewshot_requests_compute_and_write_nothing(tmp_path, monkeypatch, shots, classes, message):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    with pytest.raises(DataError, match=message):
        run_fewshot(FIXTURES / "hf_vit", "digits", shots, classes=classes)
    assert not (tmp_path / "features").exists()
