"""Segmentation fine-tuning through the training loop (`--set objective=segmentation`) on a tiny mnist-scenes: a
short fine-tune improves validation mIoU over its start (EoMT and a linear head), a run stopped mid-epoch resumes to
the uninterrupted weights (mask annealing included), and the saved model loads back as the segmenter it was."""

import json

import pytest
import torch
from safetensors.torch import load_file

from scenefiles import tiny_scenes, write_mnist_files
from vitlab.checkpoint.formats import export_checkpoint, load_model
from vitlab.data.loaders import open_splits
from vitlab.data.source import DataRequest
from vitlab.distributed import DistEnv
from vitlab.objectives import build_objective
from vitlab.train.config import TrainConfig, finetune_config
from vitlab.train.loop import train
from vitlab.train.state import load_training_state


@pytest.fixture
def backbone(tmp_path, monkeypatch):
    """A 2-block digits-8 encoder at 16 px saved as a checkpoint, and MNIST stand-in files for 64 / 16 / 16 scenes."""
    tiny_scenes(monkeypatch, train=64, validation=16, test=16)
    write_mnist_files(tmp_path / "mnist")
    torch.manual_seed(0)
    from vitlab.models.registry import create_model

    return export_checkpoint(create_model("digits-8", image_size=16, depth=2), tmp_path / "backbone.safetensors")


def recipe(tmp_path, head: str, run_name: str, **changes) -> TrainConfig:
    fields = dict(
        init_from=str(tmp_path / "backbone.safetensors"),
        dataset="mnist-scenes",
        data_dir=str(tmp_path / "mnist"),
        objective="segmentation",
        optimizer="adamw",
        lr=3e-3,
        weight_decay=0.05,
        epochs=4,
        batch_size=16,
        warmup_epochs=0.5,
        precision="fp32",
        augment={"hflip": False},
        segmentation={"head": head, "queries": 8, "blocks": 1, "num_points": 128, "backbone_lr_scale": 0.5},
        out_dir=str(tmp_path),
        run_name=run_name,
        progress=False,
        threads=1,
    )
    fields.update(changes)
    return finetune_config(**fields)


@pytest.mark.run_level
@pytest.mark.parametrize("head", ["eomt", "linear"])
def test_a_short_fine_tune_improves_validation_miou_over_its_start(tmp_path, backbone, head):
    config = recipe(tmp_path, head, head)
    # The start: the model the run begins from (the encoder, a fresh head drawn after the run's seed).
    splits = open_splits(DataRequest("mnist-scenes", config.data_dir, image_size=(16, 16), channels=1))
    objective = build_objective(config, splits.train)
    objective.check_data(splits.train)
    torch.manual_seed(config.seed)
    start = objective.adapt_model(load_model(backbone))
    before = objective.evaluate(start, splits.validation, 16, DistEnv(), "fp32")["miou"]
    summary = train(config)
    rows = [json.loads(line) for line in (tmp_path / head / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "finished" and summary["selection"] == "val_miou"
    assert max(row["val_miou"] for row in rows) > before + 0.02
    assert summary["best_val_miou"] == max(row["val_miou"] for row in rows)
    assert 0 < summary["test_miou"] <= 1 and len(summary["per_class_iou"]) == 11
    # The saved model is the segmenter, read back as it was trained.
    model = load_model(tmp_path / head / "model.safetensors")
    assert model.config.dense_head == head and model.config.class_names[0] == "background"
    results = objective.evaluate(model, splits.test, 16, DistEnv(), "fp32")
    assert results["miou"] == pytest.approx(summary["test_miou"])


@pytest.mark.run_level
def test_an_eomt_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path, backbone, stop_at_check):
    changes = dict(epochs=3, segmentation={"head": "eomt", "queries": 8, "blocks": 2, "num_points": 64})
    straight = train(recipe(tmp_path, "eomt", "straight", **changes))
    stop_at_check(7)  # after step 2 of epoch 2 (4 steps an epoch, one check at its end)
    stopped = train(recipe(tmp_path, "eomt", "stopped", **changes))
    assert stopped["status"] == "interrupted" and (stopped["epoch"], stopped["step"]) == (1, 2)
    stop_at_check(None)
    resumed = train(TrainConfig(), resume=tmp_path / "stopped")
    assert resumed["status"] == "finished"
    for name in ("model.safetensors", "checkpoints/best.safetensors"):
        a, b = load_file(tmp_path / "straight" / name), load_file(tmp_path / "stopped" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    states = [load_training_state(tmp_path / run)["objective_state"] for run in ("straight", "stopped")]
    assert int(states[0]["annealing_step"][0]) == int(states[1]["annealing_step"][0]) == 12
    assert resumed["test_miou"] == straight["test_miou"]
