"""Seams where a test reaches into a running training loop, and nothing else does: each is a module attribute the
loop calls, a no-op unless a test sets it. A test in the same process assigns it (pytest's monkeypatch); a test
that runs `torchrun` starts tests/faulty_vitlab.py instead of `-m vitlab`, which sets it in every worker and then
runs the CLI.

`after_step` is called on every rank after each optimizer step, where the fault tests kill, stop or damage a rank
(tests/train/test_elastic.py) and where the "faults survived" figures of BENCHMARKS.md were injected."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AfterStep:
    """Where a rank stands after an optimizer step."""

    rank: int
    global_step: int  # optimizer steps of the run so far, this one included
    run: Any  # the run folder (vitlab.runs.RunFolder), whose saved state a fault may damage
    report_progress: Callable[[], None]  # tell the heartbeat where this rank is now (a hang named at once)


def no_fault(point: AfterStep) -> None:
    """The default `after_step`: nothing happens."""


after_step: Callable[[AfterStep], None] = no_fault
