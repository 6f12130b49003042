"""The objective seam as a contract: a new objective is a subclass of `Objective` that writes only what differs,
plus one row in OBJECTIVES, and `vitlab train` trains it end to end (and resumes it exactly) with nothing else
edited. The table's pre-training mark and the objectives' command words agree."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from vitlab import objectives
from vitlab.cli import build_parser, main
from vitlab.objectives import OBJECTIVES, ObjectiveRow, objective_names, pretraining_methods
from vitlab.objectives.base import Objective
from vitlab.train.config import TrainConfig, pretrain_config

MICRO = dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32)


class MeanPixel(Objective):
    """A fake objective: regress each image's mean pixel value (in [0, 1]) with a one-output head."""

    name = "mean-pixel"
    description = "mean-pixel regression"

    def model_fields(self, source):
        return {"num_classes": 1, "class_names": None}

    def targets(self, unit_images, spec):
        return {"target": unit_images.mean(dim=(1, 2, 3))[:, None]}  # (B, 1)

    def loss(self, outputs, targets):
        return F.mse_loss(outputs.float(), targets["target"]), torch.zeros(0, dtype=torch.float64)


@pytest.fixture
def mean_pixel(monkeypatch):
    """The fake objective's one row in the table, for this test only."""
    monkeypatch.setitem(OBJECTIVES, MeanPixel.name, ObjectiveRow(lambda config, train_data: MeanPixel()))


def vitlab_train(tmp_path, run_name, *extra):
    return main(
        [
            "train",
            "--out-dir",
            str(tmp_path),
            "--epochs",
            "3",
            "--set",
            f"run_name={run_name}",
            "--set",
            "objective=mean-pixel",
            "--set",
            f"model_overrides={MICRO}",
            "--set",
            "threads=1",
            "--set",
            "progress=false",
            *extra,
        ]
    )


def test_a_new_objective_trains_through_vitlab_train_and_resumes_exactly(mean_pixel, tmp_path, stop_at_check, capsys):
    assert vitlab_train(tmp_path, "straight") == 0
    out = capsys.readouterr().out
    assert "training digits-8 (" in out and "vitlab train: digits-8 on digits - finished" in out
    assert "best mean-pixel regression loss" in out  # the validation line, in the objective's own words
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["objective"] == "mean-pixel" and summary["selection"] == "val_loss"
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2, 3] and rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert summary["test_loss"] < 0.01  # the head learns the mean brightness: a digit's mean is near 0.2

    stop_at_check(15)  # after step 4 of epoch 2
    assert vitlab_train(tmp_path, "stopped") == 0
    assert (
        f"stopped at epoch 2, step 4; state saved. Resume with: vitlab train --resume {tmp_path / 'stopped'}"
        in capsys.readouterr().out
    )
    stop_at_check(None)
    assert main(["train", "--resume", str(tmp_path / "stopped")]) == 0
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "stopped" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_an_objective_row_is_all_a_recipe_and_the_cli_need(mean_pixel):
    assert "mean-pixel" in objective_names() and TrainConfig(objective="mean-pixel").objective == "mean-pixel"
    assert "mean-pixel" not in pretraining_methods()
    with pytest.raises(SystemExit):  # not a pre-training method: `pretrain --method` does not offer it
        build_parser().parse_args(["pretrain", "--method", "mean-pixel"])


def test_pretrain_offers_the_rows_marked_pretraining(monkeypatch):
    assert pretraining_methods() == ("mpp", "mae", "distill", "dino")
    monkeypatch.setitem(
        OBJECTIVES, "mean-pixel", ObjectiveRow(lambda config, data: MeanPixel(), pretraining=True, help="a fake")
    )
    args = build_parser().parse_args(["pretrain", "--method", "mean-pixel"])
    assert args.method == "mean-pixel"


@pytest.mark.parametrize("name", objective_names())
def test_the_tables_pretraining_mark_and_the_objectives_command_agree(name, tmp_path):
    config = pretrain_config(name) if name in pretraining_methods() else TrainConfig(objective=name)
    if name == "distill":  # distillation loads its teachers as it is built
        from vitlab.checkpoint.formats import export_checkpoint
        from vitlab.models.registry import create_model

        teacher = export_checkpoint(create_model("digits-8", depth=1), tmp_path / "teacher.safetensors")
        config.pretrain.distill_teachers = [str(teacher)]
    data = type("Data", (), {"num_classes": 10, "__len__": lambda self: 100})()  # DINO counts its steps per epoch
    objective = objectives.build_objective(config, data)
    assert objective.name == name
    assert objective.command == ("pretrain" if OBJECTIVES[name].pretraining else "train")
