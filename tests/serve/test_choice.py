"""src/vitlab/serve/choice.py: serve's automatic backend, a pure function of the model, the measured speeds and
the precision chosen, over the table of backends."""

from __future__ import annotations

import pytest

from vitlab.runtime.registry import backends
from vitlab.serve.choice import ServedModel, automatic_backend

EVERY = ("onnx", "pt2e", "openvino")


def chosen(precision="fp32", speeds=None, installed=EVERY, **model):
    choice = automatic_backend(
        ServedModel(precision, **{"device": "cpu", **model}), speeds or {}, installed, backends()
    )
    return choice.value, choice.reason


def test_int8_goes_to_onnx_runtime_unless_this_machine_measured_pytorch_faster():
    name, reason = chosen("int8")
    assert name == "onnx" and reason == (
        "served by ONNX Runtime, whose int8 kernels ran faster than PyTorch's on every CPU measured"
    )
    assert chosen("int8", {"torch-int8": 1.2, "onnx-int8": 1.5})[0] == "onnx"
    assert chosen("int8", {"torch-int8": 1.5, "onnx-int8": 1.2}) == ("torch", "")
    assert chosen("int8", {"torch-int8": 1.5}) == ("torch", "")  # ONNX Runtime's not measured: PyTorch's was
    assert chosen("int8", installed=("openvino",)) == ("torch", "")


@pytest.mark.parametrize("precision, torch_path", [("fp32", "eager-fp32"), ("bf16", "eager-bf16")])
def test_openvino_is_taken_only_where_it_measured_faster_at_that_precision(precision, torch_path):
    assert chosen(precision) == ("torch", "")  # nothing measured
    faster = {torch_path: 1.0, f"openvino-{precision}": 1.4}
    name, reason = chosen(precision, faster)
    assert name == "openvino"
    assert reason == f"served by OpenVINO's CPU plugin: openvino-{precision} ran 1.40x eager fp32 on this CPU, " + (
        f"{torch_path} 1.00x (vitlab bench)"
    )
    assert chosen(precision, {torch_path: 1.0, f"openvino-{precision}": 0.9}) == ("torch", "")
    assert chosen(precision, {f"openvino-{precision}": 1.4}) == ("torch", "")  # PyTorch's path not measured
    assert chosen(precision, faster, installed=("onnx",)) == ("torch", "")


def test_what_no_export_at_start_serves_stays_with_pytorch():
    faster = {"eager-fp32": 1.0, "openvino-fp32": 1.4, "torch-int8": 1.0, "openvino-int8": 9.0}
    assert chosen("fp32", faster, device="cuda") == ("torch", "")
    assert chosen("fp32", faster, dense=True) == ("torch", "")
    assert chosen("int8", faster, naflex=True) == ("torch", "")
    # an int8 OpenVINO file is calibrated (`vitlab export`), so int8 is never OpenVINO's at start
    assert chosen("int8", faster, installed=("openvino",)) == ("torch", "")
