"""export/openvino.py on the other layouts: the 2025 backbones' (rotary positions, registers, SwiGLU, attention
pooling, GAP) round trip at any size, and the dense models (EoMT's class and mask logits, Depth Anything's depth)
export, predict, serve and bench as PyTorch does. Run in a process of its own, as test_openvino.py."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from export_models import SMALL, randomised
from openvino_process import skip_outside_its_own_process

skip_outside_its_own_process()

from vitlab.cli import main  # noqa: E402
from vitlab.errors import CheckpointError  # noqa: E402
from vitlab.export import openvino  # noqa: E402
from vitlab.export.checks import validation_pixels  # noqa: E402


@pytest.mark.run_level
@pytest.mark.parametrize(
    "fields",
    [
        # DINOv3's layout (rotary positions, registers, layer scale, SwiGLU, RMSNorm, qk-norm) with SigLIP's
        # attention-pooling head: the head pools the tokens the blocks hand it, whatever positions they had, so one
        # export (~3 CPU-s each, dynamic size) carries both.
        dict(
            pos_embed="rope",
            register_tokens=2,
            layer_scale=0.1,
            mlp="swiglu",
            norm="rmsnorm",
            qk_norm=True,
            classifier="map",
        ),
        dict(classifier="gap", fc_norm=True, class_token=False),
    ],
)
def test_the_2025_backbones_layouts_round_trip_at_any_size(fields, tmp_path):
    """The written file run here against PyTorch at a batch and size the export's own checks did not use: what the
    exporter reports about itself (`max_abs_diff`) is not the test's evidence."""
    config = SMALL.replace(**fields)
    model = randomised(config)
    summary = openvino.run_openvino_export(
        model, tmp_path / "m.xml", dynamic_size=True, pixels=validation_pixels(config)
    )
    assert summary["max_abs_diff"] <= 1e-4 and "input 10x16" in summary["validation"]["checks"]
    runtime = openvino.OpenVinoClassifier(tmp_path / "m.xml", precision="fp32")
    images = torch.randn(3, 3, 12, 16)  # another batch and size, sides multiples of the patch
    model.dynamic_size = True
    with torch.no_grad():
        expected = model(images)
    assert expected.std() > 0.1  # logits that differ between images and classes: a wrong graph cannot match
    torch.testing.assert_close(runtime(images), expected, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------ dense models (EoMT, Depth Anything)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PHOTO_HEIGHT, PHOTO_WIDTH = 45, 70


@pytest.fixture
def photo_file(tmp_path) -> Path:
    """A smooth non-square photo (resizing it is well conditioned, unlike noise)."""
    rows, cols = np.linspace(0, 1, PHOTO_HEIGHT)[:, None], np.linspace(0, 1, PHOTO_WIDTH)[None, :]
    channels = [np.sin(3 * rows + 2 * cols + phase) * 0.5 + 0.5 for phase in (0.3, 1.4, 2.2)]
    path = tmp_path / "street.png"
    Image.fromarray((np.stack(channels, axis=-1) * 255).round().astype(np.uint8)).save(path)
    return path


def photo_pixels(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)


@pytest.fixture(scope="module")
def eomt_export(tmp_path_factory):
    """The EoMT fixture through `vitlab export --format openvino`'s own call, once: (model, .xml, its summary), for
    the EoMT test and the dense bench test's two streams."""
    from vitlab.checkpoint import load_model

    model = load_model(FIXTURES / "hf_eomt").eval()
    path = tmp_path_factory.mktemp("eomt") / "eomt.xml"
    return model, path, openvino.run_openvino_export(model, path)


@pytest.mark.run_level
def test_eomt_fixture_round_trips_both_outputs_and_predicts_and_serves_as_pytorch(
    eomt_export, tmp_path, photo_file, capsys, monkeypatch
):
    from vitlab.dense.inference import predict_dense
    from vitlab.eval.predict import run_predict
    from vitlab.serve.engine import Engine

    model, path, summary = eomt_export
    assert summary["outputs"] == ["class_logits", "mask_logits"] and summary["max_abs_diff"] <= 1e-4
    checks = summary["validation"]["checks"]
    assert set(checks) == {f"{name} {where}" for name in summary["outputs"] for where in ("at export size", "batch 1")}
    assert all(check["images"] in (4, 1) for check in checks.values())  # a few images: per-pixel outputs
    report = openvino.format_openvino_export(summary, images_given=False)
    assert "outputs class_logits, mask_logits" in report and "max |diff| of every output <= 0.0001: passed" in report
    assert "mask_logits at export size" in report

    # A check that fails names the output that differed. The file checked is the one this export wrote with the
    # same options: its .xml and .bin, copied where the export writes (a second conversion of EoMT fewer).
    def written(_model, staged, **_options):
        shutil.copyfile(path, staged)
        shutil.copyfile(path.with_suffix(".bin"), staged.with_suffix(".bin"))
        return {}

    with (
        monkeypatch.context() as patched,
        pytest.raises(
            CheckpointError, match=r"OpenVINO export's (class|mask)_logits \((at export size|batch 1)\) differ"
        ),
    ):
        patched.setattr(openvino, "export_openvino", written)
        openvino.run_openvino_export(model, tmp_path / "tight.xml", tolerance=1e-12)
    assert not (tmp_path / "tight.xml").exists() and not (tmp_path / "tight.bin").exists()

    runtime = openvino.OpenVinoClassifier(path, precision="fp32")
    assert [sorted(output.get_names()) for output in runtime.model.outputs] == [["class_logits"], ["mask_logits"]]
    pixels = photo_pixels(photo_file)
    expected, got = predict_dense(model, pixels), predict_dense(runtime, pixels)
    torch.testing.assert_close(got.scores, expected.scores, atol=1e-4, rtol=0)
    assert got.panoptic is not None and got.labels.shape == (PHOTO_HEIGHT, PHOTO_WIDTH)

    ours = run_predict(path, [photo_file], out=tmp_path / "ov", precision="fp32")
    theirs = run_predict(FIXTURES / "hf_eomt", [photo_file], out=tmp_path / "torch", precision="fp32")
    assert ours["precision"] == "fp32"
    assert [Path(f).name for f in ours["rows"][0]["files"]] == [Path(f).name for f in theirs["rows"][0]["files"]]
    mask = Image.open(tmp_path / "ov" / "street.mask.png")
    assert mask.size == (PHOTO_WIDTH, PHOTO_HEIGHT)
    assert np.array_equal(np.asarray(mask), np.asarray(Image.open(tmp_path / "torch" / "street.mask.png")))
    assert main(["predict", str(path), str(photo_file), "-o", str(tmp_path / "cli"), "--precision", "fp32"]) == 0
    assert capsys.readouterr().out.startswith(str(photo_file)) and (tmp_path / "cli" / "street.overlay.png").is_file()

    served = Engine(path, precision="fp32")  # the .xml file, and a checkpoint converted at start
    assert served.backend == "openvino" and served.describe()["task"] == "segmentation"
    torch.testing.assert_close(served.predict_dense(pixels).scores, expected.scores, atol=1e-4, rtol=0)
    converted = Engine(FIXTURES / "hf_eomt", backend="openvino", precision="fp32")
    torch.testing.assert_close(converted.predict_dense(pixels).scores, expected.scores, atol=1e-4, rtol=0)


@pytest.mark.run_level
def test_depth_anything_fixture_round_trips_at_a_second_size_and_predicts_the_photos_depth(tmp_path, photo_file):
    from vitlab.checkpoint import load_model
    from vitlab.dense.inference import predict_dense
    from vitlab.eval.predict import run_predict

    model = load_model(FIXTURES / "hf_depth_anything").eval()
    path = tmp_path / "depth.xml"
    summary = openvino.run_openvino_export(model, path)  # any size of whole patches: each photo's own
    assert summary["outputs"] == ["depth"] and summary["dynamic_size"] and summary["max_abs_diff"] <= 1e-4
    assert {"depth at export size", "depth batch 1", "depth input 20x24"} == set(summary["validation"]["checks"])
    runtime = openvino.OpenVinoClassifier(path, precision="fp32")
    pixels = photo_pixels(photo_file)  # keep-aspect: a non-square input, not the export's 16 x 16
    expected, got = predict_dense(model, pixels), predict_dense(runtime, pixels)
    assert got.depth.shape == (PHOTO_HEIGHT, PHOTO_WIDTH) and float(expected.depth.abs().max()) > 0
    np.testing.assert_allclose(got.depth.numpy(), expected.depth.numpy(), atol=1e-4)
    (row,) = run_predict(path, [photo_file], out=tmp_path / "out", precision="fp32")["rows"]
    depth = Image.open(tmp_path / "out" / "street.depth.png")
    assert depth.mode.startswith("I;16") and depth.size == (PHOTO_WIDTH, PHOTO_HEIGHT)
    assert (tmp_path / "out" / "street.depth-colour.png").is_file()
    assert row["max"] == pytest.approx(float(expected.depth.max()), abs=1e-4)


@pytest.mark.run_level
def test_dense_bench_rows_compare_every_output_and_int8_says_why_not(eomt_export, monkeypatch):
    from benchruns import quick_bench
    from vitlab.bench import runner
    from vitlab.bench.paths import INFERENCE_PATHS, Unavailable, largest_difference
    from vitlab.checkpoint import load_model

    # What the bench compared, seen as it compares it (rather than from a second OpenVINO export of the fixture).
    compared = []

    def seen(got, expected):
        compared.append((got, expected))
        return largest_difference(got, expected)

    monkeypatch.setattr(runner, "largest_difference", seen)
    # bf16: the same file, compiled otherwise
    result = quick_bench(FIXTURES / "hf_eomt", ["eager-fp32", "openvino-fp32", "openvino-int8"])
    rows = {row["path"]: row for row in result["paths"]}
    assert {"eager-fp32", "openvino-fp32"} <= set(rows), result["skipped"]
    assert rows["openvino-fp32"]["max_abs_diff_vs_eager"] <= 1e-4 and "openvino-int8" in result["skipped"]
    assert len(compared) == len(rows)  # each path's outputs beside the eager model's, openvino-fp32's among them
    for got, expected in compared:  # every output, class and mask logits: each path returns both, both compared
        assert isinstance(got, tuple) and len(got) == 2 and [g.shape for g in got] == [e.shape for e in expected]

    model = load_model(FIXTURES / "hf_eomt").eval()
    sample = torch.randn(2, 3, 32, 32)
    with pytest.raises(Unavailable, match="--int8: a segmentation model exports in fp32"):  # the export's refusal
        INFERENCE_PATHS["openvino-int8"](model, sample)
    # A fixed batch of 8 on two threads runs as two halves on two streams: both outputs are joined.
    _, path, _ = eomt_export  # the same fixture's file, exported once for this module
    images = torch.randn(openvino.TWO_STREAMS_MIN_BATCH, 3, 32, 32)
    halves = openvino.OpenVinoClassifier(path, threads=2, precision="fp32", batch_size=len(images))
    assert isinstance(halves.compiled, openvino.HalvesOnTwoStreams)
    with torch.no_grad():
        assert largest_difference(halves(images), model(images)) <= 1e-4
