from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"

# (fixture name, weights path relative to FIXTURES): every reference checkpoint with its expected logits.
REFERENCE_CHECKPOINTS = [
    ("jax_vit_token", "jax_vit_token.npz"),
    ("jax_vit_gap_repr", "jax_vit_gap_repr.npz"),
    ("jax_hybrid_r_vit", "jax_hybrid_r_vit.npz"),
    ("timm_vit_token", "timm_vit_token.safetensors"),
    ("timm_vit_avg_fcnorm", "timm_vit_avg_fcnorm.safetensors"),
    ("timm_vit_avg_cls", "timm_vit_avg_cls.safetensors"),
    ("timm_deit_distilled", "timm_deit_distilled.safetensors"),
    ("hf_deit_teacher", "hf_deit_teacher"),
    ("hf_deit", "hf_deit"),
    ("timm_dino", "timm_dino.safetensors"),
    ("hf_dino", "hf_dino"),
    ("hf_mae", "hf_mae"),
    ("hf_dinov2", "hf_dinov2"),
    ("hf_dinov2_registers", "hf_dinov2_registers"),
    ("timm_dinov2_registers", "timm_dinov2_registers.safetensors"),
    ("timm_clip_quickgelu", "timm_clip_quickgelu.safetensors"),
    ("hf_clip_vision", "hf_clip_vision"),
    ("hf_clip", "hf_clip"),
    ("timm_siglip", "timm_siglip.safetensors"),
    ("hf_siglip_vision", "hf_siglip_vision"),
    ("hf_vit", "hf_vit"),
]


def reference_io(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(NCHW input, expected output) written by the reference implementation: the logits, or for an encoder
    without a head its features (the pooled class token after the final norm)."""
    with np.load(FIXTURES / f"{name}.io.npz", allow_pickle=False) as io:
        images = io["input_nchw"] if "input_nchw" in io.files else io["input_nhwc"].transpose(0, 3, 1, 2)
        expected = io["logits"] if "logits" in io.files else io["features"]
        return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(expected)


MACHINE_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pytest_configure(config) -> None:
    """The suite's measurements (fp32 kernels, path speeds, peaks) go to a cache of its own, never the user's,
    where a digits-8 bench would become this machine's advice.

    Under pytest-xdist (`make test` runs two workers on two cores) each worker keeps to a core of its own:
    what it runs, and the processes it starts, then see one core (`hardware.available_cores`) and start one
    thread each, instead of two workers' threads fighting over both cores."""
    os.environ.setdefault("VITLAB_CACHE", tempfile.mkdtemp(prefix="vitlab-test-cache-"))
    os.environ.setdefault("VITLAB_CALIBRATE", "0")
    # torch's GEMM unless a test asks: each test's own cache would measure the kernels again (tests/test_kernels.py
    # and tests/layers/test_onednn_linear.py cover the measurement and the oneDNN layers)
    os.environ.setdefault(
        "VITLAB_FP32_KERNEL", "torch"
    )  # 20 s per export otherwise; tests/bench/test_advice.py turns it on
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = MACHINE_CORES
    if len(cores) >= 2:
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, {cores[index % len(cores)]})
        torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, so restore_xdist_groups sees what it did
def pytest_collection_modifyitems(config, items) -> None:
    """Test files that hold a test marked slow (tens of seconds) first, each file's tests kept together and in
    order (so a module fixture is built once): under pytest-xdist the long ones then start early and the many
    short ones fill the workers in around them, instead of one long test running alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)
    if getattr(config.option, "loadgroup", False):  # set in a pytest-xdist worker under `--dist loadgroup`
        restore_xdist_groups(items)


def restore_xdist_groups(items) -> None:
    """Under `--dist loadgroup` a test marked `xdist_group(NAME)` has `@NAME` appended to its node id, which is
    how pytest-xdist's scheduler sends a group to one worker. pytest-xdist 3.8 writes it to a field pytest 9.2 no
    longer reads (pytest-dev/pytest-xdist#1386): no group held, so the pt2e tests trained and exported their
    session fixtures on both workers (~25 s each) and the torchrun tests ran two at a time, each worker starting
    its own uninterrupted run. Appended here where it is missing, as pytest-xdist itself appends it."""
    try:
        from _pytest.nodeid import NodeId  # pytest 9.2's structured node ids
    except ImportError:  # an earlier pytest, where pytest-xdist's own suffix holds
        return
    for item in items:
        names = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture
def all_cores():
    """For a test whose processes run side by side (torchrun's ranks): every core of the machine while it runs, as
    outside pytest-xdist, rather than its worker's one core shared by all of them."""
    if not hasattr(os, "sched_setaffinity") or not MACHINE_CORES:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(MACHINE_CORES))
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


def pytest_runtest_setup(item) -> None:
    share_the_onnx_registry()


def share_the_onnx_registry() -> None:
    """Every ONNX export (torch.onnx.export, dynamo) builds its table of ATen-to-ONNX functions afresh from torchlib
    (measured ~0.25 of a tiny model's ~2.8 CPU-s export); the suite exports about a hundred times. Once torch's
    exporter is loaded (by the first export, so a worker that exports nothing never imports it), each build after
    the first hands out a copy of the first: the same functions, in lists of its own, so a registration added to
    one export's table (custom_translation_table) stays out of the next. Left as torch has it where torch's
    internals differ: it only saves time."""
    registration = sys.modules.get("torch.onnx._internal.exporter._registration")
    registry_class = getattr(registration, "ONNXRegistry", None)
    if registry_class is None or getattr(registry_class.from_torchlib, "shared_by_the_suite", False):
        return
    build = registry_class.from_torchlib.__func__
    built: dict = {}

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(cls, *args, **kwargs)
        first = built[key]
        registry = cls()
        registry._opset_version = first._opset_version
        registry.functions = {target: list(functions) for target, functions in first.functions.items()}
        return registry

    from_torchlib.shared_by_the_suite = True  # type: ignore[attr-defined]
    registry_class.from_torchlib = classmethod(from_torchlib)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# The pictures every training run draws as it ends (curves.png, and for a classifier confusion.png; eval draws
# confusion.png too): matplotlib's layout and rendering cost ~0.25 CPU-s a run, a third of the CPU of the files of
# in-process training tests (py-spy over tests/train/test_train.py and its neighbours). Elsewhere a test asks for
# them by name (`@pytest.mark.pictures`: a run's own pictures drawn in full, the README's commands, the curves'
# markers); the others get a 1x1 PNG in their place, written only after the arguments a picture is drawn from are
# checked as drawing them needs. Processes a test starts (torchrun, `python -m vitlab`) draw theirs in full.
ONE_PIXEL_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a49444154789c63600000000200015e2a6e4c0000000049454e44ae426082"
)


