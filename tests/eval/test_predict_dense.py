"""`vitlab predict` on dense models: a non-square photo gives its mask, overlay and panoptic files (EoMT) or its
16-bit depth and coloured depth (Depth Anything), all at the photo's own size, and one line saying what it holds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.checkpoint.io import save_model
from vitlab.cli import main
from vitlab.eval.predict import format_predictions, run_predict
from vitlab.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dense"))
from test_inference import dpt_config, eomt_config, photo  # noqa: E402

HEIGHT, WIDTH = 45, 70


@pytest.fixture
def photo_file(tmp_path) -> Path:
    path = tmp_path / "street.png"
    Image.fromarray(photo(HEIGHT, WIDTH).permute(1, 2, 0).numpy()).save(path)
    return path


def saved(config, tmp_path: Path, name: str) -> Path:
    torch.manual_seed(0)
    model = create_model(config)
    if config.dense_head == "dpt":  # a fresh head's ReLU gives 0 everywhere: lift the last layer's bias
        with torch.no_grad():
            model.depth_head.scratch.output_conv2[2].bias.fill_(0.5)
    return save_model(model, tmp_path / f"{name}.safetensors")


def test_a_segmentation_model_writes_mask_overlay_and_panoptic_files_at_the_photos_size(tmp_path, photo_file):
    checkpoint = saved(eomt_config(), tmp_path, "eomt")
    result = run_predict(checkpoint, [photo_file], out=tmp_path / "out", precision="fp32")
    (row,) = result["rows"]
    out = tmp_path / "out"
    assert sorted(Path(f).name for f in row["files"]) == sorted(
        f"street.{suffix}" for suffix in ("mask.png", "overlay.png", "panoptic.png", "segments.json")
    )
    mask = Image.open(out / "street.mask.png")
    assert mask.mode == "P" and mask.size == (WIDTH, HEIGHT)
    assert json.loads(mask.text["vitlab:classes"]) == ["sky", "road", "car"]
    labels = np.asarray(mask)
    assert {c["index"] for c in row["classes"]} == set(np.unique(labels).tolist())
    assert sum(c["pixels"] for c in row["classes"]) == HEIGHT * WIDTH
    overlay = Image.open(out / "street.overlay.png")
    assert overlay.height >= HEIGHT and overlay.width > WIDTH  # the photo and its legend
    panoptic = np.asarray(Image.open(out / "street.panoptic.png").convert("RGB")).astype(np.int64)
    assert panoptic.shape == (HEIGHT, WIDTH, 3)
    ids = panoptic[..., 0] + 256 * panoptic[..., 1] + 65536 * panoptic[..., 2]
    segments = json.loads((out / "street.segments.json").read_text())["segments"]
    for segment in segments:
        assert int((ids == segment["id"]).sum()) == segment["pixels"] > 0
    line = format_predictions(result["rows"])
    assert "street.png" in line and row["classes"][0]["label"] in line and str(out) in line


def test_a_depth_model_writes_16_bit_depth_and_colours_at_the_photos_size(tmp_path, photo_file):
    checkpoint = saved(dpt_config(), tmp_path, "dpt")
    (row,) = run_predict(checkpoint, [photo_file], out=tmp_path / "out", precision="fp32")["rows"]
    depth = Image.open(tmp_path / "out" / "street.depth.png")
    assert depth.mode.startswith("I;16") and depth.size == (WIDTH, HEIGHT)
    meaning = json.loads(depth.text["vitlab:depth"])
    assert meaning["kind"] == "relative" and meaning["scale"] == row["scale"]
    # Keys a program reads as names (row["png_value"], jq .png_value): no spaces.
    assert all(key.isidentifier() for key in (*row, *meaning)) and row["png_value"] == meaning["png_value"]
    values = np.asarray(depth).astype(np.float64) / meaning["scale"]  # back to relative inverse depth
    assert abs(values.max() - row["max"]) <= 1 / meaning["scale"] and int(np.asarray(depth).max()) == 65535
    colour = Image.open(tmp_path / "out" / "street.depth-colour.png")
    assert colour.mode == "RGB" and colour.width >= WIDTH and colour.height > HEIGHT  # the map, its scale below


def test_a_metric_depth_model_writes_millimetres(tmp_path, photo_file):
    checkpoint = saved(
        dpt_config(head=dpt_config().head.replace(depth_range="metric", max_depth=20.0)), tmp_path, "metric"
    )
    (row,) = run_predict(checkpoint, [photo_file], out=tmp_path / "out", precision="fp32")["rows"]
    depth = np.asarray(Image.open(tmp_path / "out" / "street.depth.png")).astype(np.float64)
    assert abs(depth.max() / 1000 - row["max"]) <= 1e-3 and 0 <= row["min"] <= row["max"] <= 20.0


def test_the_command_prints_one_line_per_photo(tmp_path, photo_file, capsys):
    checkpoint = saved(eomt_config(), tmp_path, "eomt")
    code = main(["predict", str(checkpoint), str(photo_file), "-o", str(tmp_path / "out"), "--precision", "fp32"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(printed) == 1 and printed[0].startswith(str(photo_file))
    assert (tmp_path / "out" / "street.overlay.png").is_file()


# ------------------------------------------------------------------------------ against transformers, on the fixtures
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_eomt_fixture_predicts_as_transformers_model_and_processor_on_a_non_square_photo():
    """tests/fixtures/hf_eomt (written by transformers) loaded by vitlab, against EomtForUniversalSegmentation with
    EomtImageProcessorPil padding as the panoptic releases do, and its panoptic post-processing."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.eomt.image_processing_pil_eomt import EomtImageProcessorPil

    from vitlab.checkpoint import load_model
    from vitlab.dense.inference import model_inputs, output_tensors, segmentation_answer

    pixels = photo(HEIGHT, WIDTH, seed=7)
    model = load_model(FIXTURES / "hf_eomt").eval()
    reference = transformers.EomtForUniversalSegmentation.from_pretrained(FIXTURES / "hf_eomt").eval()
    processor = EomtImageProcessorPil(size={"shortest_edge": 32, "longest_edge": 32}, do_pad=True)
    encoded = processor(pixels.permute(1, 2, 0).numpy(), return_tensors="pt")
    with torch.no_grad():
        expected = reference(pixel_values=encoded["pixel_values"])
        images, view = model_inputs(pixels, model.config)
        class_logits, mask_logits = output_tensors(model(images))
    torch.testing.assert_close(mask_logits, expected.masks_queries_logits, atol=1e-4, rtol=1e-4)
    panoptic = processor.post_process_panoptic_segmentation(expected, target_sizes=[(HEIGHT, WIDTH)], threshold=0.3)[0]
    answer = segmentation_answer(class_logits, mask_logits, view, threshold=0.3)
    assert panoptic["segments_info"], "a random fixture needs a low threshold to give segments"
    assert torch.equal(answer.panoptic.segmentation, panoptic["segmentation"].long())
    assert [s["label_id"] for s in answer.panoptic.segments] == [s["label_id"] for s in panoptic["segments_info"]]


