"""What the OpenVINO backend's test files share: they run only in a pytest process of their own
(tests/export/test_openvino_process.py starts one per file with VITLAB_OPENVINO_PROCESS=1), so OpenVINO never loads
into a worker of the main run: after OpenVINO has run in a process, a later fork of it or a later training test there
could end in a segmentation fault (openvino 2026.4.1 beside torch 2.13.0), taking every test left on that worker
down with it."""

import importlib.util
import os

import pytest

PROCESS_VARIABLE = "VITLAB_OPENVINO_PROCESS"


def skip_outside_its_own_process() -> None:
    """Skip the calling test module unless OpenVINO and NNCF are installed and this is the module's own process."""
    if importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None:
        pytest.skip(
            "the OpenVINO backend needs openvino and nncf (pip install -e '.[openvino]')", allow_module_level=True
        )
    if os.environ.get(PROCESS_VARIABLE) != "1":
        pytest.skip("run by tests/export/test_openvino_process.py in a process of its own", allow_module_level=True)
