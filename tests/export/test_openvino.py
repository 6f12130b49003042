"""export/openvino.py: `vitlab export --format openvino` round trips within the export's tolerance (fp32, any image
size, preprocessing inside), int8 through NNCF runs int8 kernels and stays within the int8 tolerance, and predict
and serve run the file; the refusals name what to do."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from export_models import SMALL, fitted_on_digits, randomised
from openvino_process import skip_outside_its_own_process  # noqa: E402

skip_outside_its_own_process()

from vitlab.checkpoint.io import save_model  # noqa: E402
from vitlab.cli import main  # noqa: E402
from vitlab.data.preprocess import prepare  # noqa: E402
from vitlab.errors import UsageError  # noqa: E402
from vitlab.export import openvino  # noqa: E402
from vitlab.export.checks import calibration_pixels, validation_pixels  # noqa: E402
from vitlab.head_configs import LinearSegmentationConfig  # noqa: E402
from vitlab.preprocessing import Preprocessing  # noqa: E402
from vitlab.runtime.exporter import check_export_options  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return randomised(SMALL)


@pytest.fixture(scope="module")
def pixels():
    return validation_pixels(SMALL)  # 32 real (digits) images at the model's size, uint8


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    """`model` as OpenVINO writes it with no options, once for the tests that read the file (about 1.7 s a
    conversion); none of them writes beside it."""
    path = tmp_path_factory.mktemp("openvino") / "m.xml"
    openvino.export_openvino(model, path)
    return path


@pytest.fixture(scope="module")
def trained():
    """SMALL fitted for a few steps on digits, so int8 is judged on a model whose classes mean something."""
    return fitted_on_digits(SMALL)


@pytest.mark.run_level
def test_fp32_round_trip_of_any_batch_and_size_is_within_the_tolerance(model, pixels, tmp_path):
    path = tmp_path / "m.xml"
    summary = openvino.run_openvino_export(model, path, dynamic_size=True, pixels=pixels)
    assert path.is_file() and path.with_suffix(".bin").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vitlab-export")] == []  # staging removed
    checks = summary["validation"]["checks"]
    assert set(checks) == {"at export size", "batch 1", "input 10x16"}
    assert summary["max_abs_diff"] <= 1e-4 and summary["validation"]["verdict"].endswith("passed")
    runtime = openvino.OpenVinoClassifier(path, precision="fp32")
    assert runtime.choice.value == "fp32" and runtime.metadata["dynamic_size"]
    images = torch.randn(3, 3, 12, 16)  # another batch and size, sides multiples of the patch
    model.dynamic_size = True
    try:
        torch.testing.assert_close(runtime(images), model(images).detach(), atol=1e-4, rtol=0)
    finally:
        model.dynamic_size = False
    report = openvino.format_openvino_export(summary, images_given=False)
    assert "m.xml and m.bin" in report and "fp32 tolerance" in report and "OpenVINO at fp32" in report


@pytest.mark.run_level
def test_the_graph_computes_the_class_token_alone_in_the_last_block(exported):
    """The IR carries vitlab's own forward (models/fast_paths.py, item 1): the last block projects the class
    token's query alone and no key or value (`Attention.queries_through_weights`), and its projection and MLP run
    on the class token's row alone, (B, D); every linear layer of the other blocks on all of the tokens, (B, T, D)."""
    import openvino as ov

    inputs = [
        str(op.input(0).get_partial_shape())
        for op in ov.Core().read_model(exported).get_ordered_ops()
        if op.get_type_name() == "MatMul" and op.input_value(1).get_node().get_type_name() == "Constant"
    ]
    tokens, heads, width, hidden = SMALL.num_tokens, SMALL.num_heads, SMALL.embed_dim, SMALL.mlp_dim
    # block 0: q, k, v (three projections: Attention.separate_projections), proj, fc1 on every token, then fc2
    every_token = [f"[?,{tokens},{width}]"] * 5 + [f"[?,{tokens},{hidden}]"]
    # the last block: the class token's query (a row), W_k per head on it, W_v per head on the attention-weighted
    # tokens, then proj, fc1, fc2 and the head on the class token's row
    row, head_dim = f"[?,{width}]", width // heads
    last_block = [row, f"[{heads},?,{head_dim}]", f"[{heads},?,{width}]", row, row, f"[?,{hidden}]", row]
    assert inputs == every_token + last_block