@pytest.mark.parametrize("fixture", ["hf_depth_anything", "hf_depth_anything_metric"])
def test_depth_anything_fixture_predicts_as_transformers_model_and_processor(fixture, tmp_path, photo_file):
    """The fixtures (written by transformers) through `vitlab predict`, against DepthAnythingForDepthEstimation with
    DPTImageProcessorPil (keep aspect, multiple of 14 -> here of the fixture's patch 4) and its post-processing."""
    transformers = pytest.importorskip("transformers")
    from PIL import Image as PILImage
    from transformers.models.dpt.image_processing_pil_dpt import DPTImageProcessorPil

    from vitlab.checkpoint import load_model
    from vitlab.dense.inference import predict_dense

    pixels = torch.from_numpy(np.asarray(PILImage.open(photo_file).convert("RGB")).copy()).permute(2, 0, 1)
    reference = transformers.DepthAnythingForDepthEstimation.from_pretrained(FIXTURES / fixture).eval()
    processor = DPTImageProcessorPil(
        size={"height": 16, "width": 16},
        keep_aspect_ratio=True,
        ensure_multiple_of=4,
        resample=PILImage.Resampling.BICUBIC,
        do_pad=False,
        image_mean=[0.485, 0.456, 0.406],  # Depth Anything's preprocessor_config (DPT's own defaults are 0.5)
        image_std=[0.229, 0.224, 0.225],
    )
    encoded = processor(pixels.permute(1, 2, 0).numpy(), return_tensors="pt")
    with torch.no_grad():
        outputs = reference(pixel_values=encoded["pixel_values"])
    expected = processor.post_process_depth_estimation(outputs, target_sizes=[(HEIGHT, WIDTH)])[0]["predicted_depth"]
    answer = predict_dense(load_model(FIXTURES / fixture).eval(), pixels)
    torch.testing.assert_close(answer.depth, expected, atol=1e-4, rtol=1e-4)
    (row,) = run_predict(FIXTURES / fixture, [photo_file], out=tmp_path, precision="fp32")["rows"]
    written = np.asarray(Image.open(tmp_path / "street.depth.png")).astype(np.float64) / row["scale"]
    # The file holds whole units of 1/scale, from 0 up: bicubic resizing overshoots a little below 0 at the edges.
    closest = np.clip(expected.numpy(), 0, None)
    np.testing.assert_allclose(written, closest, atol=0.5 / row["scale"] + 1e-4 * float(expected.max()))


def test_an_unreadable_photo_is_named_once_and_the_others_go_on(tmp_path, photo_file):
    checkpoint = saved(dpt_config(), tmp_path, "dpt")
    text = tmp_path / "text.png"
    text.write_text("not an image")
    rows = run_predict(checkpoint, [text, photo_file], out=tmp_path / "out", precision="fp32")["rows"]
    assert [Path(row["path"]).name for row in rows] == ["text.png", "street.png"] and "files" in rows[1]
    assert rows[0]["error"].startswith("not a readable image")  # the row names the path; its message does not
    assert format_predictions(rows).count("text.png") == 1
