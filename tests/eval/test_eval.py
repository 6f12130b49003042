import json

import pytest
import torch
from PIL import Image

from vitlab.checkpoint.io import save_model
from vitlab.cli import main
from vitlab.config import ViTConfig
from vitlab.data.datasets import load_dataset
from vitlab.errors import DataError, UsageError
from vitlab.eval.classify import evaluate
from vitlab.eval.predict import predict, run_predict
from vitlab.models import create_model

DIGITS = ViTConfig(
    image_size=8,
    patch_size=2,
    in_chans=1,
    embed_dim=16,
    depth=1,
    num_heads=2,
    mlp_dim=32,
    num_classes=10,
    class_names=[f"d{i}" for i in range(10)],
)


def constant_model(favourite: int):
    """A model whose logits ignore the image and always favour one class (zero head weights, biased head)."""
    model = create_model(DIGITS).eval()
    with torch.no_grad():
        model.head.bias.copy_(torch.linspace(0, -1, 10).roll(favourite))
    return model


def test_metrics_of_a_constant_predictor_are_exact():
    data = load_dataset("digits", "test")
    metrics = evaluate(constant_model(3), data)
    share_of_3 = (data.labels == 3).double().mean().item()
    assert metrics["count"] == 359 and abs(metrics["top1"] - share_of_3) < 1e-12
    assert metrics["per_class"][3] == 1.0 and metrics["per_class"][0] == 0.0
    top5_classes = {3, 4, 5, 6, 7}  # bias falls off after the favourite
    assert abs(metrics["top5"] - sum((data.labels == c).double().mean().item() for c in top5_classes)) < 1e-12
    confusion = torch.tensor(metrics["confusion"])
    assert confusion.sum() == 359 and confusion[:, 3].sum() == 359
    expected_loss = torch.nn.functional.cross_entropy(model_logits(metrics), data.labels).item()
    assert abs(metrics["loss"] - expected_loss) < 1e-6


def model_logits(metrics):
    bias = torch.linspace(0, -1, 10).roll(3)
    return bias.expand(metrics["count"], -1)


@pytest.mark.pictures  # the confusion matrix drawn in full
def test_eval_cli_writes_json_and_confusion_picture(tmp_path, capsys):
    path = save_model(constant_model(1), tmp_path / "m.safetensors")
    assert main(["eval", str(path), "--dataset", "digits", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "eval-m-safetensors-digits-test.json").read_text())
    assert report["count"] == 359 and (tmp_path / "out" / "eval-m-safetensors-digits-test.png").stat().st_size > 1000
    assert "top-1" in capsys.readouterr().out


def test_eval_of_a_run_and_of_its_other_models_keeps_every_result(tiny_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.copy(run / "checkpoints" / "best.safetensors", run / "other.safetensors")
    assert main(["eval", str(run), "--dataset", "digits"]) == 0
    assert main(["eval", str(run / "other.safetensors"), "--dataset", "digits"]) == 0
    first = json.loads((run / "eval-digits-test.json").read_text())
    second = json.loads((run / "eval-other-safetensors-digits-test.json").read_text())
    assert first["checkpoint"] == str(run) and second["checkpoint"] == str(run / "other.safetensors")


def test_eval_refuses_a_data_set_with_other_classes(tmp_path):
    path = save_model(create_model(DIGITS.replace(num_classes=3, class_names=None)), tmp_path / "m.safetensors")
    assert main(["eval", str(path), "--dataset", "digits"]) == 2


def test_predict_reads_files_and_folders_and_reports_bad_ones(tmp_path, capsys):
    model = constant_model(7)
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("L", (8, 8), 128).save(folder / "a.png")
    Image.new("RGB", (30, 20), (9, 9, 9)).save(folder / "b.jpg")
    (folder / "c.png").write_bytes(b"garbage")
    rows = predict(model, [folder], top_k=2)
    assert [r["path"].split("/")[-1] for r in rows] == ["a.png", "b.jpg", "c.png"]
    assert rows[0]["predictions"][0]["label"] == "d7" and len(rows[0]["predictions"]) == 2
    assert "not a readable image" in rows[2]["error"]
    probabilities = [p["probability"] for p in rows[1]["predictions"]]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1
    path = save_model(model, tmp_path / "m.safetensors")
    assert main(["predict", str(path), str(folder / "a.png"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["predictions"][0]["label"] == "d7"
    with pytest.raises(DataError, match="no such file"):
        predict(model, [tmp_path / "missing.png"])


def test_run_predict_is_what_the_command_runs_with_its_checks(tmp_path, capsys):
    """`vitlab predict` is one call of `run_predict`: a Python caller gets the same rows and the same refusals."""
    image = tmp_path / "a.png"
    Image.new("L", (8, 8), 128).save(image)
    path = save_model(constant_model(3), tmp_path / "m.safetensors")
    result = run_predict(path, [image], top_k=2, precision="fp32")
    assert result["precision"] == "fp32" and result["rows"][0]["predictions"][0]["label"] == "d3"
    assert main(["predict", str(path), str(image), "--top-k", "2", "--precision", "fp32", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == result["rows"]
    with pytest.raises(UsageError) as refused:
        run_predict(path, [image], backend="onnx")
    assert main(["predict", str(path), str(image), "--backend", "onnx"]) == 2
    assert capsys.readouterr().err == f"vitlab predict: error: {refused.value}\n"


@pytest.mark.run_level
def test_eval_of_a_run_on_its_validation_split_sees_the_images_it_chose_with(tmp_path):
    from vitlab.eval.runner import run_evaluation
    from vitlab.train.config import TrainConfig
    from vitlab.train.loop import train

    summary = train(
        TrainConfig(
            model_overrides=dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32),
            epochs=1,
            out_dir=str(tmp_path),
            run_name="run",
            progress=False,
            threads=1,
            seed=3,
        )
    )
    report = run_evaluation(tmp_path / "run", split="val", out=tmp_path / "eval")
    assert report["count"] == summary["val_count"] == 144
    assert report["top1"] == pytest.approx(summary["val_top1"])  # the same model on the same 144 images
    with pytest.raises(DataError, match="no official validation split"):
        run_evaluation(tmp_path / "run" / "model.safetensors", dataset="digits", split="val")


def test_a_head_wider_than_the_data_is_refused_not_sliced():
    model = create_model("digits-8", num_classes=12)
    with pytest.raises(DataError, match="the data have 10 classes but the model's head has 12"):
        evaluate(model, load_dataset("digits", "test"))


def test_images_with_channels_the_model_cannot_take_are_a_data_error():
    from vitlab.data.preprocess import prepare

    with pytest.raises(DataError, match="cannot turn 4-channel images into the model's 3 channels"):
        prepare(torch.zeros(1, 4, 8, 8), 255.0, ViTConfig(image_size=8, patch_size=2, embed_dim=8, num_heads=2))
