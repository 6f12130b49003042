"""hardware.py: one core count, the process's CPU affinity, and every place that sizes threads or processes
follows it (train's thread default, serve, ablate)."""

import os

import pytest

from vitlab.distributed import DistEnv
from vitlab.hardware import available_cores
from vitlab.variants import variant_config


@pytest.fixture
def three_cores(monkeypatch):
    """This process pinned to 3 cores (as `taskset -c 0-2` would) on a machine that has 64."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_core_count_is_the_affinity_not_the_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cores() == 1


def test_without_affinity_the_core_count_is_the_machines(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "cannot tell"
    assert available_cores() == 1


@pytest.fixture
def command(monkeypatch):
    """Threads chosen as a `vitlab` command chooses them, with no OMP_NUM_THREADS and torch's count restored after."""
    import torch

    from vitlab.hardware import command_chooses_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    before = torch.get_num_threads()
    with command_chooses_threads():
        yield
    torch.set_num_threads(before)


def test_trains_thread_default_follows_the_affinity(monkeypatch, command):
    from vitlab.train.config import TrainConfig
    from vitlab.train.setup import use_training_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert str(use_training_threads(TrainConfig(), DistEnv())) == "1 thread: the cores this process may use"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun processes on this machine share the 8 cores
    threads = use_training_threads(TrainConfig(), DistEnv(world_size=4))
    assert str(threads) == "4 threads: the 8 cores this process may use, shared by 2 processes"


def test_omp_num_threads_and_an_explicit_count_come_before_the_cores(monkeypatch, three_cores, command):
    """Issue: `train` took every core whatever OMP_NUM_THREADS said; on a machine busy with other jobs 2 threads
    trained at 100 images/s where 1 trained at 1,000."""
    from vitlab.hardware import choose_threads

    assert str(choose_threads()) == "3 threads: the cores this process may use"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert str(choose_threads()) == "1 thread: OMP_NUM_THREADS=1"
    assert str(choose_threads(2)) == "2 threads: --set threads=2"  # asked for: above everything
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a count: the cores
    assert choose_threads().count == 3


def test_torchruns_own_omp_num_threads_is_not_the_users(monkeypatch, three_cores, command):
    """torchrun sets OMP_NUM_THREADS=1 for several processes where the user set none; its agent's environment (the
    one it started with) then lacks it, and the processes share the cores instead."""
    from vitlab import hardware

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(hardware, "launcher_environment", lambda: {"PATH": "/usr/bin"})
    assert hardware.choose_threads(processes=3).reason == "the 3 cores this process may use, shared by 3 processes"
    monkeypatch.setattr(hardware, "launcher_environment", lambda: {"OMP_NUM_THREADS": "1"})  # the user's own 1
    assert str(hardware.choose_threads(processes=3)) == "1 thread: OMP_NUM_THREADS=1"


def test_a_python_caller_keeps_the_count_it_gave_torch(monkeypatch):
    import torch

    from vitlab.hardware import choose_threads, use_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert str(use_threads()) == "3 threads: torch's setting in this process" and torch.get_num_threads() == 3
        assert choose_threads(2).count == 2  # threads=2 in the recipe still wins
    finally:
        torch.set_num_threads(before)


def test_the_start_line_says_how_many_threads_and_why(tmp_path, monkeypatch, capsys, command):
    from runfiles import MICRO
    from vitlab.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = ["train", "--out-dir", str(tmp_path), "--set", "epochs=1", "--set", f"model_overrides={MICRO}"]
    assert main([*args, "--set", "progress=false", "--set", "max_train_images=200"]) == 0
    start_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("training "))
    assert "1 process(es) on cpu, 1 thread each (OMP_NUM_THREADS=1); run folder" in start_line


def test_serve_and_ablate_follow_the_affinity(three_cores, command):
    from vitlab.ablate.plan import Ablation, plan
    from vitlab.ablate.runner import choose_jobs
    from vitlab.serve.engine import serving_threads
    from vitlab.train.config import TrainConfig

    assert serving_threads(variant_config("B/16")) == 3
    assert serving_threads(variant_config("mnist-28")) == 1  # a tiny model: one thread whatever the cores
    assert serving_threads(variant_config("mnist-28"), 2) == 2  # --threads 2
    small = plan(Ablation("s", TrainConfig(), {"lr": [1e-3]}))[0]
    assert choose_jobs("auto", small) == 3


# ------------------------------------------------------------------------------ units, precision and devices
AMX = "avx2,avx512,vnni,avx512_bf16,amx"


