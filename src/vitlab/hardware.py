"""The CPU vitlab runs on: how many cores this process may use, and the measured crossovers (sequence length, model
size) at which another way of using them becomes faster.

Each decision has one constant here, with the measurement behind it, so that train, serve, ablate and bench agree.
Two pairs look alike but are different decisions, measured separately, and so keep separate names and values:
the explicit attention kernel for eager fp32 training steps (32 tokens) and for compiled bf16 inference (64);
one intra-op thread for a served model (0.1 GFLOPs) and one training process per core in an ablation (0.5).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from vitlab.download import cache_dir
from vitlab.environment import read_variable
from vitlab.errors import UsageError
from vitlab.files import atomic_write_bytes, exclusive_lock


def available_cores() -> int:
    """The number of cores this process may run on: its CPU affinity where the OS keeps one (Linux: `taskset`,
    a cgroup cpuset, a batch scheduler's allocation), else every core of the machine. `os.cpu_count()` alone
    counts the machine's cores, so a job pinned to 4 of 64 would start 64 threads and fight over 4."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------------------------- threads
@dataclass(frozen=True)
class Threads:
    """How many intra-op threads torch runs in this process, and why, for the start lines."""

    count: int
    reason: str  # "the cores this process may use", "OMP_NUM_THREADS=1", "--set threads=1", ...

    def __str__(self) -> str:
        return f"{self.count} thread{'' if self.count == 1 else 's'}: {self.reason}"


# True while a `vitlab` command runs (vitlab.cli.main): the process is vitlab's, whose threads it chooses. A Python
# caller of the library keeps the count it gave torch (torch.set_num_threads).
_COMMAND_RUNNING = contextvars.ContextVar("vitlab_command_running", default=False)


@contextlib.contextmanager
def command_chooses_threads() -> Iterator[None]:
    """While it lasts, `choose_threads` decides this process's threads by the command's rule."""
    token = _COMMAND_RUNNING.set(True)
    try:
        yield
    finally:
        _COMMAND_RUNNING.reset(token)


def choose_threads(
    requested: int | None = None, processes: int = 1, asked_as: str = "--set threads", default: Threads | None = None
) -> Threads:
    """The intra-op threads for one of `processes` processes on this machine, by the first rule that applies:
    the count asked for (`asked_as`=N); in a Python caller's process (not a `vitlab` command), torch's count as the
    caller left it (torch.set_num_threads, or torch's default, which follows OMP_NUM_THREADS and the affinity); the
    user's OMP_NUM_THREADS; `default` (serve: one thread for a tiny model); else the cores this process may use (its
    affinity: `available_cores`), shared evenly among `processes`. On a machine busy with other jobs the default is
    too many: OMP_NUM_THREADS, taskset or `--set threads` say so."""
    if requested is not None:
        return Threads(requested, f"{asked_as}={requested}")
    from_environment = users_omp_threads()
    if not _COMMAND_RUNNING.get():
        import torch

        count = torch.get_num_threads()
        if count == from_environment:
            return Threads(count, f"OMP_NUM_THREADS={count}")
        return Threads(count, "torch's setting in this process")
    if from_environment is not None:
        return Threads(from_environment, f"OMP_NUM_THREADS={from_environment}")
    if default is not None:
        return default
    cores = available_cores()
    if processes <= 1:
        return Threads(cores, "the cores this process may use")
    return Threads(
        max(1, cores // processes), f"the {cores} cores this process may use, shared by {processes} processes"
    )


def use_threads(
    requested: int | None = None, processes: int = 1, asked_as: str = "--set threads", default: Threads | None = None
) -> Threads:
    """`choose_threads`, and torch told to run that many; returns the choice."""
    import torch

    choice = choose_threads(requested, processes, asked_as, default)
    torch.set_num_threads(choice.count)
    return choice


def users_omp_threads() -> int | None:
    """OMP_NUM_THREADS as the user set it (its first level), None where it is unset or not a count. torchrun sets 1
    itself for several processes on a machine where the user set none; that 1, absent from the environment
    torchrun's agent started with, is not the user's (where that environment cannot be read, it is taken as
    torchrun's)."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not value.isdigit() or int(value) < 1:
        return None
    several = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1
    if value == "1" and several and "TORCHELASTIC_RUN_ID" in os.environ:
        agent = launcher_environment()
        if agent is None or "OMP_NUM_THREADS" not in agent:
            return None
    return int(value)


def launcher_environment() -> dict[str, str] | None:
    """The environment this process's parent (torchrun's agent) was started with, before it set anything in its
    own (Linux's /proc); None where it cannot be read."""
    try:
        raw = Path(f"/proc/{os.getppid()}/environ").read_bytes()
    except OSError:
        return None
    entries = raw.decode(errors="replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


# ------------------------------------------------------------------------------------------------ memory
# glibc's malloc gives blocks over its mmap threshold (128 KB at first) fresh pages from the kernel and returns
# freed heap tops to it, so every step of a training loop first-touches its activations again: 6,000-14,000 page
# faults per mnist-28 training step on a 2-core AMD EPYC VM, where a fault costs microseconds. Keeping freed memory
# for reuse (heap allocations up to glibc's 32 MB mmap ceiling, no trimming) cuts them to 0-250 a step
# (`python benchmarks/allocator.py`). The cost: the process keeps its peak memory until it exits.
KEEP_FREED_MEMORY_UP_TO = 32 << 20


_KEEPING_FREED_MEMORY = [False]  # whether `keep_freed_memory` is in force in this process


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to reuse freed memory instead of returning it to the kernel (see above); True where it
    took the settings."""
    kept = set_malloc(mmap_threshold=KEEP_FREED_MEMORY_UP_TO, trim_threshold=1 << 30, top_pad=64 << 20)
    _KEEPING_FREED_MEMORY[0] = kept
    return kept


def set_malloc(*, mmap_threshold: int, trim_threshold: int, top_pad: int) -> bool:
    """glibc's mallopt settings for this process; True where all took."""
    libc = glibc()
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return libc is not None and all(
        [
            libc.mallopt(m_mmap_threshold, mmap_threshold),
            libc.mallopt(m_trim_threshold, trim_threshold),
            libc.mallopt(m_top_pad, top_pad),
        ]
    )


def glibc():
    """The C library where vitlab may tune its malloc, else None: VITLAB_MALLOC=system leaves the allocator as it
    is; other allocators (jemalloc, tcmalloc preloaded, musl, macOS, Windows) are left alone."""
    import ctypes
    import ctypes.util
    import platform

    if (read_variable("VITLAB_MALLOC") or "").lower() == "system" or platform.system() != "Linux":
        return None
    if "jemalloc" in os.environ.get("LD_PRELOAD", "") or "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - musl and others have neither
    except (OSError, AttributeError):
        return None
    return libc


# A data-loading worker is the opposite case: it allocates and frees each image's encoded bytes, pixels and the
# batch it stacks, at sizes that wander, and with the settings above (which a forked worker inherits) or glibc's
# adaptive threshold the heap's holes fill ever worse: a worker streaming 500x375 JPEGs in batches of 128 grew by
# about 5 MB a batch, from 80 to 470 MB. A fixed 1 MB threshold (setting one turns the adaptation off) gives the
# batch and the decoder's full-size buffers their own mappings, returned when freed, and a 1 MB trim threshold
# returns a freed heap top: the workers stay at 92-94 MB over 117 batches, decoding as fast as before (1,104-1,133
# against 1,098-1,105 images/s; 64 KB, which maps every image, cost 29%). AMD EPYC Zen 4, 2 workers,
# `python benchmarks/stream_memory.py --loader-only`.
WORKER_MMAP_THRESHOLD = 1 << 20
WORKER_TRIM_THRESHOLD = 1 << 20


def return_freed_memory() -> bool:
    """In a data-loading worker: give freed memory back to the kernel (see above), starting with the free heap it
    inherited from the training process; True where glibc took it."""
    if not set_malloc(mmap_threshold=WORKER_MMAP_THRESHOLD, trim_threshold=WORKER_TRIM_THRESHOLD, top_pad=0):
        return False
    glibc().malloc_trim(0)
    return True


# The kept heap also fragments: freed activations leave holes that the next, differently sized ones do not fit, so
# the heap grows past the step's live peak and keeps that size. A ViT-L/16 LoRA r=8 step with activation
# checkpointing (224, batch 8, AdamW, fp32) holds at most 2.08 GB at once (resident peak with every block of 1 MB
# and more mapped and returned), yet under the kept heap it grew to 3.42 GB, 1.97 GB of it free, and the resident
# peak 3.60 GB: more than checkpointing saves. A run that asks for checkpointing gives compute for memory, so
# it gets the workers' settings instead (`return_freed_memory`), page faults and all (BENCHMARKS.md,
# finetune_memory: the step peaks and CPU seconds per step with them).
def save_memory_over_speed() -> bool:
    """For a training run that trades compute for memory (activation checkpointing): undo `keep_freed_memory`
    where it is in force (as the `vitlab` command sets it), giving freed blocks of 1 MB and more back to the
    kernel and the free heap kept so far; True where it did. A Python caller's own allocator settings stay."""
    if not _KEEPING_FREED_MEMORY[0]:
        return False
    _KEEPING_FREED_MEMORY[0] = False
    return return_freed_memory()


# ---------------------------------------------------------------------------------------- attention kernels
# Up to this many tokens `vitlab train` (attention "auto") uses the explicit softmax kernel for its eager fp32
# training step: on a 2-core Xeon it steps 1.05x faster than the fused SDPA kernel at 17 tokens (mnist-28, 7x7
# patches), and the two are even at 50 (4x4 patches on 28x28) (`vitlab bench --train`: "train eager fp32"
# against "train eager fp32 sdpa"). Eager fp32 inference keeps SDPA at every length (BENCHMARKS.md, "Attention
# kernels on the CPU": explicit 0.90x at 17 tokens).
TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS = 32

# Up to this many tokens the compiled bf16 inference path of `vitlab bench` uses the explicit kernel: Inductor's
# fused bf16 softmax is 1.63x (17 tokens), 1.29x (50) and 1.05x (65) the CPU flash kernel; in fp32 (eager or
# compiled) the flash kernel is as fast or faster at every size measured, so nothing else switches
# (`python benchmarks/attention_paths.py`, BENCHMARKS.md "Attention kernels on the CPU").
COMPILED_BF16_EXPLICIT_ATTENTION_MAX_TOKENS = 64


# ------------------------------------------------------------------------------------------ threads per model
# Below this many GFLOPs per image `vitlab serve` runs the model on one intra-op thread: its operations are too
# small to share, and a second thread's spinning takes the core the HTTP handling needs. Measured with
# benchmarks/serve_load.py on the MNIST-size model (0.03 GFLOPs), 32 clients, 2 cores: 952 requests/s on one
# thread against 719 on two (and 265 against 155 at batch size 1).
SERVE_ONE_THREAD_BELOW_GFLOPS = 0.1

# Below this many GFLOPs per image `vitlab ablate --jobs auto` trains one single-thread process per core instead
# of one process on every core: every model measured trains faster that way, 1.29-1.35x for the ablation models
# (0.005-0.016 GFLOPs) and still 1.08x for S/16 at 96x96 (1.6 GFLOPs) (`python benchmarks/parallel_training.py`,
# BENCHMARKS.md "Ablations"). The threshold stays well under 1.6 because each process holds its own copy of the
# model, data and optimizer state.
PARALLEL_TRAINING_BELOW_GFLOPS = 0.5


# ----------------------------------------------------------------------------------------- what this CPU has
# The matmul units that decide precision on a CPU. bf16 pays only with bf16 units (AMX tiles or AVX512-BF16);
# without them oneDNN converts to fp32 and back, so bf16 runs slower than fp32. int8 dot products (VNNI) make
# quantised matmuls pay on CPUs that have no bf16 units.
CPU_UNIT_NAMES = ("avx2", "avx512", "vnni", "avx512_bf16", "amx")


@dataclass(frozen=True)
class CpuUnits:
    """The vector and matrix units of this CPU that vitlab's choices depend on."""

    avx2: bool = False
    avx512: bool = False
    vnni: bool = False  # int8 dot products: AVX512-VNNI or AVX-VNNI
    avx512_bf16: bool = False
    amx: bool = False  # AMX tiles with bf16 and int8 (Sapphire Rapids and later)
    simulated: bool = False  # set from VITLAB_CPU_UNITS, not probed

    @property
    def bf16(self) -> bool:
        return self.avx512_bf16 or self.amx

    @property
    def int8(self) -> bool:
        return self.vnni or self.amx

    def describe(self) -> str:
        """e.g. "AVX2, AVX-512, VNNI, AVX512-BF16, AMX" or "AVX2 (no VNNI, no bf16 units)"."""
        labels = {"avx2": "AVX2", "avx512": "AVX-512", "vnni": "VNNI", "avx512_bf16": "AVX512-BF16", "amx": "AMX"}
        names = [label for key, label in labels.items() if getattr(self, key)] or ["no AVX2"]
        missing = [text for text, present in (("no VNNI", self.int8), ("no bf16 units", self.bf16)) if not present]
        text = ", ".join(names) + (f" ({', '.join(missing)})" if missing else "")
        return text + (" [simulated by VITLAB_CPU_UNITS]" if self.simulated else "")


def cpu_units() -> CpuUnits:
    """The units of this CPU, from PyTorch's own probe (`torch.cpu.get_capabilities`, the CPUID bits its kernels
    dispatch on), else /proc/cpuinfo's flags. VITLAB_CPU_UNITS="avx2,vnni" (names from CPU_UNIT_NAMES, or "none")
    simulates another CPU: what `auto` would choose there, and the tests of those choices."""
    simulated = read_variable("VITLAB_CPU_UNITS")
    if simulated is not None:
        names = {name.strip().lower() for name in simulated.split(",") if name.strip()} - {"none"}
        unknown = names - set(CPU_UNIT_NAMES)
        if unknown:
            raise UsageError(
                f"VITLAB_CPU_UNITS names unknown units {', '.join(sorted(unknown))}; use a "
                f"comma-separated subset of {', '.join(CPU_UNIT_NAMES)}, or none"
            )
        return CpuUnits(**{name: name in names for name in CPU_UNIT_NAMES}, simulated=True)
    return _probed_cpu_units()


@functools.lru_cache(maxsize=1)
def _probed_cpu_units() -> CpuUnits:
    import torch

    capabilities: dict[str, object] = {}
    try:
        capabilities = dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):  # an older PyTorch, or not x86
        flags = set(cpuinfo().get("flags", "").split())
        if flags:
            capabilities = {
                "avx2": "avx2" in flags,
                "avx512_f": "avx512f" in flags,
                "avx512_vnni": "avx512_vnni" in flags,
                "avx_vnni": "avx_vnni" in flags,
                "avx512_bf16": "avx512_bf16" in flags,
                "amx_bf16": "amx_bf16" in flags,
            }
    has = lambda key: bool(capabilities.get(key, False))  # noqa: E731
    return CpuUnits(
        avx2=has("avx2"),
        avx512=has("avx512_f"),
        vnni=has("avx512_vnni") or has("avx_vnni"),
        avx512_bf16=has("avx512_bf16"),
        amx=has("amx_bf16"),
    )


def int8_saturates() -> bool:
    """True on a CPU without int8 dot-product units (VNNI or AMX). There oneDNN and ONNX Runtime multiply uint8 by
    int8 with `vpmaddubsw`, which adds two products into a saturating int16: 255 * 127 * 2 overflows it, so full-range
    int8 operands give wrong sums (measured on an AVX2 AMD EPYC: ONNX Runtime's int8 logits 7x further from fp32
    than with 7-bit operands, and a oneDNN int8 matmul off by up to 107 of 255). Quantizers must then keep one operand
    to 7 bits (`reduce_range`), which cannot overflow: 255 * 64 * 2 and 127 * 128 * 2 are below 32,767."""
    return not cpu_units().int8


# -------------------------------------------------------------------------------------------------- devices
def resolve_device(requested: str | None = None):
    """The torch.device a command runs on: "auto" (or None) takes the GPU when PyTorch sees one, else the CPU;
    "cpu", "cuda", "cuda:N" as said, refused in one line when there is no such GPU."""
    import torch

    text = (requested or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(
            f"--device {requested}: not a device; use cpu, cuda or cuda:N (default: a GPU when there is one)"
        ) from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UsageError(f"--device {requested}: vitlab runs on cpu or cuda (cuda:N); use one of those")
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built for CUDA {torch.version.cuda}, but no GPU or driver is visible"
        )
        raise UsageError(
            f"--device {requested}: PyTorch sees no CUDA GPU here (torch {torch.__version__}, {build}); "
            "use --device cpu, or install a CUDA build of PyTorch on a machine with an NVIDIA GPU"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {requested}: this machine has {torch.cuda.device_count()} GPU(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return torch.device("cuda", index)


# ------------------------------------------------------------------------------------------------ precision
# Below this many forward GFLOPs per image `auto` keeps fp32 even with bf16 units: the model's matmuls are too
# small for bf16 to pay for its conversions. Measured on a 2-core Xeon with AMX (`vitlab bench --train --model M
# --batch-size 128 --paths eager-fp32,autocast-bf16` and the inference paths eager-fp32,eager-bf16 at batch 32):
# digits-8 (0.005 GFLOPs) trains at 0.95x and infers at 0.89x in bf16; mnist-28 (0.028) at 1.39x and 1.29x;
# S/16 at 224 infers at 3.9x.
BF16_ABOVE_GFLOPS = 0.01

# A measured bf16 (int8) matmul peak at least this many times the fp32 one makes bf16 (int8) pay on a CPU whose
# flags do not say so (`vitlab bench` caches the peaks it measures per CPU).
MEASURED_GAIN_TO_SWITCH = 1.25

PRECISIONS = ("auto", "fp32", "bf16", "int8")


@dataclass(frozen=True)
class Choice:
    """A setting and why it was taken, for the run summary and the start lines."""

    value: str
    reason: str

    def __str__(self) -> str:
        return f"{self.value} ({self.reason})"


# The paths of `vitlab bench` that run each precision as `predict` and `serve` would (the fastest stands for it).
AUTO_PATHS = {"fp32": ("eager-fp32",), "bf16": ("eager-bf16",), "int8": ("onnx-int8", "torch-int8")}


def choice_from_path_speeds(purpose: str, gflops_per_image: float) -> Choice | None:
    """The precision whose path ran fastest on this machine for the measured model nearest in size
    (`path_speeds`): fp32 or bf16 for "inference", int8 too for "serve"; None without a record that measured two
    of them."""
    record = path_speeds(gflops_per_image)
    if record is None:
        return None
    speeds = record["speed_vs_eager_fp32"]
    best = {}
    for precision in ("fp32", "bf16", "int8") if purpose == "serve" else ("fp32", "bf16"):
        measured = [(speeds[path], path) for path in AUTO_PATHS[precision] if path in speeds]
        if measured:
            best[precision] = max(measured)
    if "fp32" not in best or len(best) < 2:
        return None
    winner = max(best, key=lambda precision: best[precision][0])  # fp32 first: it keeps a tie
    base = best["fp32"][0]
    figures = ", ".join(f"{path} {speed / base:.2f}x" for speed, path in sorted(best.values(), reverse=True))
    return Choice(
        winner,
        f"measured on this CPU against eager fp32: {figures} ({record['model']}, batch {record['batch_size']}, "
        f"{record['source']})",
    )


def choose_precision(requested: str, device, gflops_per_image: float, purpose: str = "inference") -> Choice:
    """The precision to run a model of `gflops_per_image` (forward) in on `device`.

    purpose: "train" (fp32 or bf16 autocast, fp32 master weights), "inference" (fp32 or bf16: eval and predict,
    where the answers should be the model's own, so never quantised unless asked) or "serve" (fp32, bf16 or int8
    weights: throughput first, so int8 on a CPU without bf16 units: its int8 dot products (VNNI), or AVX2's
    int8 multiply-adds, run faster than fp32). An explicit precision always wins."""
    import torch

    if requested != "auto":
        return Choice(requested, "as asked")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Choice("bf16", f"{torch.cuda.get_device_name(device)} has bf16 tensor cores")
        return Choice("fp32", f"{torch.cuda.get_device_name(device)} has no bf16 support")
    if device.type != "cpu":
        return Choice("fp32", f"no automatic mixed precision chosen on {device.type}")
    if gflops_per_image < BF16_ABOVE_GFLOPS:
        return Choice(
            "fp32",
            f"a small model ({gflops_per_image:.3g} GFLOPs per image): its matmuls are too small for bf16 to pay",
        )
    if purpose != "train":  # a whole model measured here outranks matmul peaks, and those outrank the flags
        measured_paths = choice_from_path_speeds(purpose, gflops_per_image)
        if measured_paths is not None:
            return measured_paths
    units = cpu_units()
    measured = measured_peaks()
    fp32_peak = measured.get("fp32")
    if fp32_peak and "bf16" in measured:
        gain = measured["bf16"] / fp32_peak
        if gain >= MEASURED_GAIN_TO_SWITCH:
            return Choice("bf16", f"bf16 matmuls measured {gain:.1f}x fp32 on this CPU (vitlab bench)")
    elif units.bf16:
        return Choice("bf16", f"this CPU has bf16 matmul units ({units.describe()})")
    if purpose == "serve":
        if fp32_peak and "int8" in measured:
            gain = measured["int8"] / fp32_peak
            if gain >= MEASURED_GAIN_TO_SWITCH:
                return Choice("int8", f"int8 matmuls measured {gain:.1f}x fp32 on this CPU (vitlab bench)")
        elif units.int8:
            return Choice("int8", f"this CPU has int8 dot-product units and no bf16 units ({units.describe()})")
        elif units.avx2:
            return Choice(
                "int8",
                f"AVX2's int8 multiply-adds run at about twice its fp32 rate ({units.describe()}; "
                "2.1x measured on an AVX2 AMD EPYC), with 7-bit operands that cannot saturate",
            )
    if fp32_peak and "bf16" in measured:
        return Choice(
            "fp32", f"bf16 matmuls measured only {measured['bf16'] / fp32_peak:.1f}x fp32 on this CPU (vitlab bench)"
        )
    return Choice("fp32", f"no bf16 matmul units on this CPU ({units.describe()}): bf16 would run slower")


# ------------------------------------------------------------------------------- measurements, per CPU
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("vendor_id", "cpu family", "model", "cpu MHz", ...); {}
    where there is no such file."""
    fields: dict[str, str] = {}
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, e.g. "AMD EPYC"; elsewhere what `platform` says."""
    import platform

    return cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


def fp32_flops_per_cycle(vendor: str, family: int, model: int, units: CpuUnits) -> tuple[str, int] | None:
    """(core family, fp32 FLOPs per cycle per core of its vector FMA units, a multiply-add counted as 2): what the
    ISA flags alone cannot tell (Zen 4 runs AVX-512 on two 256-bit pipes, Zen 5 on two 512-bit ones); None for a
    core not listed here."""
    if vendor == "AuthenticAMD":
        if family == 23:
            return ("Zen", 16) if model < 0x30 else ("Zen 2", 32)  # two 128-bit, then two 256-bit FMA pipes
        if family == 25:
            zen4 = 0x10 <= model < 0x20 or 0x60 <= model < 0x80 or 0xA0 <= model < 0xB0
            return ("Zen 4", 32) if zen4 else ("Zen 3", 32)
        if family == 26:
            return "Zen 5", 64
    if vendor == "GenuineIntel" and family == 6:
        return ("Intel with AVX-512", 64) if units.avx512 else ("Intel with AVX2", 32)  # two FMA units (Xeon)
    return None


def theoretical_peaks(threads: int) -> dict | None:
    """What `threads` cores' vector units can do at the clock the OS reports: {"fp32", "bf16", "int8" (GFLOP/s,
    GOP/s for int8), "how"}, or None where the core or its clock cannot be read. bf16 dot products (AVX512-BF16)
    do twice fp32's FLOPs per cycle, AMX 1024 bf16 FLOPs and 2048 int8 operations per cycle per core; int8 dot
    products (VNNI) four times fp32's operations, AVX2's multiply-adds twice. The clock is the one /proc/cpuinfo
    shows, in a VM often the base clock: cores that boost run above it, so a measured peak can exceed this."""
    info = cpuinfo()
    units = cpu_units()
    try:
        core = fp32_flops_per_cycle(info["vendor_id"], int(info["cpu family"]), int(info["model"]), units)
        gigahertz = float(info["cpu MHz"]) / 1000
    except (KeyError, ValueError):
        return None
    if core is None or gigahertz <= 0 or units.simulated:
        return None
    name, per_cycle = core
    scale = threads * gigahertz
    peaks = {"fp32": per_cycle * scale}
    if units.amx:
        peaks.update(bf16=1024 * scale, int8=2048 * scale)
    else:
        if units.avx512_bf16:
            peaks["bf16"] = 2 * per_cycle * scale
        peaks["int8"] = (4 if units.vnni else 2) * per_cycle * scale
    how = f"{name}: {per_cycle} fp32 FLOPs per cycle per core x {threads} cores x {gigahertz:.2f} GHz as the OS reports"
    return {**{key: round(value, 1) for key, value in peaks.items()}, "how": how}


def machine_key() -> str:
    """This CPU's name and units (simulated ones where VITLAB_CPU_UNITS says): measurements are kept per key, so a
    cache shared between machines (a home folder on a cluster) keeps each one's own, and a simulated CPU kind
    never reads the real one's."""
    return f"{cpu_name()} | {cpu_units().describe()} | {available_cores()} cores"


def _measurements_file(name: str):
    return cache_dir() / "machine" / f"{name}.json"


def read_measurements(name: str) -> dict:
    """What was measured and kept under `name` on this machine (`machine_key`); {} where nothing was."""
    import json

    try:
        found = json.loads(_measurements_file(name).read_text()).get(machine_key(), {})
    except (OSError, ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def update_measurements(name: str, update: Callable[[dict], dict]) -> dict:
    """Apply `update` to what is kept under `name` for this machine and keep its result, beside other machines'.
    The read and the write hold a lock, so two processes measuring at once (two runs, a bench beside a serve)
    both keep theirs; the file is replaced atomically. Returns the result, also where the cache is read-only (it
    then keeps nothing, and the callers measure again next time)."""
    import json

    path = _measurements_file(name)
    with contextlib.ExitStack() as held:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(exclusive_lock(path.with_suffix(".lock")))
        except OSError:  # a read-only cache
            return update(read_measurements(name))
        try:
            known = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            known = {}
        mine = known.get(machine_key())
        mine = mine if isinstance(mine, dict) else {}
        known[machine_key()] = values = update(mine)
        if values != mine:
            try:
                atomic_write_bytes(path, json.dumps(known, indent=1).encode())
            except OSError:
                pass
        return values


def libraries_key() -> str:
    """The library versions measured speeds hold for: torch's, ONNX Runtime's and torchao's kernels decide them."""
    import importlib.metadata

    versions = []
    for package in ("torch", "onnxruntime", "torchao"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} none")
    return ", ".join(versions)


def path_speeds_key(threads: int | None = None) -> str:
    """What path speeds hold for besides the machine: the library versions and the thread count they ran on."""
    import torch

    return f"{libraries_key()} | {threads or torch.get_num_threads()} threads"


def path_speeds(
    gflops_per_image: float | None = None, measuring: Collection[str] = (), batch_size: int | None = None
) -> dict | None:
    """The inference paths measured on this machine with these libraries and threads (`vitlab bench`, or the
    advice's calibration), for the measured model nearest in size to one of `gflops_per_image` (forward), else the
    latest measured: {"model", "image_size", "batch_size", "gflops_per_image", "speed_vs_eager_fp32": {path:
    ratio}, "source", "date", "measured_at"}, or None. measuring: only the records that measured one of these
    paths (the export advice's formats: a bench of two paths on a small model says nothing of them). batch_size:
    of the records of that model, the one measured at the batch nearest to it (`serve` asks for 1: the order of
    the paths differs between batch 1 and 16, BENCHMARKS.md "Batch 1")."""
    import math

    records = [
        record
        for record in read_measurements("paths").get(path_speeds_key(), {}).values()
        if isinstance(record, dict)
        and record.get("speed_vs_eager_fp32")  # a calibration that timed nothing keeps only what it could not
        and (not measuring or any(path in record["speed_vs_eager_fp32"] for path in measuring))
    ]
    if not records:
        return None

    def batch_distance(record: dict) -> float:
        return abs(math.log(record["batch_size"] / batch_size)) if batch_size else 0.0

    if gflops_per_image is None or gflops_per_image <= 0:
        return max(records, key=lambda record: (-batch_distance(record), record["measured_at"]))
    return min(
        records,
        key=lambda record: (abs(math.log(record["gflops_per_image"] / gflops_per_image)), batch_distance(record)),
    )


def measured_peaks() -> dict[str, float]:
    """The matmul peaks (GFLOP/s per precision) `vitlab bench` last measured on this CPU; {} when none were."""
    return {name: float(value) for name, value in read_measurements("peaks").items()}


def record_peaks(peaks: dict[str, float]) -> None:
    """Keep the peaks `vitlab bench` measured on this CPU, for `auto` on CPUs whose flags do not tell."""
    update_measurements("peaks", lambda _: {name: float(value) for name, value in peaks.items()})
