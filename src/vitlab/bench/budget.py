"""Time budgets for `vitlab bench`: a path that cannot be prepared and timed within its budget is reported as such
instead of holding the table back (on an AVX2 CPU one bf16 matmul of B/16's MLP shape takes 15 s; a full bench
there once ran past 16 minutes without a table)."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Iterator


class OverBudget(BaseException):
    """Raised inside the budgeted code when its time is up. A BaseException, as KeyboardInterrupt is, so the paths'
    own `except Exception` (which turn a compiler's failure into "unavailable") cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Interrupt the block with OverBudget after `seconds` (SIGALRM: the main thread of a Unix process; one long call
    into C++, such as a single matmul, ends before the interruption is seen). Elsewhere, or with None, the block
    runs to its end and the caller compares the time it took."""
    usable = (
        seconds is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum, frame):  # noqa: ARG001 - the signal handler's signature
        raise OverBudget()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def rounds_within(
    budget_left: float, seconds_per_call: float, calls_per_sample: int, warmup_calls: int, repetitions: int
) -> int:
    """How many of `repetitions` timed rounds fit in what is left of a budget after the remaining warm-up calls;
    at least 1, since a path that finished a call within its budget gets a figure."""
    per_round = max(seconds_per_call * calls_per_sample, 1e-9)
    fitting = math.floor((budget_left - warmup_calls * seconds_per_call) / per_round)
    return max(1, min(repetitions, fitting))
