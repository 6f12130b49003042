"""ONNX export of the dense models: the graph's outputs named, Depth Anything's input of any size of whole patches,
the export's own check against PyTorch (max |diff| of every output, fp32) passing, and `predict --backend onnx`
giving the torch backend's answer for a non-square photo."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitlab.dense.inference import predict_dense
from vitlab.errors import UsageError
from vitlab.export.onnx import OnnxClassifier, export_onnx, format_export, run_export
from vitlab.models import create_model

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dense"))
from test_inference import dpt_config, eomt_config, photo  # noqa: E402


def model_of(config):
    torch.manual_seed(0)
    model = create_model(config).eval()
    if config.dense_head == "dpt":  # a fresh head's ReLU gives 0 everywhere: lift the last layer's bias
        with torch.no_grad():
            model.depth_head.scratch.output_conv2[2].bias.fill_(0.5)
    return model


@pytest.mark.run_level  # an ONNX export (torch.onnx's exporter: seconds)
def test_eomt_exports_its_two_outputs_checked_and_predicts_as_torch(tmp_path):
    model = model_of(eomt_config())
    summary = run_export(model, tmp_path / "eomt.onnx")
    assert summary["outputs"] == ["class_logits", "mask_logits"] and summary["max_abs_diff"] <= 1e-4
    assert {name.split()[0] for name in summary["validation"]["checks"]} == {"class_logits", "mask_logits"}
    assert "outputs class_logits, mask_logits" in format_export(summary, images_given=False)
    runtime = OnnxClassifier(tmp_path / "eomt.onnx")
    assert [output.name for output in runtime.session.get_outputs()] == ["class_logits", "mask_logits"]
    pixels = photo(45, 70)
    expected, got = predict_dense(model, pixels), predict_dense(runtime, pixels)
    torch.testing.assert_close(got.scores, expected.scores, atol=1e-4, rtol=0)


def test_dense_exports_refuse_int8_and_baked_in_preprocessing(tmp_path):
    model = model_of(dpt_config())
    with pytest.raises(UsageError, match="--int8"):
        export_onnx(model, tmp_path / "a.onnx", int8=True)
    with pytest.raises(UsageError, match="--preprocess"):
        export_onnx(model, tmp_path / "a.onnx", preprocess=True)


@pytest.mark.run_level  # an ONNX export (torch.onnx's exporter: seconds)
def test_depth_anything_exports_any_size_checked_predicts_as_torch_and_says_nothing_of_speeds(
    tmp_path, monkeypatch, capsys
):
    """`vitlab export` of Depth Anything: its input any size of whole patches, checked against PyTorch at a second
    size, and `predict` through the file gives torch's depth for a non-square photo. It says nothing of the formats'
    speeds kept on a machine, which are classifiers' (a dense model's bench keeps none): `export` of a depth model
    printed the classifiers' "fastest format on this CPU", after calibrating on a classifier. One test, as each
    dynamic-size export of the model costs ~8 CPU-s (torch.export's symbolic shapes)."""
    from vitlab.bench import advice
    from vitlab.checkpoint import load_model
    from vitlab.cli import main

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITLAB_CALIBRATE", "1")
    monkeypatch.setattr(advice, "calibrate", lambda **_: pytest.fail("a dense export calibrated on a classifier"))
    checkpoint = Path(__file__).resolve().parents[1] / "fixtures" / "hf_depth_anything"
    assert main(["export", str(checkpoint), "-o", str(tmp_path / "depth.onnx")]) == 0
    printed = capsys.readouterr().out
    assert "wrote " in printed and "fastest format" not in printed
    assert "at sides multiples of" in printed and "outputs depth" in printed  # any size of whole patches
    # checked at a second size too, within fp32's tolerance
    assert "depth input " in printed and "<= 0.0001: passed" in printed
    model = load_model(str(checkpoint)).eval()
    runtime = OnnxClassifier(tmp_path / "depth.onnx")
    pixels = photo(50, 90)  # keep-aspect: not the export's square input
    expected, got = predict_dense(model, pixels), predict_dense(runtime, pixels)
    assert got.depth.shape == (50, 90) and expected.depth.abs().max() > 0
    np.testing.assert_allclose(got.depth.numpy(), expected.depth.numpy(), atol=1e-4)