@pytest.fixture
def no_measured_peaks(monkeypatch, tmp_path):
    """An empty cache: choices follow the (simulated) flags, not a peak `vitlab bench` measured here."""
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))


def test_simulated_units_are_what_auto_sees(monkeypatch):
    from vitlab.errors import UsageError
    from vitlab.hardware import cpu_units

    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2")
    units = cpu_units()
    assert (units.avx2, units.bf16, units.int8, units.simulated) == (True, False, False, True)
    assert units.describe().startswith("AVX2 (no VNNI, no bf16 units)")
    monkeypatch.setenv("VITLAB_CPU_UNITS", AMX)
    assert cpu_units().bf16 and cpu_units().int8
    monkeypatch.setenv("VITLAB_CPU_UNITS", "avx2,amx512")
    with pytest.raises(UsageError, match="amx512"):
        cpu_units()


@pytest.mark.parametrize(
    "units, purpose, expected",
    [
        ("avx2", "train", "fp32"),
        ("avx2", "inference", "fp32"),
        ("avx2", "serve", "int8"),
        ("none", "serve", "fp32"),
        (AMX, "train", "bf16"),
        (AMX, "inference", "bf16"),
        (AMX, "serve", "bf16"),
        ("avx2,avx512,vnni", "train", "fp32"),
        ("avx2,avx512,vnni", "serve", "int8"),  # int8 only where it serves
        ("avx2,avx512,avx512_bf16", "train", "bf16"),
    ],
)
def test_auto_precision_follows_the_units(monkeypatch, no_measured_peaks, units, purpose, expected):
    from vitlab.hardware import choose_precision

    monkeypatch.setenv("VITLAB_CPU_UNITS", units)
    choice = choose_precision("auto", "cpu", 17.6, purpose)  # B/16 at 224
    assert choice.value == expected and choice.reason
    assert choose_precision("fp32", "cpu", 17.6, purpose).value == "fp32"  # an explicit setting always wins
    assert choose_precision("auto", "cpu", 0.005, purpose).value == "fp32"  # too small to gain from bf16


def test_a_measured_peak_outranks_the_flags(monkeypatch, no_measured_peaks):
    """A CPU whose bf16 matmul `vitlab bench` measured slower than fp32 keeps fp32 even with bf16 flags, and one
    whose flags say nothing takes bf16 where bench measured it faster."""
    from vitlab.hardware import CpuUnits, choose_precision, measured_peaks, record_peaks

    monkeypatch.delenv("VITLAB_CPU_UNITS", raising=False)
    monkeypatch.setattr("vitlab.hardware._probed_cpu_units", lambda: CpuUnits(avx2=True, avx512_bf16=True))
    record_peaks({"fp32": 300.0, "bf16": 280.0, "int8": 900.0})
    assert measured_peaks() == {"fp32": 300.0, "bf16": 280.0, "int8": 900.0}
    choice = choose_precision("auto", "cpu", 17.6, "train")
    assert choice.value == "fp32" and "measured" in choice.reason
    assert choose_precision("auto", "cpu", 17.6, "serve").value == "int8"
    record_peaks({"fp32": 300.0, "bf16": 900.0})
    assert choose_precision("auto", "cpu", 17.6, "train").value == "bf16"


def test_a_gpu_asked_for_without_one_gives_one_clear_message(monkeypatch):
    import torch

    from vitlab.errors import UsageError
    from vitlab.hardware import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None).type == "cpu" and resolve_device("auto").type == "cpu"
    with pytest.raises(UsageError, match="sees no CUDA GPU.*--device cpu"):
        resolve_device("cuda")
    with pytest.raises(UsageError, match="not a device"):
        resolve_device("gpu0")
    with pytest.raises(UsageError, match="cpu or cuda"):
        resolve_device("mps")


