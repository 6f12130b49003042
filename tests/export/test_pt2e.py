"""export/pt2e.py: `vitlab export --format pt2e` writes static int8 (PyTorch 2 export quantization) as a file of fp32
weights and calibrated observer statistics, which predict, eval and serve rebuild and compile for the CPU they run
on, agreeing with fp32 on a trained digits model."""

import importlib.util
import json
import shutil
import tempfile

import pytest
import torch
from PIL import Image

if importlib.util.find_spec("torchao") is None:  # asked without importing it: torchao takes a second to import
    pytest.skip("the pt2e format needs torchao (pip install -e '.[int8]')", allow_module_level=True)
# Every test here reads one trained run (20 s to train): under pytest-xdist they run on one worker, trained once.
pytestmark = pytest.mark.xdist_group("pt2e")

from vitlab.checkpoint import load_model  # noqa: E402
from vitlab.cli import main  # noqa: E402
from vitlab.data.datasets import load_dataset  # noqa: E402
from vitlab.errors import CheckpointError  # noqa: E402
from vitlab.export import pt2e  # noqa: E402

AMX = "avx2,avx512,vnni,avx512_bf16,amx"


@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def digits_run(tmp_path_factory):
    """A digits run trained long enough that its classes mean something (about 8 s, 92% test accuracy; after
    15 epochs of the recipe's augmented batches of 128 it had 57%, and its near-ties were no test of int8)."""
    from vitlab.data.transforms import AugmentConfig
    from vitlab.train.config import TrainConfig
    from vitlab.train.loop import train

    out = tmp_path_factory.mktemp("runs")
    config = TrainConfig(
        epochs=12,
        warmup_epochs=1,
        batch_size=32,
        lr=3e-3,
        augment=AugmentConfig(),
        run_name="digits",
        out_dir=str(out),
        progress=False,
    )
    assert train(config)["status"] == "finished"
    return out / "digits"