def test_a_batch_size_that_comes_again_runs_a_graph_compiled_for_it(model, exported):
    runtime = openvino.OpenVinoClassifier(exported, precision="fp32")
    images = {size: torch.randn(size, 3, 8, 12) for size in (1, 3, 5)}

    def batch_dimension(size: int):
        return runtime.compiled_for(size).inputs[0].get_partial_shape()[0]

    for _ in range(2):  # the first call of a size runs the any-batch graph; the second compiles one for it
        assert set(runtime.static) == set()
        torch.testing.assert_close(runtime(images[3]), model(images[3]).detach(), atol=1e-4, rtol=0)
    assert set(runtime.static) == {3} and batch_dimension(3).is_static and batch_dimension(3).get_length() == 3
    runtime.prepare_batch(1)
    assert set(runtime.static) == {1, 3} and len(runtime.static) == openvino.STATIC_BATCH_SLOTS
    for _ in range(2):  # the slots are taken: a third size keeps running the any-batch graph, correctly
        torch.testing.assert_close(runtime(images[5]), model(images[5]).detach(), atol=1e-4, rtol=0)
    assert set(runtime.static) == {1, 3} and batch_dimension(5).is_dynamic
    torch.testing.assert_close(runtime(images[1]), model(images[1]).detach(), atol=1e-4, rtol=0)
    runtime.use_precision("bf16")  # compiled again for another precision: the fixed-batch graphs too
    assert set(runtime.static) == {1, 3} and runtime.hint == "bf16"


@pytest.mark.run_level
def test_a_large_fixed_batch_runs_as_two_halves_on_two_streams_with_the_same_logits(model, exported):
    images = torch.randn(openvino.TWO_STREAMS_MIN_BATCH, 3, 8, 12)
    expected = model(images).detach()
    for threads, halves in ((2, True), (1, False)):
        runtime = openvino.OpenVinoClassifier(exported, threads=threads, precision="fp32", batch_size=len(images))
        assert isinstance(runtime.compiled, openvino.HalvesOnTwoStreams) == halves
        for _ in range(2):  # the requests are reused: a second call returns its own logits, not the first's
            torch.testing.assert_close(runtime(images), expected, atol=1e-4, rtol=0)
            torch.testing.assert_close(runtime(images.flip(0)), expected.flip(0), atol=1e-4, rtol=0)


@pytest.mark.run_level
def test_preprocessing_inside_the_model_takes_uint8_pixels_of_any_size(model, pixels, tmp_path):
    from vitlab.export.onnx import PreprocessAndClassify

    path = tmp_path / "pre.xml"
    summary = openvino.run_openvino_export(model, path, preprocess=True, pixels=pixels)
    assert summary["input"] == "pixels" and summary["validation"]["verdict"].endswith("passed")
    runtime = openvino.OpenVinoClassifier(path, precision="fp32")
    reference = PreprocessAndClassify(model).eval()
    for shape in [(2, 3, 30, 20), (1, 3, 8, 12), (3, 3, 5, 40)]:  # shrink, as is, and one side enlarged
        images = torch.randint(0, 256, shape, dtype=torch.uint8)
        torch.testing.assert_close(runtime(images), reference(images).detach(), atol=1e-4, rtol=0)
    with pytest.raises(UsageError, match="takes uint8 pixels"):
        runtime(torch.rand(1, 3, 8, 12))
    crop = SMALL.replace(preprocessing=Preprocessing(mode="crop", crop_fraction=0.875))
    with pytest.raises(UsageError, match="crop fraction 0.875.*without --preprocess"):
        openvino.export_openvino(randomised(crop), tmp_path / "crop.xml", preprocess=True)


