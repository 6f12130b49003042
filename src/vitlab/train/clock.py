"""The run's time and its stop: `RunClock` (wall time over all of a run's sittings, and the time left),
`seconds_since_launch` (what a budget counts from), `StopFlag` (SIGINT / SIGTERM turned into a request the
loop answers between steps) and `PeriodicSave` (when `save_every` saves within an epoch)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any


class StopFlag:
    """Set by SIGINT / SIGTERM so the loop can save and leave between steps; a second Ctrl-C aborts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None  # the first stop signal received: SIGINT (Ctrl-C) exits 130, SIGTERM 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[sig] = signal.signal(sig, self.handle)
                # The handler only sets a flag, so let interrupted system calls restart (SA_RESTART): a signal
                # arriving inside a gloo/NCCL collective must not fail it with EINTR.
                signal.siginterrupt(sig, False)
            except ValueError:  # not the main thread (e.g. called from a worker thread): no handlers
                pass
        return self

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal = self.signal or signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class RunClock:
    """Wall time of a run over all its sessions, and an estimate of the time left from this session's pace
    (training steps with evaluation amortised in, once an epoch has ended)."""

    def __init__(self, elapsed_before: float, steps_done: int, total_steps: int) -> None:
        self.started = time.perf_counter()
        self.elapsed_before = elapsed_before
        self.steps_at_start = steps_done
        self.total_steps = total_steps
        self.paced_from: tuple[float, int] | None = None  # (time, steps done) once the warm-up steps are over

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    # Steps of this session left out of the pace: the first ones carry one-off costs (kernel selection, compiling,
    # the allocator's first requests, the first batches' decoding), which once made a one-minute run's first epoch
    # print "34m59s left".
    WARMUP_STEPS = 3

    def remaining(self, steps_done: int) -> float | None:
        """Seconds left at this session's pace since its warm-up steps; None (shown "?") until that pace exists."""
        done_here = steps_done - self.steps_at_start
        if done_here < self.WARMUP_STEPS:
            return None
        if self.paced_from is None:
            self.paced_from = (time.perf_counter(), steps_done)
            return None
        started, first = self.paced_from
        if steps_done <= first:
            return None
        return (time.perf_counter() - started) / (steps_done - first) * (self.total_steps - steps_done)


def seconds_since_launch() -> float:
    """How long this process has run (Python's start and imports included), for a budget that counts from the
    launch; 0 where the OS does not say (then it counts from the call of `train`)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class PeriodicSave:
    """When to save the training state within an epoch (`save_every`): every N optimizer steps of the run (at
    multiples of N, so a resumed run saves where the uninterrupted one did) or every so many seconds since the
    last save of this sitting (the epoch's own save included)."""

    def __init__(self, interval: tuple[str, float] | None) -> None:
        self.interval = interval
        self.last_saved = time.perf_counter()

    def due(self, global_step: int) -> bool:
        if self.interval is None:
            return False
        kind, every = self.interval
        if kind == "steps":
            return global_step % int(every) == 0
        return time.perf_counter() - self.last_saved >= every

    def at_step(self, global_step: int) -> bool:
        """Due by its step count at `global_step`: known alike on every rank without asking the others."""
        return self.interval is not None and self.interval[0] == "steps" and self.due(global_step)

    def saved(self) -> None:
        self.last_saved = time.perf_counter()
