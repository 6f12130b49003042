"""The CPU vitlab runs on: how many cores this process may use, and the measured crossovers (sequence length, model
size) at which another way of using them becomes faster.

Each decision has one constant here, with the measurement behind it, so that train, serve, ablate and bench agree.
Two pairs look alike but are different decisions, measured separately, and so keep separate names and values:
the explicit attention kernel for eager fp32 training steps (32 tokens) and for compiled bf16 inference (64);
one intra-op thread for a served model (0.1 GFLOPs) and one training process per core in an ablation (0.5).
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The number of cores this process may run on: its CPU affinity where the OS keeps one (Linux: `taskset`,
    a cgroup cpuset, a batch scheduler's allocation), else every core of the machine. `os.cpu_count()` alone
    counts the machine's cores, so a job pinned to 4 of 64 would start 64 threads and fight over 4."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


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
