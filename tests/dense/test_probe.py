"""dense/probe.py and probe_data.py: `vitlab dense-probe` from a data folder to figures and written predictions;
the splits (the test split never trained or chosen on), sliding windows over wider test images, bad masks left
out in one line."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.cli import main
from vitlab.data.dense_sets import write_palette_png
from vitlab.data.probe_data import open_probe_data
from vitlab.dense import probe
from vitlab.metrics.segmentation import ConfusionMatrix


def scene(seed: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """A black image with a white box (label 1) and a grey box (label 2): uint8 (H, W, 3) and labels (H, W)."""
    rng = np.random.default_rng(seed)
    pixels, labels = np.zeros((height, width, 3), np.uint8), np.zeros((height, width), np.uint8)
    for value, label in ((255, 1), (110, 2)):
        top, left = rng.integers(0, height - 3), rng.integers(0, width - 3)
        pixels[top : top + 4, left : left + 4] = value
        labels[top : top + 4, left : left + 4] = label
    return pixels, labels


def make_voc(root, train=10, val=4, size=(12, 8)):
    """A Pascal VOC folder: `train` and `val` images of `size` (width, height) with palette masks."""
    voc = root / "VOC2012"
    stems = {"train": [f"t{i}" for i in range(train)], "val": [f"v{i}" for i in range(val)]}
    for split, names in stems.items():
        for seed, stem in enumerate(names):
            pixels, labels = scene(seed + (100 if split == "val" else 0), *size)
            (voc / "JPEGImages").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(voc / "JPEGImages" / f"{stem}.jpg", quality=95)
            write_palette_png(labels, voc / "SegmentationClass" / f"{stem}.png")
    lists = voc / "ImageSets" / "Segmentation"
    lists.mkdir(parents=True)
    for split, names in stems.items():
        (lists / f"{split}.txt").write_text("\n".join(names) + "\n")
    return voc


def strict_json(text: str):
    """`text` parsed as strict JSON: a bare NaN or Infinity is an error, not a float."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_probe_scores_what_it_writes_and_leaves_out_a_bad_mask(tiny_run, tmp_path, capsys):
    voc = make_voc(tmp_path)
    write_palette_png(np.zeros((5, 5), np.uint8), voc / "SegmentationClass" / "v3.png")  # not its image's size
    out = tmp_path / "predictions"
    args = ["dense-probe", str(tiny_run), str(voc), "--epochs", "2", "--lr", "1e-2,1e-1", "--predictions", str(out)]
    assert main(args + ["--json"]) == 0
    captured = capsys.readouterr()
    report = strict_json(captured.out)
    assert captured.err == ""  # --json: no progress lines
    assert report["task"] == "segmentation" and report["data"] == "voc2012"
    # VOC's val is the test split: 4 pairs, 3 scored (v3 left out).
    assert report["examples"] == {"train": 9, "validation": 1, "test": 3} and report["test"]["examples"] == 3
    assert set(report["tried"]) == {"0.01", "0.1"} and report["head"] == "linear"
    assert report["chosen_by"] == "validation mean_iou"
    assert len(report["skipped"]) == 1 and "v3.png" in report["skipped"][0] and "\n" not in report["skipped"][0]
    # VOC's classes 3..20 are in no mask: no IoU, null (never a bare NaN).
    iou = report["test"]["per_class_iou"]
    assert len(iou) == 21 and iou["aeroplane"] is not None and iou["bird"] is None
    # The figure is the written predictions' own: recount them against the masks.
    confusion = ConfusionMatrix(21)
    assert sorted(path.name for path in out.iterdir()) == [
        f"v{index}.{kind}.png" for index in range(3) for kind in ("mask", "overlay")
    ]
    for index in range(3):
        predicted = Image.open(out / f"v{index}.mask.png")
        assert predicted.mode == "P" and predicted.size == (12, 8)
        assert json.loads(predicted.text["vitlab:classes"])[:2] == ["background", "aeroplane"]
        overlay = Image.open(out / f"v{index}.overlay.png")
        assert overlay.mode == "RGB" and overlay.width > 12 and overlay.height >= 8  # the image, then its legend
        truth = np.array(Image.open(voc / "SegmentationClass" / f"v{index}.png"))
        confusion.update(torch.from_numpy(np.array(predicted)).long()[None], torch.from_numpy(truth)[None])
    assert confusion.scores().mean_iou == pytest.approx(report["test"]["mean_iou"], abs=1e-12)