def outline_of_training_curves(history, path):
    rows = list(history)
    assert rows and all("epoch" in row and "train_loss" in row for row in rows), rows[:1]
    Path(path).write_bytes(ONE_PIXEL_PNG)
    return Path(path)


def outline_of_confusion(confusion, class_names, path, title="confusion matrix"):
    matrix = np.asarray(confusion)
    assert matrix.shape == (len(class_names), len(class_names)), (matrix.shape, len(class_names))
    Path(path).write_bytes(ONE_PIXEL_PNG)
    return Path(path)


@pytest.fixture(autouse=True)
def _pictures_outlined(request, monkeypatch) -> None:
    if request.node.get_closest_marker("pictures") is not None:
        return
    from vitlab import plots  # no matplotlib until a picture is drawn

    monkeypatch.setattr(plots, "plot_training_curves", outline_of_training_curves)
    monkeypatch.setattr(plots, "plot_loss_curves", outline_of_training_curves)
    monkeypatch.setattr(plots, "plot_confusion", outline_of_confusion)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished 2-epoch digits run of a one-block model (about 2 s), shared by tests that only read a run
    folder. Tests that change it copy it first."""
    from vitlab.train.config import TrainConfig
    from vitlab.train.loop import train

    out = tmp_path_factory.mktemp("runs")
    config = TrainConfig(
        epochs=2,
        warmup_epochs=1,
        run_name="tiny",
        out_dir=str(out),
        threads=1,
        progress=False,
        model_overrides=dict(embed_dim=16, depth=1, num_heads=2, mlp_dim=32),
    )
    summary = train(config)
    assert summary["status"] == "finished"
    return out / "tiny"


@pytest.fixture
def stop_at_check(monkeypatch):
    """`stop_at_check(n)`: the next run stops, as Ctrl-C would, at the n-th stop check (one after each step, in
    `vitlab.train.epoch`, and one at each epoch's end, in `vitlab.train.loop`: with 10 steps an epoch, check 15 is
    after step 4 of epoch 2); `stop_at_check(None)` lets runs go on again."""
    from vitlab.train import epoch, loop

    real, real_many = loop.any_rank, epoch.any_ranks

    def stop_at(check: int | None) -> None:
        calls = {"n": 0}

        def any_rank(flag, env):  # the epoch's end
            calls["n"] += 1
            return real(flag or calls["n"] == check, env)

        def any_ranks(flags, env):  # after each step: [stop, save]
            calls["n"] += 1
            return real_many([flags[0] or calls["n"] == check, *flags[1:]], env)

        monkeypatch.setattr(loop, "any_rank", real if check is None else any_rank)
        monkeypatch.setattr(epoch, "any_ranks", real_many if check is None else any_ranks)

    return stop_at


# The page tests of `vitlab serve` (tests/serve/). Here, not in a tests/serve/conftest.py: a second module named
# conftest would shadow this one for the tests that import FIXTURES from it.
@pytest.fixture
def chromium():
    """A headless Chromium driven through selenium and chromedriver (skipped where they are not installed)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not browser or not driver_path:
        pytest.skip(
            "Chromium and its driver are not installed (apt-get install chromium chromium-driver; "
            ".ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1000,800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()
