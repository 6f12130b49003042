"""Timing that survives a shared, noisy machine: every candidate is timed in each round, in a rotating order, so
a slow spell hits all of them alike; the median over rounds is reported, and ratios are taken within one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from vitlab.progress import progress


def calls_per_sample(run: Callable[[], Any], min_seconds: float) -> int:
    """How many back-to-back calls make one timed sample last at least `min_seconds` (1 for slow calls): tiny
    models finish a batch in a few milliseconds, below the resolution of a noisy machine."""
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    return max(1, int(min_seconds / max(elapsed, 1e-6)) + 1) if elapsed < min_seconds else 1


# A runtime's worker threads go on spinning after a call returns, waiting for the next: ONNX Runtime's burn about
# 34 ms of a core, PyTorch's OpenMP threads about 10 ms, OpenVINO's about 1 ms (measured on a 2-core AMD EPYC Zen 5
# with the MNIST recipe's model). Timed straight after, the next candidate in the rotation loses that core: the
# MNIST model's OpenVINO int8 path ran 12,000-14,700 images/s timed after its ONNX Runtime path and 15,300-16,800
# with the spinning waited out. So each sample starts once this process has been idle for one window.
IDLE_WINDOW_SECONDS = 0.005
IDLE_CPU_FRACTION = 0.2  # of one core, over the window: a parked thread pool burns next to nothing
SETTLE_AT_MOST_SECONDS = 0.2


def settle(window: float = IDLE_WINDOW_SECONDS, at_most: float = SETTLE_AT_MOST_SECONDS) -> int:
    """Wait until this process's threads have stopped burning CPU (the last call's runtime parked its workers):
    one `window` in which all its threads together used under IDLE_CPU_FRACTION of a core, or `at_most` seconds.
    Returns the windows waited."""
    windows = 0
    while windows * window < at_most:
        used = time.process_time()
        time.sleep(window)
        windows += 1
        if time.process_time() - used < IDLE_CPU_FRACTION * window:
            break
    return windows


def time_interleaved(
    candidates: dict[str, Callable[[], Any]],
    repetitions: int = 5,
    warmup: int = 2,
    min_sample_seconds: float = 0.2,
    show: bool = False,
    rounds: dict[str, int] | None = None,
    inner: dict[str, int] | None = None,
) -> dict[str, dict[str, float]]:
    """Seconds per call of each candidate: {"median", "min", "max", "samples", "calls_per_sample"}.

    Each candidate is first called `warmup` times (compilation, allocator and thread-pool warm-up); then
    `repetitions` rounds time every candidate once each, the order rotating by one per round, each sample starting
    once the calls before have stopped spinning (`settle`). `rounds` gives a candidate fewer rounds (its time
    budget: it sits out the later ones); `inner` its calls per sample, where the caller measured them already
    (default `calls_per_sample`). With `show`, a progress bar (a terminal) or progress lines (a log) on stderr say
    where it is.
    """
    names = list(candidates)
    rounds = {name: min(repetitions, (rounds or {}).get(name, repetitions)) for name in names}
    bar = None
    # Steps: each path's warm-up (where there is one), then each path's rounds. Without warm-up calls there is no
    # warm-up step: counting those instant steps made the first rate read 657,808 steps/s.
    warming = names if warmup > 0 else []
    if show:
        bar = progress(len(warming) + sum(rounds.values()), "timing (warm-up, then rounds)", unit="step", min_total=1)
    for name in warming:
        for _ in range(warmup):
            candidates[name]()
        if bar is not None:
            bar.update(1)
    inner = {name: (inner or {}).get(name) or calls_per_sample(candidates[name], min_sample_seconds) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repetitions):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if round_index >= rounds[name]:
                continue
            run, count = candidates[name], inner[name]
            settle()
            start = time.perf_counter()
            for _ in range(count):
                run()
            samples[name].append((time.perf_counter() - start) / count)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return {
        name: {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "samples": len(values),
            "calls_per_sample": inner[name],
        }
        for name, values in samples.items()
    }
