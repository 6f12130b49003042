"""The vitlab CLI with a fault injected, for the fault tests (tests/train/test_elastic.py) and the "faults survived"
figures (BENCHMARKS.md, benchmarks/multinode_restarts.py): torchrun runs this script instead of `-m vitlab`,

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 tests/faulty_vitlab.py kill:rank=1:step=7 train ...

and every worker sets `vitlab.train.hooks.after_step` to the fault before it runs the CLI on the rest of the
arguments. `kill:rank=1:step=7` SIGKILLs rank 1 after its 7th optimizer step of the run, `stop:rank=1:step=7`
SIGSTOPs it (a hung rank), `hang:rank=1:step=7` stops it too and has it killed as soon as its agent's SIGTERM is
pending (torchrun gives a process it stops 30 s to act on the SIGTERM, which a stopped one never does, before its
SIGKILL: the hang test needs neither the wait nor the rank to run again), `damage-and-kill:rank=0:step=7` first
overwrites the end of checkpoints/last.pt (a state torn by the crash), and `abort-at-exit:rank=1` aborts rank 1 as its process exits after the command (SIGABRT,
exit -6: a rank of a finished run failing in its teardown). A fault fires on the first attempt only, so the group
torchrun restarts runs through."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from vitlab.runs import CHECKPOINTS
from vitlab.train import hooks
from vitlab.train.elastic import restart_count

KINDS = ("kill", "stop", "hang", "damage-and-kill", "abort-at-exit")

# The watcher of a `hang`: it polls the stopped rank's signals pending (/proc), and SIGKILLs it once a SIGTERM is
# among them, or leaves when the rank is gone. A process of its own session, so the agent's signals to the workers'
# group never reach it.
KILL_ON_TERM = """
import os, signal, sys, time
pid, term = int(sys.argv[1]), 1 << (signal.SIGTERM - 1)
while True:
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    except (FileNotFoundError, ProcessLookupError):
        break
    if fields["State"].split()[0] in "ZX":  # it died of something else
        break
    if (int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)) & term:
        os.kill(pid, signal.SIGKILL)
        break
    time.sleep(0.1)
"""


@dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    rank: int
    step: int = -1  # after this optimizer step of the run (global_step); none for abort-at-exit

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, *fields = text.split(":")
        values = dict(field.split("=", 1) for field in fields)
        expected = {"rank"} if kind == "abort-at-exit" else {"rank", "step"}
        if kind not in KINDS or set(values) != expected:
            raise ValueError(f"fault {text!r}: expected e.g. kill:rank=1:step=7 ({', '.join(KINDS)})")
        return cls(kind, int(values["rank"]), int(values.get("step", -1)))

    def __call__(self, point: hooks.AfterStep) -> None:
        """Kill or stop this process when it is the fault's rank at the fault's step, after reporting its progress
        (a real hang comes long after the heartbeat's last report; an injected one at once)."""
        if point.rank != self.rank or point.global_step != self.step:
            return
        point.report_progress()
        if self.kind == "damage-and-kill":
            last = point.run.path / CHECKPOINTS / "last.pt"
            with open(last, "r+b") as handle:  # the end of the file: the state's last tensors, as a torn write
                handle.seek(max(0, last.stat().st_size - 64))
                handle.write(b"\0" * 64)
        if self.kind == "hang":
            subprocess.Popen([sys.executable, "-c", KILL_ON_TERM, str(os.getpid())], start_new_session=True)
        os.kill(os.getpid(), signal.SIGSTOP if self.kind in ("stop", "hang") else signal.SIGKILL)


def fault_for_this_attempt(text: str) -> Fault | None:
    """The fault `text` names, on the first attempt of a torchrun job; None on a restarted one."""
    fault = Fault.parse(text)
    return fault if restart_count() == 0 else None


if __name__ == "__main__":
    from vitlab.cli import main

    fault = fault_for_this_attempt(sys.argv[1])
    if fault is not None and fault.kind == "abort-at-exit":
        if int(os.environ.get("RANK", "0")) == fault.rank:
            atexit.register(os.abort)
    elif fault is not None:
        hooks.after_step = fault
    sys.exit(main(sys.argv[2:]))
