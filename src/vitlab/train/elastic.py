"""Restarts by torchrun's elastic agent: `torchrun --max-restarts N` starts the whole group again when a rank dies
(SIGKILL, out of memory, a lost node) or exits with an error (a collective timeout, `vitlab.train.watchdog`), and
vitlab resumes the run by itself.

The agent restarts the same command, so a restarted process must find the run its first attempt started: rank 0
of the first attempt notes the run folder under the job's id (TORCHELASTIC_RUN_ID) in the output folder, and a
later attempt (TORCHELASTIC_RESTART_COUNT > 0) reads it back and resumes from the folder's last good state, with
`--resume`'s exactness (data order, random streams, EMA, the objective's state). A last state that cannot be
read falls back to the one before it, and says so. Where the first attempt died before its first state was
saved, the run starts again in the same folder.

The fault tests inject their faults through a test hook (`vitlab.train.hooks.after_step`, set by
tests/faulty_vitlab.py), never through anything a user's run reads. What a restarted attempt then does is
`vitlab.train.restarts`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vitlab.distributed import DistEnv, any_rank
from vitlab.files import atomic_write_bytes
from vitlab.runs import RunFolder


def restart_count() -> int:
    """How many times torchrun's agent has restarted this group (0: the first attempt, or no agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restarted(env: DistEnv) -> bool:
    """Whether torchrun's agent restarted this group, as every rank sees it (the agents of several machines count
    their restarts apart: one that only saw the others restart counts none)."""
    return any_rank(restart_count() > 0, env)


# torchrun's agents keep one key-value store for every restart of a group unless launched with this set to 1.
SEPARATE_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def shared_store_hazard() -> str | None:
    """A note for a job of several machines that may restart while its agents share one store across restarts:
    the restarted workers can read the dead ones' addresses there (of 10 restarts of a two-machine job on one
    machine, 4 failed to connect and 3 did not finish; with it set, 10 of 10 finished; BENCHMARKS.md). Under one agent vitlab separates each attempt's keys itself (`init_distributed`); across
    machines the agents count their restarts apart, so only a store of its own per attempt, torch's option, does."""
    machines = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if machines < 2 or restarts < 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if os.environ.get(SEPARATE_STORES) == "1":  # set, and still one store: torchrun's static rendezvous keeps one
        return (
            f"the {machines} machines' torchrun agents share one store across restarts even with {SEPARATE_STORES}=1 "
            "(the static rendezvous of --master-addr keeps one): restarted workers can find the dead workers' "
            "addresses there; launch with --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB"
        )
    return (
        f"the {machines} machines' torchrun agents share one store across restarts, where a restarted worker can "
        f"find the dead workers' addresses and fail to connect or hang; launch torchrun with {SEPARATE_STORES}=1 "
        "in its environment on every machine, and --rdzv-backend c10d (a new store for each restart)"
    )


def job_marker(out_dir: str | Path) -> Path | None:
    """Where the first attempt of this torchrun job notes its run folder; None outside an elastic job that may
    restart, or where the job has no id of its own (torchrun's default --rdzv-id "none" is every such job's)."""
    job = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if not job or job == "none" or restarts < 1 or os.environ.get("TORCHELASTIC_RESTART_COUNT") is None:
        return None
    return Path(out_dir) / ".elastic" / f"{job}.json"


def recipe_digest(config: Any) -> str:
    """The recipe a job was started with, apart from where its run goes (a restart of the same command)."""
    recipe = {key: value for key, value in config.to_dict().items() if key not in ("run_name", "out_dir")}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()


def remember_run(run: RunFolder, config: Any) -> None:
    """Rank 0, on starting a new run under an elastic agent that may restart it: note its folder and recipe for
    the restarts of this job."""
    marker = job_marker(config.out_dir)
    if marker is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, json.dumps({"run_dir": str(run.path), "recipe": recipe_digest(config)}).encode())


def remember_resumed(run: RunFolder) -> None:
    """Rank 0, on resuming `run` under an elastic agent that may restart it: note it for the restarts of this job,
    which then know that a finished `run` was finished by this job (`resumed_in_this_job`). A note of this job's
    already there (a restart of a new run, which resumes it) is kept."""
    marker = job_marker(run.path.parent)
    if marker is not None and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, json.dumps({"run_dir": str(run.path)}).encode())


def resumed_in_this_job(run_dir: str | Path) -> bool:
    """Whether an earlier attempt of this torchrun job noted `run_dir` as its run (resumed or started by it)."""
    marker = job_marker(Path(run_dir).parent)
    if marker is None or not marker.is_file():
        return False
    return Path(json.loads(marker.read_text())["run_dir"]).resolve() == Path(run_dir).resolve()


def holds_state(run: RunFolder) -> bool:
    """The folder holds a training state (last.pt, or previous.pt alone: a crash between a save's two renames)."""
    return any((run.checkpoints / name).exists() for name in ("last.pt", "previous.pt"))


def run_to_continue(config: Any) -> RunFolder | None:
    """On a restarted attempt: the run folder the first attempt of this job started with this recipe, or None
    where no elastic agent may restart it, the first attempt died before noting one, or the note is another
    recipe's (a job id used twice). The folders are read from the output folder, which every node must share."""
    marker = job_marker(config.out_dir)
    if marker is None or not marker.is_file():
        return None
    noted = json.loads(marker.read_text())
    if noted.get("recipe") != recipe_digest(config):
        return None
    return RunFolder(noted["run_dir"])
