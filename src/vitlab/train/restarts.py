"""What a run does when it starts again: the decisions beside `vitlab.train.elastic` (which finds the run a
torchrun restart belongs to). `continued_after_restart` chooses, for every rank at once, whether a restarted
attempt resumes its run, starts it again or finds it finished; `finished_in_this_job` is that last answer for a
restarted `train --resume`; `set_aside_damaged_state` keeps a damaged last state out of the way of the next save."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitlab.distributed import DistEnv, broadcast_object, synchronize
from vitlab.messages import say
from vitlab.runs import RunFolder
from vitlab.train.config import TrainConfig
from vitlab.train.elastic import holds_state, restart_count, restarted, resumed_in_this_job, run_to_continue
from vitlab.train.state import RunFinished


def continued_after_restart(config: TrainConfig, env: DistEnv, notes: list[str]) -> Path | dict | None:
    """On an attempt restarted by torchrun's agent: the run folder to resume (the one this job's first attempt
    started), the run's summary where it had finished, or None. Where that attempt died before its first saved
    state, the run starts again in its folder. Decided by rank 0 for every rank: the agents of several machines
    count their restarts apart, and every rank must take the same way."""
    decision: tuple[str, str] | None = None
    if restarted(env):
        run = run_to_continue(config) if env.is_main else None
        if run is not None:
            summary = run.summary() or {}
            if summary.get("status") == "finished":
                decision = ("finished", str(run.path))
            elif holds_state(run):
                decision = ("resume", str(run.path))
            else:
                decision = ("again", str(run.path))
        decision = broadcast_object(decision, env)
    if decision is None:
        return None
    kind, path = decision
    run = RunFolder(path)
    if kind == "finished":
        if env.is_main:
            say(f"note: restart {restart_count()} of this torchrun job: {run} had finished; nothing to do again")
        return {"status": "finished", "run_dir": path, "restarted": True}
    if kind == "resume":
        notes.append(f"restart of this torchrun job: resuming {run} from its last saved state")
        return run.path
    config.out_dir, config.run_name = str(run.path.parent), run.path.name
    notes.append(f"restart of this torchrun job: {run} had saved no state yet; starting it again")
    return None


def finished_in_this_job(run_dir: Path, refusal: RunFinished) -> dict[str, Any]:
    """`train --resume RUN` started again by torchrun's agent after this job had finished RUN (a rank failed as it
    exited, and the agent restarts the whole group): the summary of a finished run, so the restart exits 0 as the
    attempt it repeats should have. A resume of a run that had finished before this job raises `refusal`. Every rank
    reads the same note (the output folder is shared), so all take the same way without a process group."""
    if not resumed_in_this_job(run_dir):
        raise refusal
    if int(os.environ.get("RANK", "0")) == 0:
        say(
            f"note: restart {restart_count()} of this torchrun job: {RunFolder(run_dir)} had finished; nothing to do again"
        )
    return {"status": "finished", "run_dir": str(run_dir), "restarted": True}


def set_aside_damaged_state(state: dict[str, Any], run_dir: Path, env: DistEnv, notes: list[str]) -> None:
    """Where the run resumes from previous.pt because last.pt is damaged (--use-previous, or a restart), rank 0
    renames last.pt to last.damaged.pt once every rank has read its state: the next save would otherwise turn it
    into previous.pt, over the good state the run fell back to."""
    if state.get("_loaded_from") != "previous.pt":
        return
    synchronize(env)
    damaged = RunFolder(run_dir).checkpoints / "last.pt"
    if env.is_main and damaged.exists():
        os.replace(damaged, damaged.with_name("last.damaged.pt"))
        notes.append(f"the damaged state is kept as {damaged.with_name('last.damaged.pt')}")