@pytest.mark.parametrize(
    "command", [["eval"], ["predict", "my_digit.png"], ["analyze", "--images", "digits"], ["serve"]]
)
def test_every_command_refuses_a_missing_gpu_in_one_line(monkeypatch, tiny_run, capsys, command):
    import torch

    from vitlab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    name, *rest = command
    code = main([name, str(tiny_run), *rest, "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "PyTorch sees no CUDA GPU" in err, err


def test_freed_memory_is_kept_for_reuse_unless_asked_not_to(monkeypatch):
    """glibc's malloc is told to keep freed memory (no page faults for the next step's activations); VITLAB_MALLOC=
    system, and a preloaded jemalloc or tcmalloc, leave the allocator alone."""
    import platform

    from vitlab.hardware import keep_freed_memory

    monkeypatch.setenv("VITLAB_MALLOC", "system")
    assert keep_freed_memory() is False
    monkeypatch.delenv("VITLAB_MALLOC")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    assert keep_freed_memory() is False
    monkeypatch.delenv("LD_PRELOAD")
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert keep_freed_memory() is True


def test_a_run_that_saves_memory_stops_keeping_freed_memory(monkeypatch):
    """A run with activation checkpointing (`save_memory_over_speed`) turns the `vitlab` command's kept heap into
    the workers' settings, which give freed blocks back, and trims what the heap kept; where vitlab kept nothing (a
    Python caller's process, VITLAB_MALLOC=system) the allocator is left alone. A fake libc records the calls."""
    from vitlab import hardware

    calls: list[tuple] = []

    class RecordingLibc:
        def mallopt(self, option, value):
            calls.append(("mallopt", option, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("malloc_trim", pad))
            return 1

    monkeypatch.setattr(hardware, "glibc", RecordingLibc)
    monkeypatch.setattr(hardware, "_KEEPING_FREED_MEMORY", [False])
    assert hardware.save_memory_over_speed() is False and calls == []
    assert hardware.keep_freed_memory()
    calls.clear()
    assert hardware.save_memory_over_speed() is True
    m_mmap_threshold, m_trim_threshold = -3, -1
    assert ("mallopt", m_mmap_threshold, hardware.WORKER_MMAP_THRESHOLD) in calls
    assert ("mallopt", m_trim_threshold, hardware.WORKER_TRIM_THRESHOLD) in calls
    assert calls[-1] == ("malloc_trim", 0)
    calls.clear()
    assert hardware.save_memory_over_speed() is False and calls == []  # once is enough


def test_a_worker_gives_blocks_of_a_megabyte_back_where_training_keeps_them():
    """After `return_freed_memory` a 2 MB block gets its own mapping (returned to the kernel when freed); under the
    training process's `keep_freed_memory` it comes from the heap, which keeps it. Run in a child process: the
    settings are process-wide. glibc's mallinfo2 counts mapped blocks (hblkhd)."""
    import platform
    import subprocess
    import sys

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc settings only")
    child = """
import ctypes
from vitlab.hardware import keep_freed_memory, return_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p

def mapped_by_a_block():
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(2 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(ctypes.c_void_p(block))
    return mapped

assert keep_freed_memory()
kept = mapped_by_a_block()
assert return_freed_memory()
print(kept, mapped_by_a_block())
"""
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=False)
    if "mallinfo2" in result.stderr:  # glibc before 2.33
        pytest.skip("this glibc has no mallinfo2")
    assert result.returncode == 0, result.stderr
    kept, returned = map(int, result.stdout.split())
    assert kept == 0 and returned >= 2 << 20


@pytest.mark.parametrize(
    "vendor, family, model, units, fp32, bf16, int8",
    [
        # Zen 4 at 2.6 GHz: AVX-512 on two 256-bit pipes, so Zen 3's fp32 rate; bf16 and int8 dot products on top
        ("AuthenticAMD", 25, 0x11, dict(avx2=True, avx512=True, vnni=True, avx512_bf16=True), 166.4, 332.8, 665.6),
        ("AuthenticAMD", 26, 0x02, dict(avx2=True, avx512=True, vnni=True, avx512_bf16=True), 332.8, 665.6, 1331.2),
        ("AuthenticAMD", 25, 0x01, dict(avx2=True), 166.4, None, 332.8),  # Zen 3: AVX2's int8 multiply-adds
        (
            "GenuineIntel",
            6,
            0x8F,
            dict(avx2=True, avx512=True, vnni=True, avx512_bf16=True, amx=True),
            332.8,
            5324.8,
            10649.6,
        ),
    ],
)
def test_the_theoretical_peak_follows_the_core_and_the_reported_clock(
    monkeypatch, vendor, family, model, units, fp32, bf16, int8
):
    from vitlab import hardware

    fields = {"vendor_id": vendor, "cpu family": str(family), "model": str(model), "cpu MHz": "2600.000"}
    monkeypatch.setattr(hardware, "cpuinfo", lambda: fields)
    monkeypatch.setattr(hardware, "cpu_units", lambda: hardware.CpuUnits(**units))
    peaks = hardware.theoretical_peaks(threads=2)
    assert (peaks["fp32"], peaks.get("bf16"), peaks["int8"]) == (fp32, bf16, int8)
    assert "x 2 cores x 2.60 GHz" in peaks["how"]
    monkeypatch.setattr(hardware, "cpuinfo", lambda: {**fields, "vendor_id": "HygonGenuine"})
    assert hardware.theoretical_peaks(threads=2) is None  # a core not listed: no figure rather than a guess
