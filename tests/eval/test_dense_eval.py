"""eval/dense_eval.py and dense_data.py: `vitlab eval` of a segmenter (a linear head, the EoMT fixture) or a depth
model (the Depth Anything fixtures) on a dense data set: its figures are those of its own written predictions, the
same as the segmentation objective's validation counts, sliding windows are a plain stitch of the windows, and a
wrong pairing is one line and exit 2."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import FIXTURES
from scenefiles import tiny_scenes, write_mnist_files
from vitlab.checkpoint.formats import export_checkpoint, load_model
from vitlab.cli import main
from vitlab.config import ViTConfig
from vitlab.data.dense_sets import write_depth_png, write_palette_png
from vitlab.data.preprocess import normalize
from vitlab.data.scenes import CLASS_NAMES
from vitlab.dense.inference import predict_dense
from vitlab.eval.dense_eval import dense_settings, slide_maps
from vitlab.models.segmentation_heads import segmenter_from_backbone
from vitlab.models.vit import VisionTransformer

ENCODER = ViTConfig(
    image_size=16, patch_size=4, in_chans=1, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=0
)


def fixture(name: str) -> Path:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return path


def linear_segmenter(num_classes: int = len(CLASS_NAMES), names=CLASS_NAMES):
    torch.manual_seed(0)
    return segmenter_from_backbone(VisionTransformer(ENCODER), "linear", num_classes, list(names)).eval()


def write_manifest(root: Path, sizes, classes: int = 3, seed: int = 0) -> Path:
    """A manifest of image/mask pairs of `sizes` ((height, width) each): the first two training, the rest test."""
    rng = np.random.default_rng(seed)
    (root / "files").mkdir(parents=True)
    rows = ["image,mask,split"]
    for index, (height, width) in enumerate(sizes):
        labels = np.zeros((height, width), np.uint8)
        labels[height // 4 :, : width // 2] = 1
        labels[: height // 2, width // 2 :] = classes - 1
        labels[0, :] = 255  # ignored
        pixels = (labels[..., None] * 70 + rng.integers(0, 40, (height, width, 3))).astype(np.uint8)
        Image.fromarray(pixels).save(root / "files" / f"{index}.png")
        write_palette_png(labels, root / "files" / f"{index}.mask.png")
        rows.append(f"files/{index}.png,files/{index}.mask.png,{'train' if index < 2 else 'test'}")
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    return root / "pairs.csv"


def hand_miou(pairs: list[tuple[np.ndarray, np.ndarray]], num_classes: int) -> tuple[float, float]:
    """(mIoU, pixel accuracy) of (predicted, true) label maps, counted with numpy: IoU of the data set per class,
    the classes absent from truth and prediction left out of the mean, 255 ignored."""
    confusion = np.zeros((num_classes, num_classes), np.int64)
    for predicted, truth in pairs:
        kept = truth != 255
        np.add.at(confusion, (truth[kept].astype(int), predicted[kept].astype(int)), 1)
    correct = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - correct
    present = union > 0
    return float((correct[present] / union[present]).mean()), float(correct.sum() / confusion.sum())


def read_mask(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image).copy()


def test_the_eomt_fixtures_miou_is_that_of_the_masks_it_writes(tmp_path, capsys):
    """Images wider than the 32-pixel input slide windows; the figures are those of the written masks."""
    eomt = fixture("hf_eomt")
    manifest = write_manifest(tmp_path / "data", [(32, 32), (32, 32), (32, 32), (40, 72), (24, 56)])
    out, predictions = tmp_path / "out", tmp_path / "predictions"
    args = ["eval", str(eomt), "--dataset", "segmentation", "--data-dir", str(manifest), "--out", str(out)]
    assert main([*args, "--predictions", str(predictions), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "segmentation" and report["count"] == 3
    # Data that name no classes are counted under the model's names.
    assert report["class_names"] == ["sky", "road", "cat"] and len(report["per_class_iou"]) == 3
    assert report["inference"] == {"mode": "slide", "window": [32, 32], "stride": [24, 24]}
    pairs = [
        (read_mask(predictions / f"{index}.mask.png"), read_mask(manifest.parent / "files" / f"{index}.mask.png"))
        for index in (2, 3, 4)
    ]
    miou, accuracy = hand_miou(pairs, 3)
    assert report["miou"] == pytest.approx(miou, abs=1e-12) and report["pixel_accuracy"] == pytest.approx(accuracy)
    assert report["pixels"] == sum(int((truth != 255).sum()) for _, truth in pairs)
    with Image.open(predictions / "3.mask.png") as mask:
        assert json.loads(mask.info["vitlab:classes"]) == ["sky", "road", "cat"] and mask.size == (72, 40)
    assert (predictions / "3.overlay.png").stat().st_size > 0
    assert json.loads((out / "eval-segmentation-test.json").read_text())["miou"] == report["miou"]
    # The printed report: mmsegmentation's figures and its per-class table.
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"mIoU {100 * miou:.2f}%" in printed and "| Class |    IoU |    Acc |" in printed


def test_whole_inference_counts_what_predict_answers(tmp_path, capsys):
    eomt = fixture("hf_eomt")
    manifest = write_manifest(tmp_path / "data", [(32, 32), (32, 32), (40, 72), (24, 56)])
    args = ["eval", str(eomt), "--dataset", "segmentation", "--data-dir", str(manifest), "--out", str(tmp_path)]
    assert main([*args, "--inference", "whole", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model = load_model(eomt)
    pairs = []
    for index in (2, 3):
        with Image.open(manifest.parent / "files" / f"{index}.png") as image:
            pixels = torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
        labels = predict_dense(model, pixels, panoptic=False).labels.numpy()
        pairs.append((labels, read_mask(manifest.parent / "files" / f"{index}.mask.png")))
    assert report["inference"] == {"mode": "whole"} and report["miou"] == pytest.approx(hand_miou(pairs, 3)[0])


def test_sliding_windows_are_the_mean_of_each_windows_maps():
    model = linear_segmenter()
    image = normalize(torch.rand(1, 1, 16, 40), model.config)
    settings = dense_settings(model.config, "segmentation")
    assert settings.window == (16, 16) and settings.stride == (12, 12)  # 2/3 of the window, whole patches
    maps = slide_maps(model, image, settings.window, settings.stride, batch_size=2)
    with torch.no_grad():
        windows = {left: model(image[..., left : left + 16]) for left in (0, 12, 24)}  # the last flush with the end
    total, count = torch.zeros(11, 16, 40), torch.zeros(1, 16, 40)
    for left, logits in windows.items():
        total[:, :, left : left + 16] += logits[0]
        count[:, :, left : left + 16] += 1
    torch.testing.assert_close(maps, total / count, rtol=0, atol=1e-6)
    # An image one window holds is one pass.
    with torch.no_grad():
        torch.testing.assert_close(slide_maps(model, image[..., :16], (16, 16), (12, 12)), model(image[..., :16])[0])


@pytest.fixture
def scenes(tmp_path, monkeypatch):
    """MNIST stand-in files for a tiny mnist-scenes (32 / 8 / 12 scenes)."""
    tiny_scenes(monkeypatch, train=32, validation=8, test=12)
    return write_mnist_files(tmp_path / "mnist")


def test_a_segmenter_on_mnist_scenes_scores_as_the_objectives_validation(tmp_path, scenes, capsys):
    """The same scenes at the model's size: eval's figures equal the segmentation objective's (one arithmetic)."""
    from vitlab.data.loaders import open_splits
    from vitlab.data.source import DataRequest
    from vitlab.distributed import DistEnv
    from vitlab.objectives import build_objective
    from vitlab.train.config import finetune_config

    model = linear_segmenter()
    path = export_checkpoint(model, tmp_path / "segmenter.safetensors")
    args = ["eval", str(path), "--dataset", "mnist-scenes", "--data-dir", str(scenes), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    splits = open_splits(DataRequest("mnist-scenes", str(scenes), image_size=(16, 16), channels=1))
    config = finetune_config(
        dataset="mnist-scenes", objective="segmentation", segmentation={"head": "linear"}, augment={"crop_padding": 0}
    )
    objective = build_objective(config, splits.train)
    objective.check_data(splits.train)
    validation = objective.evaluate(load_model(path), splits.test, 5, DistEnv(), "fp32")
    assert report["count"] == validation["count"] == 12 and report["class_names"] == list(CLASS_NAMES)
    assert report["miou"] == pytest.approx(validation["miou"], abs=1e-12)
    assert report["per_class_iou"] == pytest.approx(validation["per_class_iou"], nan_ok=True)
    assert report["pixel_accuracy"] == pytest.approx(validation["pixel_accuracy"], abs=1e-12)


def write_depth_pairs(root: Path, sizes) -> Path:
    """NYUv2-style pairs (images/, depth/ in mm) in root, depth 0 (no measurement) in one corner."""
    rng = np.random.default_rng(len(sizes))
    for index, (height, width) in enumerate(sizes):
        depth = rng.uniform(0.5, 5.0, (height, width)).astype(np.float32)
        depth[:2, :2] = 0.0
        (root / "images").mkdir(parents=True, exist_ok=True)
        grey = (255 / depth.clip(min=0.5)).astype(np.uint8)
        Image.fromarray(np.repeat(grey[..., None], 3, axis=2)).save(root / "images" / f"{index}.png")
        write_depth_png(depth, root / "depth" / f"{index}.png")
    return root


def hand_depth_metrics(pairs, relative: bool, max_depth: float = 10.0) -> dict[str, float]:
    """AbsRel, RMSE and delta1 per image, then their mean; a relative answer aligned by numpy's least squares."""
    rows = []
    for predicted, truth in pairs:
        valid = (truth > 1e-3) & (truth <= max_depth)
        if relative:
            design = np.stack([predicted[valid], np.ones(valid.sum())], axis=1).astype(np.float64)
            (scale, shift), *_ = np.linalg.lstsq(design, 1.0 / truth[valid].astype(np.float64), rcond=None)
            predicted = 1.0 / np.maximum(scale * predicted.astype(np.float64) + shift, 1.0 / max_depth)
        p, d = np.clip(predicted[valid], 1e-3, max_depth), truth[valid]
        rows.append(
            [(np.abs(p - d) / d).mean(), np.sqrt(((p - d) ** 2).mean()), (np.maximum(p / d, d / p) < 1.25).mean()]
        )
    abs_rel, rmse, delta1 = np.mean(rows, axis=0)
    return {"abs_rel": abs_rel, "rmse": rmse, "delta1": delta1}


@pytest.mark.parametrize("name", ["hf_depth_anything", "hf_depth_anything_metric"])
def test_depth_anythings_metrics_are_those_of_its_answers(tmp_path, capsys, name):
    model_path = fixture(name)
    write_depth_pairs(tmp_path / "nyu" / "train", [(20, 20), (16, 16)])
    test = write_depth_pairs(tmp_path / "nyu" / "test", [(24, 40), (16, 30), (30, 18)])
    args = ["eval", str(model_path), "--dataset", "depth", "--data-dir", str(tmp_path / "nyu"), "--out", str(tmp_path)]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model = load_model(model_path)
    relative = model.config.head.depth_range == "relative"
    assert report["task"] == "depth" and report["count"] == 3 and report["inference"] == {"mode": "whole"}
    assert (report["alignment"] is not None) == relative
    answers = []
    for index in range(3):
        with Image.open(test / "images" / f"{index}.png") as image:
            pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
        with Image.open(test / "depth" / f"{index}.png") as file:
            truth = np.asarray(file).astype(np.float32) / 1000
        answers.append((predict_dense(model, pixels).depth.numpy(), truth))
    for metric, value in hand_depth_metrics(answers, relative).items():
        assert report[metric] == pytest.approx(value, rel=1e-4), metric


def test_a_label_map_counts_data_of_some_of_the_models_classes_under_its_labels(tmp_path, capsys):
    """Masks of two classes named in classes.txt ("cat", "sky"): the EoMT fixture's labels 2 and 0."""
    eomt = fixture("hf_eomt")
    manifest = write_manifest(tmp_path / "data", [(32, 32), (32, 32), (32, 32), (32, 48)], classes=2)
    (manifest.parent / "classes.txt").write_text("cat\nsky\n")
    predictions = tmp_path / "predictions"
    args = ["eval", str(eomt), "--dataset", "segmentation", "--data-dir", str(manifest), "--out", str(tmp_path)]
    assert main([*args, "--predictions", str(predictions), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["class_names"] == ["sky", "road", "cat"]
    to_model = np.full(256, 255, np.uint8)
    to_model[[0, 1]] = [2, 0]
    pairs = [
        (
            read_mask(predictions / f"{index}.mask.png"),
            to_model[read_mask(manifest.parent / "files" / f"{index}.mask.png")],
        )
        for index in (2, 3)
    ]
    assert report["miou"] == pytest.approx(hand_miou(pairs, 3)[0], abs=1e-12)
    # A label map naming a class the model lacks, and masks of more classes than the model's, named by none.
    (manifest.parent / "classes.txt").write_text("cat\ndog\n")
    assert main(args) == 2
    assert "the model names none of dog" in capsys.readouterr().err
    wider = write_manifest(tmp_path / "wider", [(32, 32), (32, 32), (32, 32)], classes=5)
    assert main([*args[:5], str(wider)]) == 2
    assert "the model predicts 3 classes (sky, road, cat) and manifest:pairs.csv has 5" in capsys.readouterr().err
