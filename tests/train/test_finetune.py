"""Transfer: fine-tuning any checkpoint kind at a new resolution, freezing, linear probing (few-shot: test_fewshot.py)."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, REFERENCE_CHECKPOINTS
from vitlab import load_model
from vitlab.cli import main
from vitlab.data.datasets import load_dataset
from vitlab.errors import ConfigError, DataError, UsageError
from vitlab.train.config import finetune_config, finetune_recipe
from vitlab.train.loop import train
from vitlab.train.setup import build_finetune_model


def quick(tmp_path, source, **changes):
    fields = dict(
        init_from=str(source),
        dataset="digits",
        epochs=1,
        batch_size=256,
        out_dir=str(tmp_path),
        run_name="ft",
        progress=False,
        threads=1,
    )
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


@pytest.mark.run_level
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
    for name in (
        "patch_embed.proj.weight",
        "pos_embed",
        "cls_token",
        "blocks.0.attn.qkv.weight",
        "blocks.0.norm1.weight",
    ):
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


@pytest.mark.parametrize(
    "changes, error, message",
    [
        (dict(image_size=18), ConfigError, "cannot be fine-tuned at image size 18: patch size 4 does not divide image"),
        (dict(classes=[3]), DataError, "has a single class"),
        (dict(freeze_blocks=5), ConfigError, "freeze_blocks 5 is more than the model's 2 blocks"),
    ],
)
def test_bad_fine_tuning_requests_write_nothing(tmp_path, changes, error, message):
    with pytest.raises(error, match=message):
        train(quick(tmp_path, FIXTURES / "jax_vit_token.npz", **changes))
    assert not (tmp_path / "ft" / "checkpoints").exists()


def test_eval_of_a_fine_tuned_run_uses_its_classes(tmp_path):
    from vitlab.eval.runner import run_evaluation

    train(quick(tmp_path, FIXTURES / "jax_vit_token.npz", classes=[5, 6, 7, 8, 9]))
    report = run_evaluation(tmp_path / "ft")
    assert report["count"] == 179 and report["class_names"] == ["5", "6", "7", "8", "9"]


@pytest.mark.parametrize("given", [["--from", "x.npz"], ["--dataset", "digits"], []])
def test_finetune_recipe_needs_a_checkpoint_and_a_data_set_as_the_command_does(given, tmp_path, capsys):
    """The check lives in `finetune_recipe`: a Python caller gets the command's message."""
    pairs = dict(zip(given[::2], given[1::2]))
    with pytest.raises(UsageError) as refused:
        finetune_recipe(pairs.get("--from"), pairs.get("--dataset"))
    assert str(refused.value) == "finetune needs --from CHECKPOINT and --dataset NAME (or --resume RUN_DIR)"
    assert main(["finetune", *given, "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"vitlab finetune: error: {refused.value}\n"
    assert not any(tmp_path.iterdir())


def test_finetune_recipe_is_the_fine_tuning_defaults_with_the_overrides_after(tmp_path):
    config = finetune_recipe("runs/123", "mnist", overrides=["epochs=3", "dataset=cifar10"])
    assert config == finetune_config(init_from="runs/123", dataset="cifar10", epochs=3)  # a path stays text
    recipe = tmp_path / "r.py"
    recipe.write_text("from vitlab.train.config import TrainConfig\nconfig = TrainConfig(lr=0.5)\n")
    assert finetune_recipe("a.npz", "digits", recipe).lr == 0.5
