"""Which fp32 matmul kernel a model's linear layers run on this CPU, chosen by measurement.

PyTorch's CPU build sends an fp32 linear to MKL; oneDNN's linear with a pre-packed weight computes the same
product and is faster on some CPUs and slower on others (measured on B/16's MLP shape, 2 threads: 1.9x MKL on a
Zen 5 EPYC, 1.1-1.2x on a Zen 4). No table of CPU kinds can say which, so the first run of a model shape on a
machine times both on that shape (about a second at B/16) and keeps the figures per machine, torch version and
shape (`hardware.read_measurements("fp32_kernels")`); later runs read them. VITLAB_FP32_KERNEL=torch or onednn
overrides the measurement.

Inference and training are measured apart: without gradients oneDNN's weight is packed once; with them it runs
on the plain weight every step, which can lose where packing wins.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitlab.environment import read_variable
from vitlab.errors import UsageError
from vitlab.hardware import Choice, update_measurements
from vitlab.layers.onednn_linear import FP32_KERNELS, OneDNNLinearFunction, onednn_available, onednn_linear
from vitlab.timing import time_interleaved

OVERRIDE = "VITLAB_FP32_KERNEL"
KERNEL_TITLES = {"torch": "torch's GEMM", "onednn": "oneDNN's linear"}
PURPOSES = ("inference", "train")

# oneDNN is taken only when it measured at least this much faster: a smaller edge is within this machine's
# run-to-run noise, and torch's kernel is the one every other PyTorch user runs.
MIN_GAIN = 1.05

# The timed product has at most this many rows (tokens x images): enough to reach the kernels' steady rate, and a
# B/16 calibration stays near a second.
MAX_ROWS = 4096


def requested_kernel() -> str | None:
    """VITLAB_FP32_KERNEL's kernel, or None where it is unset or "auto"."""
    value = (read_variable(OVERRIDE) or "auto").strip().lower()
    if value == "auto":
        return None
    if value not in FP32_KERNELS:
        raise UsageError(f"{OVERRIDE}={value!r}: use one of auto, {', '.join(FP32_KERNELS)}")
    return value


def timed_rows(rows: int) -> int:
    """The rows a measurement times and is kept under: rounded up to a power of two (so batch sizes near each other
    share one), at most MAX_ROWS."""
    return 1 << max(0, min(rows, MAX_ROWS) - 1).bit_length()


def shape_key(purpose: str, rows: int, inner: int, outer: int) -> str:
    """The cache key of one measurement."""
    return f"torch {torch.__version__} | {torch.get_num_threads()} threads | {purpose} | {timed_rows(rows)}x{inner}x{outer}"


def measure_fp32_kernels(purpose: str, rows: int, inner: int, outer: int) -> dict[str, float]:
    """GFLOP/s of torch's and oneDNN's fp32 linear, (rows, inner) by a weight (outer, inner) with a bias, timed in
    one interleaved run on this process's threads. "train" times the forward and backward (3 products)."""
    rows = timed_rows(rows)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(outer, inner, generator=generator)
    bias = torch.randn(outer, generator=generator)
    x = torch.randn(rows, inner, generator=generator)
    if purpose == "inference":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        flops = 2 * rows * inner * outer / 1e9
        candidates = {
            "torch": lambda: F.linear(x, weight, bias),
            "onednn": lambda: onednn_linear(x, packed, bias),
        }
    else:
        weight.requires_grad_(True)
        x.requires_grad_(True)
        grad = torch.randn(rows, outer, generator=generator)
        flops = 3 * 2 * rows * inner * outer / 1e9

        def train_step(linear) -> None:
            linear(x, weight, bias).backward(grad)
            x.grad = weight.grad = None

        candidates = {
            "torch": lambda: train_step(F.linear),
            "onednn": lambda: train_step(OneDNNLinearFunction.apply),
        }
    timings = time_interleaved(candidates, repetitions=3, warmup=1, min_sample_seconds=0.05)
    return {name: round(flops / timing["median"], 1) for name, timing in timings.items()}


def fp32_kernel_choice(purpose: str, rows: int, inner: int, outer: int) -> Choice:
    """The fp32 kernel ("torch" or "onednn") for linear layers of this shape on this machine, and why: the
    override, else the kept measurement, else one made now (and kept)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    asked = requested_kernel()
    if asked is not None:
        return Choice(asked, f"as {OVERRIDE} asks")
    if not onednn_available():
        return Choice("torch", "this PyTorch has no oneDNN linear")
    key = shape_key(purpose, rows, inner, outer)
    fresh = False

    def measured(known: dict) -> dict:
        nonlocal fresh
        if key in known:
            return known
        fresh = True  # measured under the measurements' lock: two processes starting together measure once
        return {**known, key: measure_fp32_kernels(purpose, rows, inner, outer)}

    rates = update_measurements("fp32_kernels", measured)[key]
    gain = rates["onednn"] / rates["torch"]
    how = "measured now" if fresh else "measured earlier"
    shape = f"{inner}x{outer}"
    if gain >= MIN_GAIN:
        return Choice("onednn", f"oneDNN's linear {gain:.2f}x torch's at {shape} on this CPU ({how})")
    return Choice("torch", f"oneDNN's linear {gain:.2f}x torch's at {shape} on this CPU ({how})")


def describe_kernel(kernel: Choice) -> str:
    """ "linear layers on oneDNN's linear: <why>": what a run's precision line adds about its fp32 kernel."""
    return f"linear layers on {KERNEL_TITLES[kernel.value]}: {kernel.reason}"


def model_fp32_kernel(config, purpose: str, batch_size: int) -> Choice:
    """`fp32_kernel_choice` on the model's biggest linear, its MLP's first layer, at this batch size."""
    return fp32_kernel_choice(purpose, batch_size * config.num_tokens, config.embed_dim, config.mlp_dim)
