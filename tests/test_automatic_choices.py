"""The choices vitlab makes by measuring this machine, as a user meets them: `vitlab train`, `eval`, `export` and
`predict` with nothing pinned. The rest of the suite pins them (tests/conftest.py: no calibration, torch's fp32
GEMM), so that each test does not measure again; this file runs only in `make test-automatic`, which leaves them to
vitlab (VITLAB_CALIBRATE=1, VITLAB_FP32_KERNEL=auto), and .ci/run runs that."""

import json
import os
from pathlib import Path

import pytest

from vitlab.cli import main
from vitlab.hardware import path_speeds, read_measurements

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.automatic,
    pytest.mark.skipif(
        os.environ.get("VITLAB_CALIBRATE") != "1" or os.environ.get("VITLAB_FP32_KERNEL") != "auto",
        reason="the automatic choices run in `make test-automatic` (VITLAB_CALIBRATE=1, VITLAB_FP32_KERNEL=auto)",
    ),
]


def test_train_export_and_predict_with_the_choices_vitlab_measures(tmp_path, capsys):
    cache = os.environ["VITLAB_CACHE"]  # the suite's own, never the user's (tests/conftest.py)
    assert main(["train", "--set", f"out_dir={tmp_path}", "--set", "run_name=auto", "--set", "epochs=2"]) == 0
    run = tmp_path / "auto"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["test_top1"] > 0.12  # better than chance (10%)
    measured = read_measurements("fp32_kernels")
    assert measured, f"training measured no fp32 kernel choice in {cache}"
    assert all(set(speeds) >= {"torch"} for speeds in measured.values())  # each shape: torch's GEMM and the rest

    capsys.readouterr()
    assert main(["export", str(run), "-o", str(tmp_path / "model.onnx")]) == 0
    printed = capsys.readouterr().out
    advice = next(line for line in printed.splitlines() if line.startswith("fastest format on this CPU"))
    # the calibration ran and its figures chose (the formats it could not time are named after them)
    assert not advice.startswith("fastest format on this CPU: not measured"), printed
    assert path_speeds(), "the export's calibration kept no path speeds"

    capsys.readouterr()
    seven = REPO / "my_digit.png"  # the digits test split's first 7, as the README's examples use it
    # (two epochs are too few to read it: the figures here are the choices, not the accuracy)
    assert main(["predict", str(tmp_path / "model.onnx"), str(seven), "--format", "json"]) == 0
    predictions = json.loads(capsys.readouterr().out)[0]["predictions"]
    assert len(predictions) == 3 and {p["label"] for p in predictions} <= set("0123456789")
