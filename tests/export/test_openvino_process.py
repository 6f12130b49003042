"""The OpenVINO backend's tests (test_openvino.py: the classifier's export, int8, predict and serve;
test_openvino_models.py: the other layouts and the dense models), each file run in a pytest process of its own:
OpenVINO loaded into a worker of the main run could leave it to die at a later fork or training test (a segmentation
fault, openvino 2026.4.1 beside torch 2.13.0), taking the tests after it down. Two files, two processes: under
pytest-xdist they run side by side instead of one long test at the end of a worker."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openvino_process import PROCESS_VARIABLE


@pytest.mark.slow
@pytest.mark.parametrize("module", ["test_openvino.py", "test_openvino_models.py"])
def test_the_openvino_backend_in_a_process_of_its_own(module):
    if importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None:
        pytest.skip("the OpenVINO backend needs openvino and nncf (pip install -e '.[openvino]')")
    path = Path(__file__).with_name(module)
    environment = dict(os.environ, **{PROCESS_VARIABLE: "1"})
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert " passed" in finished.stdout and "skipped" not in finished.stdout.splitlines()[-1], finished.stdout[-500:]
