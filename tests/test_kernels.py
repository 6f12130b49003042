"""The fp32 kernel is chosen by measurement on this machine, kept per machine, and overridable."""

import pytest

from vitlab import kernels
from vitlab.errors import UsageError
from vitlab.hardware import read_measurements, update_measurements


def keep_one(index: int) -> None:
    """A process's read-modify-write of the kept measurements (top level, so a spawned process can run it)."""
    import time

    def add(known: dict) -> dict:
        time.sleep(0.05)  # between the read and the write, where an unlocked writer loses the other's figure
        return {**known, str(index): index}

    update_measurements("test", add)


@pytest.fixture
def fake_measurements(monkeypatch, tmp_path):
    """A fresh cache and a measurement that returns given rates and counts its calls."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(kernels.OVERRIDE, raising=False)
    monkeypatch.setattr(kernels, "onednn_available", lambda: True)
    calls = []

    def measure(rates):
        def fake(purpose, rows, inner, outer):
            calls.append((purpose, rows, inner, outer))
            return dict(rates)

        monkeypatch.setattr(kernels, "measure_fp32_kernels", fake)

    return measure, calls


def test_the_faster_kernel_is_chosen_and_kept(fake_measurements):
    measure, calls = fake_measurements
    measure({"torch": 180.0, "onednn": 350.0})
    first = kernels.fp32_kernel_choice("inference", 3152, 768, 3072)
    assert first.value == "onednn" and "1.94x" in first.reason and "measured now" in first.reason
    again = kernels.fp32_kernel_choice("inference", 3000, 768, 3072)  # same power-of-two rows: kept figure
    assert again.value == "onednn" and "measured earlier" in again.reason and len(calls) == 1
    kernels.fp32_kernel_choice("train", 3152, 768, 3072)  # training is measured apart
    assert len(calls) == 2


def test_another_thread_count_is_measured_apart(fake_measurements):
    import torch

    measure, calls = fake_measurements
    measure({"torch": 180.0, "onednn": 350.0})
    threads = torch.get_num_threads()
    kernels.fp32_kernel_choice("inference", 256, 64, 256)
    try:
        torch.set_num_threads(1 if threads > 1 else 2)  # serve runs tiny models on one thread, a DDP rank on its share
        measure({"torch": 100.0, "onednn": 50.0})
        assert kernels.fp32_kernel_choice("inference", 256, 64, 256).value == "torch" and len(calls) == 2
    finally:
        torch.set_num_threads(threads)
    assert kernels.fp32_kernel_choice("inference", 256, 64, 256).value == "onednn" and len(calls) == 2


@pytest.mark.run_level
def test_processes_measuring_at_once_keep_every_measurement(monkeypatch, tmp_path):
    """Each of several processes keeps a figure under the measurements' lock: none is lost to another's write."""
    import multiprocessing

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.map(keep_one, range(8))
    assert read_measurements("test") == {str(index): index for index in range(8)}


def test_a_gain_within_noise_keeps_torch(fake_measurements):
    measure, _ = fake_measurements
    measure({"torch": 190.0, "onednn": 195.0})
    assert kernels.fp32_kernel_choice("train", 6400, 64, 256).value == "torch"


def test_the_override_wins_and_a_bad_one_is_refused(fake_measurements, monkeypatch):
    measure, calls = fake_measurements
    measure({"torch": 180.0, "onednn": 350.0})
    monkeypatch.setenv(kernels.OVERRIDE, "torch")
    choice = kernels.fp32_kernel_choice("inference", 100, 64, 256)
    assert choice.value == "torch" and kernels.OVERRIDE in choice.reason and not calls
    monkeypatch.setenv(kernels.OVERRIDE, "mkl")
    with pytest.raises(UsageError, match="VITLAB_FP32_KERNEL='mkl'"):
        kernels.fp32_kernel_choice("inference", 100, 64, 256)


def test_a_simulated_cpu_kind_measures_for_itself(fake_measurements, monkeypatch):
    measure, calls = fake_measurements
    measure({"torch": 180.0, "onednn": 350.0})
    kernels.fp32_kernel_choice("inference", 100, 64, 256)
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")
    measure({"torch": 200.0, "onednn": 100.0})
    assert read_measurements("fp32_kernels") == {}  # the real CPU's figures are not this kind's
    assert kernels.fp32_kernel_choice("inference", 100, 64, 256).value == "torch" and len(calls) == 2


def test_a_real_measurement_names_both_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path))
    rates = kernels.measure_fp32_kernels("train", 64, 32, 64)
    assert set(rates) == {"torch", "onednn"} and all(rate > 0 for rate in rates.values())
