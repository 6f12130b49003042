"""cli/eval.py: `vitlab eval` of what `vitlab finetune` trained for segmentation (its run folder, on its test and
validation splits), and the pairings of model and data it refuses, each in one line with exit code 2."""

import json

import pytest
import torch

from conftest import FIXTURES
from scenefiles import tiny_scenes, write_mnist_files
from vitlab.cli import main


@pytest.fixture
def scenes(tmp_path, monkeypatch):
    tiny_scenes(monkeypatch, train=32, validation=8, test=8)
    return write_mnist_files(tmp_path / "mnist")


@pytest.mark.slow
@pytest.mark.run_level
@pytest.mark.parametrize("head", ["linear", "eomt"])
def test_eval_of_a_segmentation_run_measures_its_test_and_validation_splits(tmp_path, scenes, capsys, head):
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.models.registry import create_model
    from vitlab.train.config import finetune_config
    from vitlab.train.loop import train

    torch.manual_seed(0)
    backbone = export_checkpoint(create_model("digits-8", image_size=16, depth=1), tmp_path / "backbone.safetensors")
    config = finetune_config(
        init_from=str(backbone),
        dataset="mnist-scenes",
        data_dir=str(scenes),
        objective="segmentation",
        epochs=1,
        batch_size=16,
        precision="fp32",
        augment={"hflip": False},
        segmentation={"head": head, "queries": 4, "blocks": 1, "num_points": 64},
        out_dir=str(tmp_path),
        run_name=head,
        progress=False,
        threads=1,
    )
    summary = train(config)
    assert summary["status"] == "finished"
    capsys.readouterr()  # the run's own report
    run = tmp_path / head
    assert main(["eval", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The test scenes at the model's size, one window each: the figures the run's summary measured at its end.
    assert report["dataset"] == "mnist-scenes" and report["split"] == "test" and report["count"] == 8
    assert report["miou"] == pytest.approx(summary["test_miou"], abs=1e-9)
    assert main(["eval", str(run), "--split", "val", "--json"]) == 0
    validation = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert validation["count"] == 8 and validation["miou"] == pytest.approx(rows[-1]["val_miou"], abs=1e-9)
    assert (run / "eval-mnist-scenes-val.json").is_file()


def refused(capsys, args: list[str]) -> str:
    """The one line `vitlab eval ARGS` prints before it exits with code 2."""
    assert main(["eval", *args]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


def test_a_depth_model_on_masks_and_a_segmenter_on_classes_are_refused(tmp_path, capsys):
    depth, eomt = str(FIXTURES / "hf_depth_anything"), str(FIXTURES / "hf_eomt")
    manifest = tmp_path / "pairs.csv"
    manifest.write_text("image,mask\n")
    assert "--dataset depth" in refused(capsys, [depth, "--dataset", "segmentation", "--data-dir", str(manifest)])
    assert "a target per pixel" in refused(capsys, [eomt, "--dataset", "digits"])
    assert "classifier" in refused(capsys, [str(FIXTURES / "hf_vit"), "--dataset", "mnist-scenes"])
    relative = refused(capsys, [depth, "--dataset", "depth", "--data-dir", str(tmp_path), "--inference", "slide"])
    assert "--inference whole" in relative
    assert "--inference slide" in refused(
        capsys, [eomt, "--dataset", "mnist-scenes", "--window", "32", "--inference", "whole"]
    )


def test_a_segmenter_on_data_of_other_classes_is_refused(tmp_path, capsys, monkeypatch):
    tiny_scenes(monkeypatch, train=4, validation=2, test=2)
    mnist = write_mnist_files(tmp_path / "mnist")
    error = refused(capsys, [str(FIXTURES / "hf_eomt"), "--dataset", "mnist-scenes", "--data-dir", str(mnist)])
    assert "predicts 3 classes (sky, road, cat) and mnist-scenes has 11" in error


@pytest.mark.slow
@pytest.mark.run_level
def test_an_onnx_export_of_a_segmenter_scores_as_the_model(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from vitlab.data.dense_sets import write_palette_png

    rng = np.random.default_rng(0)
    (tmp_path / "files").mkdir()
    for index, (height, width) in enumerate([(32, 32), (32, 32), (40, 72), (24, 56)]):
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(
            tmp_path / "files" / f"{index}.png"
        )
        write_palette_png(
            rng.integers(0, 3, (height, width)).astype(np.uint8), tmp_path / "files" / f"{index}.mask.png"
        )
    rows = [f"files/{index}.png,files/{index}.mask.png" for index in range(4)]
    (tmp_path / "pairs.csv").write_text(
        "image,mask,split\n" + "".join(f"{row},{'train' if i < 2 else 'test'}\n" for i, row in enumerate(rows))
    )
    onnx = tmp_path / "eomt.onnx"
    assert main(["export", str(FIXTURES / "hf_eomt"), "-o", str(onnx)]) == 0
    data = ["--dataset", "segmentation", "--data-dir", str(tmp_path / "pairs.csv"), "--out", str(tmp_path), "--json"]
    capsys.readouterr()
    reports = []
    for model in (FIXTURES / "hf_eomt", onnx):
        assert main(["eval", str(model), *data]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["count"] == reports[1]["count"] == 2
    # The same labels, but for a pixel whose near tie the export's float error (<= 1e-4) might tip: one such pixel of
    # the 4,224 moves a class's IoU by about 1/1,400 and the mean of three by a third of that.
    assert reports[1]["miou"] == pytest.approx(reports[0]["miou"], abs=1e-3)
