"""A hung rank is found, not waited on.

Every collective gives up after the run's `collective_timeout` (`vitlab.distributed.init_distributed`). To say
which rank hung and what it was doing, each rank reports its step and phase to the process group's key-value store
(the one torchrun's agent keeps) from a thread, on every change and once a second: the main loop only sets two
attributes and wakes the thread, so a step costs next to nothing. A rank that is stopped or dead stops reporting (its report ages); a rank stuck in its own work (a
data loader that never returns) keeps reporting an older step than the others. When a collective times out, the
ranks still running read every report, name the rank that fell behind, and exit with an error, which torchrun's
agent (`--max-restarts`) answers by restarting the group from the last saved state (`vitlab.train.elastic`).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from vitlab.distributed import DistEnv, session_key
from vitlab.messages import say

REPORT_SECONDS = 1.0  # a report at least this often, so its age tells a stopped rank from a busy one
MIN_REPORT_SECONDS = 0.2  # and at most five a second, however fast the steps: the store serves every rank
# Phases in which a rank waits for the others in a collective; a rank in any other phase while they wait is the
# one they wait for.
WAITING_PHASES = {"training step", "after its step"}


def key(rank: int) -> str:
    return session_key(f"heartbeat/{rank}")


class Heartbeat:
    """This rank's step and phase ("loading data", "training step", "validation", "saving state", ...), reported to
    the store once a second while the run lasts (a context manager); inert on one process."""

    def __init__(self, env: DistEnv, timeout_seconds: float = 0.0) -> None:
        self.env = env
        self.timeout_seconds = timeout_seconds  # > 0: say who hung where the collective's own error never comes
        self.changed_at = time.time()
        self.step = 0
        self.phase = "starting"
        self.store: Any = None
        if env.enabled:
            try:
                self.store = dist.distributed_c10d._get_default_store()
            except (AttributeError, RuntimeError, ValueError):  # another PyTorch: no reports, the timeout still works
                self.store = None
        self._done = threading.Event()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def at(self, phase: str, step: int | None = None) -> None:
        """Where this rank is now: two attribute writes and a wake-up of the reporting thread, which sends them."""
        self.phase = phase
        if step is not None:
            self.step = step
        self.changed_at = time.time()
        self._changed.set()

    def __enter__(self) -> Heartbeat:
        if self.store is not None:
            self.report()
            # No daemon: the interpreter waits for it before it finalizes. A daemon thread inside a store call (C++,
            # the GIL released) as the interpreter finalizes is ended there by force, and C++ aborts the process
            # ("terminate called without an active exception", exit -6): a rank of a finished run failed so when
            # the wait in __exit__ ran out during a slow report.
            self._thread = threading.Thread(target=self._run, name="vitlab-heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._changed.set()
        if self._thread is not None:  # a report still under way after this wait ends before the interpreter exits
            self._thread.join(timeout=2 * REPORT_SECONDS)
        self.store = None  # the process group's store goes with the group

    def _run(self) -> None:
        # On every change (coalesced while a report is under way), and once a second regardless: a report's age
        # then tells a rank that is stopped or dead from one that is alive but behind.
        warned = False
        while not self._done.is_set():
            self._changed.wait(REPORT_SECONDS)
            self._changed.clear()
            self.report()
            stalled = time.time() - self.changed_at
            if self.timeout_seconds and not warned and stalled > 0.9 * self.timeout_seconds:
                # NCCL's watchdog ends the process at the timeout without an error this rank's loop could catch
                # (gloo raises one, which `vitlab.train.loop.train` turns into the same message): say it first.
                warned = True
                say(f"vitlab: rank {self.env.rank} waited {stalled:.0f} s: {self.stuck_message()}")
            self._done.wait(MIN_REPORT_SECONDS)

    def report(self) -> None:
        try:
            report = {"step": self.step, "phase": self.phase, "time": time.time()}
            self.store.set(key(self.env.rank), json.dumps(report))
        except Exception:  # noqa: BLE001 - the store's host may be gone (the agent stopping us); reports are best effort
            pass

    def reports(self) -> dict[int, dict[str, Any]]:
        """Every rank's last report that can be read ({} without a store)."""
        if self.store is None:
            return {}
        try:
            self.store.set_timeout(timedelta(seconds=5))  # a lost store host must not hang the exit as well
        except (AttributeError, RuntimeError):
            pass
        found = {}
        for rank in range(self.env.world_size):
            try:
                if self.store.check([key(rank)]):
                    found[rank] = json.loads(self.store.get(key(rank)))
            except Exception:  # noqa: BLE001
                continue
        return found

    def stuck_message(self) -> str:
        """Which rank hung and what it was doing, from every rank's last report, for the error this rank exits with."""
        return describe_stuck(self.reports(), self.env.rank, self.env.world_size, self.timeout_seconds, time.time())


def describe_stuck(
    reports: dict[int, dict[str, Any]], me: int, world_size: int, timeout_seconds: float, now: float
) -> str:
    """The message of a collective timeout: the rank the others wait for (the fewest steps; among equals, one not
    waiting in a collective itself, i.e. stuck in its own work; then the one silent longest, i.e. stopped or dead),
    its last step and phase, and what to do."""
    waited = f"a collective waited {timeout_seconds:.0f} s (collective_timeout) on rank {me}"
    silent = [rank for rank in range(world_size) if rank not in reports]
    if not reports:
        return f"{waited}; no rank's progress could be read, so the rank that hung is not known"
    if silent:
        culprit, what = silent[0], "never reported its progress"
    else:
        culprit = min(
            reports,
            key=lambda rank: (
                reports[rank]["step"],
                reports[rank]["phase"] in WAITING_PHASES,
                reports[rank]["time"],
            ),
        )
        report = reports[culprit]
        what = (
            f"was at step {report['step']} ({report['phase']}) when last heard from, {now - report['time']:.0f} s ago"
        )
    others = ", ".join(
        f"rank {rank} at step {report['step']} ({report['phase']})"
        for rank, report in sorted(reports.items())
        if rank != culprit
    )
    return (
        f"rank {culprit} hung: it {what}" + (f"; {others}" if others else "") + f". {waited[0].upper()}{waited[1:]}; "
        "every rank now exits so that torchrun --max-restarts N restarts the group from the last saved state (check "
        "that rank's machine: a stopped or swapping process, a data loader that never returns, a lost GPU)"
    )