@pytest.mark.run_level
def test_int8_runs_int8_kernels_and_stays_within_the_int8_tolerance(trained, pixels, exported, tmp_path):
    calibration = calibration_pixels(SMALL, ["digits"], count=64)  # the training split, never the test one
    path = tmp_path / "int8.xml"
    summary = openvino.run_openvino_export(
        trained, path, int8=True, calibration=calibration, calibration_source="64 digits", pixels=pixels
    )
    verdict = summary["validation"]["verdict"]
    assert verdict.startswith("int8 tolerance: mean |logit diff| <= 5% of PyTorch's logit spread") and verdict.endswith(
        "passed"
    )
    runtime = openvino.OpenVinoClassifier(path, precision="int8")
    assert runtime.choice.value == "int8" and runtime.metadata["quantization"] == "nncf static"
    # The compiled execution graph: its linear layers (FullyConnected) run on int8 (u8 activations x i8 weights)
    # kernels; the head, kept in float, is the one f32 among them.
    precisions = runtime.runtime_precisions()
    assert {"i8", "u8"} & set(precisions["FullyConnected"].split(",")), precisions
    expected = trained(prepare(pixels, 255.0, SMALL)).detach()
    agreement = float((runtime.classify_pixels(pixels).argmax(1) == expected.argmax(1)).float().mean())
    assert agreement >= 0.9
    # The same layers of an fp32 file (the module's export of SMALL: weights do not change what a layer runs on).
    fp32 = openvino.OpenVinoClassifier(exported, precision="fp32").runtime_precisions()
    assert fp32["FullyConnected"] == "f32"  # the check above is no accident of the runtime
    with pytest.raises(UsageError, match="an fp32 OpenVINO file runs in fp32 or bf16"):
        openvino.OpenVinoClassifier(exported, precision="int8")