@pytest.fixture(scope="session")  # built once, however pytest-xdist interleaves the files
def exported(digits_run, tmp_path_factory):
    """`vitlab export RUN --format pt2e`, calibrated on the run's own training data; (file, printed report)."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["export", str(digits_run), "--format", "pt2e"]) == 0
    return digits_run / "model-int8.pt2e", printed.getvalue()


@pytest.mark.slow
def test_the_file_holds_weights_and_observer_statistics_and_nothing_to_unpickle(exported, digits_run):
    path, report = exported
    assert path.is_file()
    config, state, observers, details = pt2e.read_pt2e(path)
    reference = load_model(digits_run)
    assert config == reference.config
    assert all(torch.equal(state[name], value) for name, value in reference.state_dict().items())
    assert observers and all(name.startswith("activation_post_process_") for name in observers)
    assert "training images of digits (the run's own data)" in details["calibration_source"]
    with open(path, "rb") as handle:  # a safetensors file: an 8-byte header length, then JSON
        header_length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_length))
    assert header["__metadata__"]["format"] == "vitlab-pt2e"
    # The report: the calibration, the checks against fp32 and what runs here.
    assert "calibrated on 256 training images of digits" in report and "top-1 agreement" in report
    assert "int8 tolerance: mean |logit diff| <= 5% of PyTorch's logit spread" in report and "passed" in report
    checksums = json.loads((digits_run / "checksums.json").read_text())
    assert "model-int8.pt2e" in checksums  # recorded before it replaced anything, as every file of a run


@pytest.mark.slow
def test_eval_predict_and_serve_run_the_file_and_agree_with_fp32(exported, digits_run, tmp_path, capfd):
    from vitlab.eval.predict import load_classifier
    from vitlab.serve.engine import Engine

    path, _ = exported
    data = load_dataset("digits", "test")
    pixels = (data.images.float() * (255 / data.max_value)).round().to(torch.uint8)
    fp32 = Engine(digits_run)
    served = Engine(path)
    assert served.backend == "pt2e" and served.precision in ("int8", "int8+bf16")
    # serve prepares the graph for single images, kept for the next load; it computes what the padded one does
    one = torch.randn(1, 1, 8, 8)
    assert served.runner.single is not None and pt2e.Pt2eClassifier(path).single is not None
    padded = served.runner.compiled(one.repeat(2, 1, 1, 1))[:1]
    torch.testing.assert_close(served.runner(one), padded, atol=1e-4, rtol=0)
    # With the batch fixed, Inductor runs the last block past its attention on the class token alone and may
    # compute that block's one-row projection from the dequantized weights in a fused kernel: one int8 product
    # fewer than each block's four (the head stays in float), the rest int8 as in the any-batch graph.
    linear_layers = 4 * served.runner.config.depth
    assert int8_matmuls(served.runner, one, capfd) >= linear_layers - 1
    assert served.describe()["precision_reason"].startswith("int8 linear layers")
    reference, quantized = fp32.classify(pixels), served.classify(pixels)
    agreement = float((reference.argmax(1) == quantized.argmax(1)).float().mean())
    assert agreement >= 0.99, agreement  # the bar, on all 359 test images
    assert float((reference.argmax(1) == data.labels).float().mean()) > 0.8  # a model that has learned
    assert served.explain(pixels[0]).sum().item() == pytest.approx(1.0, abs=1e-5)  # its fp32 weights explain

    # A run folder with --backend pt2e means its model-int8.pt2e, as --backend onnx means its model.onnx.
    assert isinstance(load_classifier(digits_run, "pt2e"), pt2e.Pt2eClassifier)

    assert main(["eval", str(path), "--dataset", "digits", "--out", str(tmp_path), "--json"]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["precision"] in ("int8", "int8+bf16") and report["count"] == len(data)
    fp32_top1 = float((reference.argmax(1) == data.labels).float().mean())
    assert abs(report["top1"] - fp32_top1) <= 0.01

    files = []
    for index in range(12):
        image = tmp_path / f"{index}.png"
        Image.fromarray(pixels[index, 0].numpy()).save(image)
        files.append(str(image))
    assert main(["predict", str(path), *files, "--format", "json"]) == 0
    rows = json.loads(capfd.readouterr().out)
    assert [row["predictions"][0]["index"] for row in rows] == reference[:12].argmax(1).tolist()


@pytest.mark.run_level
def test_a_damaged_or_foreign_file_is_named_and_refused(exported, tmp_path):
    path, _ = exported
    damaged = path.read_bytes()
    copy = path.parent / "damaged.pt2e"
    middle = len(damaged) // 2
    copy.write_bytes(damaged[:middle] + bytes(200) + damaged[middle + 200 :])
    from vitlab.files import record_checksum, sha256_bytes

    record_checksum(path.parent, copy.name, sha256_bytes(damaged))  # what vitlab wrote, before the damage
    with pytest.raises(CheckpointError, match="damaged"):
        pt2e.Pt2eClassifier(copy)
    copy.unlink()

    # Observers that do not match what this torch places (a file from another torch or torchao version).
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    dropped = next(name for name in tensors if name.startswith("observer."))
    del tensors[dropped]
    foreign = tmp_path / "foreign.pt2e"
    save_file(tensors, str(foreign), metadata=metadata)
    with pytest.raises(CheckpointError, match="another version of torch or torchao: export it again"):
        pt2e.Pt2eClassifier(foreign)
    (tmp_path / "text.pt2e").write_text("not a model")
    with pytest.raises(CheckpointError, match="not a readable pt2e file"):
        pt2e.read_pt2e(tmp_path / "text.pt2e")


@pytest.mark.run_level
def test_export_refuses_what_a_pt2e_file_cannot_be(digits_run, tmp_path, capsys):
    from vitlab.checkpoint.io import save_model

    for extra, message in (
        (["--preprocess"], "--preprocess is for ONNX exports"),
        (["-o", str(tmp_path / "x.onnx")], "written to a .pt2e file"),
    ):
        assert main(["export", str(digits_run), "--format", "pt2e", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    lone = save_model(load_model(digits_run), tmp_path / "lone.safetensors")  # a file: no data set recorded
    assert main(["export", str(lone), "--format", "pt2"]) == 2
    assert "give them with --calibrate DATASET_OR_IMAGES" in capsys.readouterr().err


def test_the_quantization_follows_the_cpu_that_runs_it(monkeypatch, tmp_path):
    """7-bit activations where int8 products saturate (no VNNI), 8-bit elsewhere; the float rest in bf16 where
    bf16 matmuls pay. Decided where the file is loaded, from the same observer statistics."""
    from vitlab.config import ViTConfig
    from vitlab.models import create_model

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))  # no measured peaks: the simulated units decide
    config = ViTConfig(image_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    model = create_model(config).eval()
    example = torch.randn(2, 3, 8, 8)

    def activation_ranges():
        prepared = pt2e.prepared_for_this_cpu(model, example)
        return {
            module.quant_max
            for name, module in prepared.named_modules()
            if name.startswith("activation_post_process_") and getattr(module, "dtype", None) == torch.uint8
        }

    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")
    assert activation_ranges() == {127}
    assert pt2e.rest_precision(config).value == "int8"
    monkeypatch.setenv("VITLAB_CPU_UNITS", AMX)
    assert activation_ranges() == {255}
    monkeypatch.setattr("vitlab.hardware.BF16_ABOVE_GFLOPS", 0.0)  # as for a model large enough to gain
    assert pt2e.rest_precision(config).value == "int8+bf16"
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")
    assert pt2e.rest_precision(config).value == "int8"


def int8_matmuls(run, images: torch.Tensor, capfd) -> int:
    """How many int8 matrix products (uint8 activations times int8 weights) oneDNN runs in `run(images)`, read from
    its verbose log, which names the operand types on every CPU (AVX2, VNNI, AMX) whatever kernel it picks."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        run(images)
    log = capfd.readouterr().out.splitlines()
    return sum(",primitive,exec," in line and "src:u8" in line and "wei:s8" in line for line in log)


