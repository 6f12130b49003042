"""src/vitlab/runtime/registry.py: the one table of backends, and its contract: a new runtime is one module and one
row (tests/toy_backend.py, which nothing in vitlab names), taken by export, info, predict, eval's loader, serve's
engine and its automatic choice, and the bench's path listing with no other edit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from PIL import Image

import toy_backend
from benchruns import quick_bench
from vitlab.bench.paths import inference_paths
from vitlab.bench.runner import choose_paths
from vitlab.checkpoint.io import save_model
from vitlab.cli import main
from vitlab.errors import UsageError
from vitlab.eval.predict import load_classifier, run_predict
from vitlab.models.registry import create_model
from vitlab.reports import checkpoint_info
from vitlab.runtime import registry
from vitlab.serve import engine

SRC = Path(__file__).resolve().parents[2] / "src" / "vitlab"


@pytest.fixture
def toy_registered(monkeypatch):
    """tests/toy_backend.py as one more row of the table, the table restored after."""
    monkeypatch.setattr(registry, "BACKENDS", dict(registry.BACKENDS))

    def register():
        registry.register(toy_backend.BACKEND)

    return register


@pytest.fixture
def toy_model(tmp_path):
    torch.manual_seed(0)
    model = create_model("digits-8").eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)  # (a zero head would give every image the same answer)
    images = []
    for index in range(3):
        path = tmp_path / f"{index}.png"
        Image.fromarray(torch.randint(0, 256, (8, 8), dtype=torch.uint8).numpy()).save(path)
        images.append(path)
    return model, save_model(model, tmp_path / "m.safetensors"), images


def test_a_new_backend_is_one_module_and_one_row(toy_model, tmp_path, capsys, monkeypatch, toy_registered):
    model, checkpoint, images = toy_model
    with pytest.raises(SystemExit):  # not a row yet: not a format
        main(["export", str(checkpoint), "--format", "toy"])
    assert "invalid choice: 'toy'" in capsys.readouterr().err

    toy_registered()  # what the table's own rows are

    # export: --format takes it, the file goes beside the checkpoint, the row reports it
    assert main(["export", str(checkpoint), "--format", "toy"]) == 0
    written = tmp_path / "m.toy"
    assert f"wrote {written} (a toy file)" in capsys.readouterr().out
    # info: the file's row reads it
    assert checkpoint_info(written)["kind"] == "toy"
    assert main(["info", str(written)]) == 0 and "toy" in capsys.readouterr().out
    # predict and eval's loader: the file picks its runtime; a checkpoint with --backend toy runs the file beside it
    assert isinstance(load_classifier(written), toy_backend.ToyRunner)
    reference = run_predict(checkpoint, images, precision="fp32")["rows"]
    rows = run_predict(written, images)["rows"]
    assert [[p["index"] for p in row["predictions"]] for row in rows] == [
        [p["index"] for p in row["predictions"]] for row in reference
    ]
    assert [p["probability"] for row in rows for p in row["predictions"]] == pytest.approx(
        [p["probability"] for row in reference for p in row["predictions"]], abs=1e-5
    )
    assert run_predict(checkpoint, images, backend="toy")["rows"] == rows
    assert main(["predict", str(checkpoint), str(images[0]), "--backend", "toy"]) == 0
    with pytest.raises(UsageError, match=r"m\.toy is a toy export; run it with --backend toy"):
        load_classifier(written, backend="onnx")
    # serve: the file, with its single-image graph prepared, and the fp32 model it holds explaining
    pixels = torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8)
    expected = engine.Engine(checkpoint, backend="torch", precision="fp32").classify(pixels)
    served = engine.Engine(written)
    assert served.backend == "toy" and served.runner.batches == [1] and served.describe()["backend"] == "toy"
    torch.testing.assert_close(served.classify(pixels), expected)
    assert served.explain(pixels[0]).sum().item() == pytest.approx(1.0, abs=1e-5)
    at_start = engine.Engine(checkpoint, backend="toy")  # a checkpoint exported to it at start
    torch.testing.assert_close(at_start.classify(pixels), expected)
    # serve's automatic choice: taken where this machine measured it faster than PyTorch
    record = {"speed_vs_eager_fp32": {"eager-fp32": 1.0, "toy-fp32": 2.0}}
    monkeypatch.setattr(engine, "path_speeds", lambda *args, **kwargs: record)
    chosen = engine.Engine(checkpoint, precision="fp32")
    assert chosen.backend == "toy" and "toy-fp32 ran 2.00x eager fp32" in chosen.choice.reason
    # bench: listed, chosen by --paths, run and compared with eager fp32
    assert "toy-fp32" in inference_paths()
    assert choose_paths(False, False, torch.device("cpu"), ["toy-fp32"]) == (["toy-fp32"], {})
    sample = torch.randn(2, 1, 8, 8)
    path = inference_paths()["toy-fp32"](model, sample)
    assert path.name == "toy fp32" and "a toy file runs in fp32" in path.note
    torch.testing.assert_close(path.run(sample), model(sample))
    result = quick_bench(checkpoint, ["eager-fp32", "toy-fp32"])
    measured = {row["path"]: row for row in result["paths"]}
    assert measured["toy-fp32"]["max_abs_diff_vs_eager"] <= 1e-5, result["skipped"]
    # --backend lists it, as --format does
    assert registry.backend_names()[-1] == "toy" and "toy" in registry.export_formats()


def test_a_backend_that_clashes_with_the_table_is_refused_by_name(toy_registered):
    toy_registered()
    with pytest.raises(UsageError, match=r"the backend toy \(\.toy\) clashes with toy \(\.toy\)"):
        registry.register(toy_backend.BACKEND)
    assert list(registry.BACKENDS).count("toy") == 1


def test_which_backend_owns_a_path_is_the_table():
    assert [registry.backend_for(name).name for name in ("m.onnx", "RUN/model-int8.PT2E", "m.xml")] == [
        "onnx",
        "pt2e",
        "openvino",
    ]
    assert registry.backend_for("m.safetensors") is None and registry.backend_for("B/16") is None
    assert registry.backend_named("pt2").name == "pt2e"
    with pytest.raises(UsageError, match="backend must be one of torch, onnx, pt2e, openvino, got 'tflite'"):
        registry.backend_named("tflite")


def test_no_module_outside_the_runtime_tests_an_export_file_suffix_itself():
    """The file kinds of `vitlab export` are told by the table (`backend_for`): no module outside src/vitlab/runtime
    names .onnx, .pt2e or .xml to decide what a path is (names of files it writes, such as runs.py's defaults and
    the checks of a staged export's companions, are not decisions)."""
    decisions = re.compile(r"""(suffix(\.lower\(\))?\s*[!=]=\s*|endswith\()["'](\.onnx|\.pt2e|\.xml)["']""")
    deciding = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if "runtime" not in path.parts and decisions.search(path.read_text())
    ]
    assert deciding == []