@pytest.mark.run_level
def test_cli_export_then_predict_and_serve_give_pytorchs_labels(model, tmp_path, capsys):
    from vitlab.serve.engine import Engine

    checkpoint = save_model(model, tmp_path / "m.safetensors")
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(5):
        Image.fromarray(rng.integers(0, 256, (8, 12, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    assert main(["export", str(checkpoint), "--format", "openvino", "--images", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "checked against PyTorch (OpenVINO at fp32) on 5 real images (given)" in printed and "passed" in printed
    assert "fastest format on this CPU" in printed
    path = tmp_path / "m.xml"
    assert main(["predict", str(checkpoint), str(folder), "--format", "json", "--precision", "fp32"]) == 0
    torch_rows = json.loads(capsys.readouterr().out)
    assert main(["predict", str(path), str(folder), "--format", "json", "--precision", "fp32"]) == 0
    openvino_rows = json.loads(capsys.readouterr().out)
    for ours, theirs in zip(openvino_rows, torch_rows):
        assert ours["predictions"][0]["label"] == theirs["predictions"][0]["label"]
        assert abs(ours["predictions"][0]["probability"] - theirs["predictions"][0]["probability"]) < 1e-4
    # A checkpoint with --backend openvino runs the export beside it; an .xml with --backend onnx is refused.
    assert main(["predict", str(checkpoint), str(folder), "--format", "json", "--backend", "openvino"]) == 0
    assert [r["predictions"][0]["label"] for r in json.loads(capsys.readouterr().out)] == [
        r["predictions"][0]["label"] for r in torch_rows
    ]
    assert main(["predict", str(path), str(folder), "--backend", "onnx"]) == 2
    assert "is an OpenVINO export; run it with --backend openvino" in capsys.readouterr().err
    assert main(["info", str(path)]) == 0  # read, not compiled: the config and input contract it carries
    described = capsys.readouterr().out
    assert described.startswith(f"{path}: openvino fp32 checkpoint") and "input 'images': float32 RGB" in described
    assert "embed_dim            32" in described
    assert main(["info", str(tmp_path / "absent.xml")]) == 1
    assert "no such OpenVINO file" in capsys.readouterr().err

    pixels = torch.randint(0, 256, (4, 3, 8, 12), dtype=torch.uint8)
    reference = Engine(checkpoint, precision="fp32").classify(pixels)
    served = Engine(path, precision="fp32")
    assert served.backend == "openvino" and served.describe()["backend"] == "openvino"
    torch.testing.assert_close(served.classify(pixels), reference, atol=1e-5, rtol=0)
    converted = Engine(checkpoint, backend="openvino", precision="fp32")  # converted at start; explains
    torch.testing.assert_close(converted.classify(pixels), reference, atol=1e-5, rtol=0)
    assert converted.explain(pixels[0]).sum().item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.run_level
def test_serve_auto_takes_openvino_where_this_machine_measured_it_faster(model, tmp_path, monkeypatch):
    from vitlab.serve import engine

    checkpoint = save_model(model, tmp_path / "m.safetensors")
    record = {"speed_vs_eager_fp32": {"eager-fp32": 1.0, "openvino-fp32": 1.4}}
    monkeypatch.setattr(engine, "path_speeds", lambda *args, **kwargs: record)
    served = engine.Engine(checkpoint, precision="fp32")
    assert served.backend == "openvino"
    assert "openvino-fp32 ran 1.40x eager fp32 on this CPU" in served.choice.reason
    record["speed_vs_eager_fp32"]["openvino-fp32"] = 0.9
    assert engine.Engine(checkpoint, precision="fp32").backend == "torch"


def test_options_an_openvino_file_has_no_use_for_are_refused_before_loading(tmp_path):
    with pytest.raises(UsageError, match="--batch-size is for ONNX exports; an OpenVINO file takes batches of any"):
        check_export_options("openvino", batch_size=4)
    with pytest.raises(UsageError, match=r"an OpenVINO model is written to a \.xml file; name it .*m\.xml"):
        check_export_options("openvino", tmp_path / "m.onnx")
    with pytest.raises(UsageError, match="--calibrate is for static int8: add --int8"):
        check_export_options("openvino", calibrate=["digits"])
    check_export_options("openvino", int8=True, preprocess=True, dynamic_size=True)  # these it takes


def test_a_dense_models_int8_or_preprocess_and_an_uncalibrated_int8_export_are_one_message_each(tmp_path, model):
    from vitlab.runtime.exporter import export_checkpoint

    checkpoint = save_model(model, tmp_path / "m.safetensors")
    with pytest.raises(UsageError, match="not a run folder.*an int8 OpenVINO file is static int8.*--calibrate"):
        export_checkpoint(checkpoint, format="openvino", int8=True)
    dense = SMALL.replace(head=LinearSegmentationConfig(), num_classes=3, class_names=None)
    assert openvino.require_exportable(dense).task == "segmentation"  # fp32 without preprocessing: taken
    with pytest.raises(UsageError, match="^--int8: a segmentation model exports in fp32 for now; export without"):
        openvino.require_exportable(dense, int8=True)
    with pytest.raises(
        UsageError, match="^--preprocess: a segmentation model's photo is sized .* without --preprocess"
    ):
        openvino.require_exportable(dense, preprocess=True)
    # Through `vitlab export`: refused before it looks for calibration images (a checkpoint file has none).
    dense_checkpoint = save_model(randomised(dense), tmp_path / "dense.safetensors")
    with pytest.raises(UsageError, match="^--int8: a segmentation model exports in fp32"):
        export_checkpoint(dense_checkpoint, format="openvino", int8=True)
    with pytest.raises(UsageError, match="^--int8: a segmentation model exports in fp32"):
        openvino.export_openvino(randomised(dense), tmp_path / "d.xml", int8=True, calibration=torch.zeros(1))
    assert not (tmp_path / "dense.xml").exists() and not (tmp_path / "d.xml").exists()