def test_the_summary_names_every_left_out_file_and_the_heads_show_progress(tiny_run, tmp_path, capsys):
    voc = make_voc(tmp_path)
    for stem in ("v1", "v2", "v3"):
        write_palette_png(np.zeros((5, 5), np.uint8), voc / "SegmentationClass" / f"{stem}.png")
    args = ["dense-probe", str(tiny_run), str(voc), "--epochs", "4", "--lr", "1e-2,1e-1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "9 training, 1 validation, 1 test examples" in captured.out  # the one test pair scored
    assert "3 examples left out:" in captured.out
    assert all(f"{stem}.png: the mask is 5x5" in captured.out for stem in ("v1", "v2", "v3"))
    # 2 heads x 4 epochs: a line per epoch but the last (no terminal here, so lines, not a bar), with the time left.
    heads = [line for line in captured.err.splitlines() if line.startswith("segmentation heads")]
    assert len(heads) == 7 and heads[-1].startswith("segmentation heads (2 learning rates x 4 epochs)  epoch 7/8")
    assert all("left" in line for line in heads)


def test_a_voc_layout_of_other_data_is_reported_with_its_own_class_names(tiny_run, tmp_path, capsys):
    voc = make_voc(tmp_path).rename(tmp_path / "boxes")  # VOC's layout, not VOC 2012: labels 0..2
    out = tmp_path / "predictions"
    args = ["dense-probe", str(tiny_run), str(voc), "--epochs", "1", "--lr", "1e-1", "--json"]
    assert main(args) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["data"] == "voc-layout:boxes" and list(report["test"]["per_class_iou"]) == ["0", "1", "2"]
    (voc / "classes.txt").write_text("floor\nwhite box\ngrey box\n")
    assert main(args + ["--predictions", str(out)]) == 0
    report = strict_json(capsys.readouterr().out)
    assert list(report["test"]["per_class_iou"]) == ["floor", "white box", "grey box"]
    classes = json.loads(Image.open(out / "v0.mask.png").text["vitlab:classes"])
    assert classes == ["floor", "white box", "grey box"]
    assert main(args + ["--classes", "a,b,c"]) == 0  # the command line's names win over the folder's
    assert list(strict_json(capsys.readouterr().out)["test"]["per_class_iou"]) == ["a", "b", "c"]


def test_test_images_wider_than_the_window_slide_windows_and_others_take_one_pass(tiny_run, tmp_path, monkeypatch):
    from vitlab.checkpoint.formats import load_model

    voc = make_voc(tmp_path, train=4, val=2)
    data = open_probe_data(str(voc), None, None, None, validation_fraction=0.25)
    model = load_model(tiny_run)
    task = probe.TASKS["segmentation"]
    calls = []
    real = probe.sliding_window_features
    monkeypatch.setattr(probe, "sliding_window_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    narrow = probe.probe_settings(model, task, data, None, 8, window=8, stride=6)
    wide = probe.probe_settings(model, task, data, None, 8, window=12, stride=12)
    model.dynamic_size = True
    train = probe.training_features(model, data.train, task, narrow, "train")
    validation = probe.training_features(model, data.validation, task, narrow, "validation")
    trained = task.train(*train, validation[0].float(), validation[1], data, narrow)
    slid = probe.evaluate(model, trained.head, data.test, task, data, narrow)
    assert len(calls) == 2  # 8x12 views past an 8-pixel window: windows at columns 0 and 4 (flush with the end)
    whole = probe.evaluate(model, trained.head, data.test, task, data, wide)
    assert len(calls) == 2  # a 12-pixel window holds the view: one pass, no windows
    assert 0 <= slid["mean_iou"] <= 1 and 0 <= whole["mean_iou"] <= 1


def test_one_split_data_has_its_test_carved_apart(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    rows = ["image,mask"]
    for index in range(20):
        pixels, labels = scene(index, 12, 8)
        Image.fromarray(pixels).save(folder / f"{index}.png")
        write_palette_png(labels, folder / f"{index}_mask.png")
        rows.append(f"{index}.png,{index}_mask.png")
    (folder / "pairs.csv").write_text("\n".join(rows) + "\n")
    data = open_probe_data(str(folder / "pairs.csv"), None, None, None, validation_fraction=0.25)
    splits = [set(examples.names) for examples in (data.train, data.validation, data.test)]
    assert [len(names) for names in splits] == [12, 4, 4]
    assert not (splits[0] & splits[2]) and not (splits[1] & splits[2]) and not (splits[0] & splits[1])
    assert data.num_classes == 3  # read from the masks: labels 0..2


def test_the_training_free_head_chooses_its_k_on_validation(tiny_run, tmp_path, capsys):
    voc = make_voc(tmp_path)
    args = ["dense-probe", str(tiny_run), str(voc), "--head", "knn", "--neighbours", "1,3", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["head"] == "knn" and set(report["tried"]) == {"1", "3"}
    assert report["chosen"]["k"] in (1, 3) and report["tried"][str(report["chosen"]["k"])] == max(
        report["tried"].values()
    )
    assert 0 <= report["test"]["mean_iou"] <= 1 and report["examples"]["test"] == 4


def make_depth_pairs(root, count=12, size=(12, 8)):
    """An NYUv2-style folder: images/ and depth/ (16-bit PNG, millimetres), depth growing with brightness."""
    from vitlab.data.dense_sets import write_depth_png

    for index in range(count):
        rng = np.random.default_rng(index)
        depth = np.full((size[1], size[0]), 4.0, np.float32)
        top, left = rng.integers(0, size[1] - 3), rng.integers(0, size[0] - 3)
        depth[top : top + 4, left : left + 4] = 1.5
        depth[0, 0] = 0.0  # no measurement
        pixels = np.repeat((depth * 50).astype(np.uint8)[..., None], 3, axis=2)
        (root / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / "images" / f"{index}.png")
        write_depth_png(depth, root / "depth" / f"{index}.png")
    return root


def test_the_depth_probe_scores_what_it_writes(tiny_run, tmp_path, capsys):
    from vitlab.metrics.depth import DepthMeter

    pairs = make_depth_pairs(tmp_path / "nyu")
    out = tmp_path / "depths"
    args = ["dense-probe", str(tiny_run), str(pairs), "--epochs", "2", "--lr", "1e-2", "--predictions", str(out)]
    assert main(args + ["--max-depth", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "depth" and report["chosen_by"] == "validation rmse"
    assert report["layers"] == [0]  # last4 of a one-block model: its one block
    assert report["examples"] == {"train": 9, "validation": 1, "test": 2}  # one split: a fifth carved as test
    meter = DepthMeter(1e-3, 5.0)
    written = sorted(out.iterdir())
    assert len(written) == report["examples"]["test"]
    for path in written:
        predicted = np.array(Image.open(path), dtype=np.float32) / 1000.0  # millimetres, rounded
        assert predicted.shape == (8, 12)
        truth = np.array(Image.open(pairs / "depth" / path.name), dtype=np.float32) / 1000.0
        meter.update(torch.from_numpy(predicted)[None], torch.from_numpy(truth)[None])
    # The written maps are the scored ones, to the half millimetre the 16-bit PNG rounds to.
    assert meter.scores().rmse == pytest.approx(report["test"]["rmse"], abs=1e-3)
    assert meter.scores().images == report["test"]["images"] == report["examples"]["test"]


def test_class_names_for_data_that_has_none_of_its_own_to_name_are_refused(tmp_path):
    from vitlab.errors import UsageError

    with pytest.raises(UsageError, match="names its own classes"):
        open_probe_data(None, "mnist-scenes", None, None, classes="a,b")
    with pytest.raises(UsageError, match="depth maps, which have no classes"):
        open_probe_data(str(make_depth_pairs(tmp_path / "nyu")), None, None, None, classes="a,b")
