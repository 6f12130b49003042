"""The OpenVINO backend's tests (test_openvino.py), run in a pytest process of their own: OpenVINO loaded into a worker
of the main run could leave it to die at a later fork or training test (a segmentation fault, openvino 2026.4.1 beside
torch 2.13.0), taking the tests after it down."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_openvino_backend_in_a_process_of_its_own():
    if importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None:
        pytest.skip("the OpenVINO backend needs openvino and nncf (pip install -e '.[openvino]')")
    module = Path(__file__).with_name("test_openvino.py")
    environment = dict(os.environ, VITLAB_OPENVINO_PROCESS="1")
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(module)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert " passed" in finished.stdout and "skipped" not in finished.stdout.splitlines()[-1], finished.stdout[-500:]