@pytest.mark.slow
@pytest.mark.parametrize("units", ["avx2", AMX])
def test_the_linear_layers_run_int8_kernels_under_the_callers_inference_mode(units, monkeypatch, tmp_path, capfd):
    """Issue 52: vitlab bench builds and runs the pt2e paths under inference mode, where the first (frozen) call
    saw an inference tensor and the bench's batch, a plain one, compiled the graph again unfrozen: every linear
    layer ran in fp32 (9.2 img/s at B/16 instead of 47). Each block's four linear layers run int8, with 8-bit or
    7-bit activations, in the bench's compiled model and in a file's AOTInductor package."""
    from vitlab.config import ViTConfig
    from vitlab.models import create_model

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("VITLAB_CPU_UNITS", units)
    config = ViTConfig(image_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3)
    model = create_model(config).eval()
    images = torch.randn(4, 3, 8, 8)  # made outside inference mode, as the bench's batch is
    linear_layers = 4 * config.depth  # qkv, proj, fc1, fc2; the head stays in float
    with torch.inference_mode():
        quantized = pt2e.QuantizedModel(model, pt2e.calibrate(model, images), "fp32")
        assert int8_matmuls(quantized, images, capfd) == linear_layers
        assert int8_matmuls(quantized, images[:1].clone(), capfd) == linear_layers  # an inference tensor, batch 1
        package = pt2e.compile_ahead_of_time(quantized, tmp_path / "model.pt2")
        assert int8_matmuls(package, images, capfd) == linear_layers
        # The graph compiled for single images that serve prepares is counted where serve prepares it, on the
        # trained digits model (test_eval_predict_and_serve_run_the_file_and_agree_with_fp32): it differs from
        # the any-batch graph by shape, not by the CPU units that decide the quantization here.


@pytest.mark.slow
def test_a_second_load_does_not_compile_and_a_damaged_package_is_rebuilt(exported, monkeypatch, tmp_path):
    """A CPU kind's first load compiles and keeps the graph (the export's own check was that load: its package is
    taken into this test's cache rather than compiled a third time here), later loads read it, a damaged one is
    compiled again, and a cache that cannot be written gets a temporary package."""
    path, _ = exported
    kept = pt2e.Pt2eClassifier(path)  # in the suite's cache, where the export's check compiled and kept it
    assert kept.compile_seconds == 0.0 and kept.package.is_file()
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))  # this test's own cache, holding that package only
    package = pt2e.compiled_package_path(path, kept.choice.value)
    package.parent.mkdir(parents=True)
    shutil.copyfile(kept.package, package)
    # The compiles asked for here write the kept package's bytes, the graph AOTInductor gives for this file on this
    # CPU kind: the export's check compiled it by the same call, and this test is about when a load compiles and
    # what it keeps (a real compile here would be the same ~13 s again).
    compiles, staged = [], []

    def compiled(program, package_path):
        compiles.append(1)
        staged.append(package_path)
        shutil.copyfile(kept.package, package_path)
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compiled)
    images = torch.randn(3, 1, 8, 8)
    first = pt2e.Pt2eClassifier(path)
    assert len(compiles) == 0 and first.compile_seconds == 0.0 and first.package == package
    assert torch.equal(first(images), kept(images)) and first(images[:1]).shape == (1, 10)
    assert first.single is None  # single images run padded until a graph is prepared for them (serve's test)
    first.package.write_bytes(b"not a package")
    rebuilt = pt2e.Pt2eClassifier(path)
    assert len(compiles) == 1 and rebuilt.compile_seconds > 0 and torch.equal(rebuilt(images), first(images))
    second = pt2e.Pt2eClassifier(path)  # the rebuilt package, kept
    assert len(compiles) == 1 and second.compile_seconds == 0.0 and torch.equal(second(images), first(images))
    # A cache that cannot be written: compiled into a temporary package, run, and nothing left behind.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("VITLAB_CACHE", str(not_a_folder))
    unkept = pt2e.Pt2eClassifier(path)
    assert len(compiles) == 2 and staged[1].startswith(str(tmp_path / "temp"))  # compiled again, not in the cache
    assert torch.equal(unkept(images), first(images)) and list((tmp_path / "temp").iterdir()) == []
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")  # another CPU kind gets its own package (not compiled here)
    assert pt2e.compiled_package_path(path, first.choice.value) != first.package


def test_the_quantized_graph_computes_the_class_token_alone_in_the_last_block():
    """The graph a pt2e file is rebuilt from carries vitlab's own forward (models/fast_paths.py, item 1): one query
    in the last block's attention, every token in the others'."""
    from vitlab.models import create_model

    model = create_model("digits-8").eval()  # 17 tokens, depth 4
    prepared = pt2e.prepared_for_this_cpu(model, torch.randn(2, 1, 8, 8))
    queries = [
        node.args[0].meta["val"].shape[2]
        for node in prepared.graph.nodes
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target)
    ]
    assert queries == [17, 17, 17, 1]
