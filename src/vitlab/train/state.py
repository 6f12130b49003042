"""Training state: where a run stands (`Position`) and everything a resumed run needs, saved so that no crash
loses the last good state.

checkpoints/last.pt holds the model, optimizer, schedule, EMA, every rank's RNG state (CPU, and CUDA where the
run has a GPU) and the position, each position field under its own name; checkpoints/previous.pt the state before
it. The state describes itself: a schema version, a fingerprint of the training data, the steps per epoch and the
number of processes, so that a resume on other data, another batching or another number of processes is named
(`check_resumable`) instead of silently continuing as another run.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitlab.errors import CheckpointError, ConfigError, MissingPathError
from vitlab.files import atomic_write_checked, verify_checksum

STATE_CHECKSUM_KEY = "training state"  # last.pt and previous.pt: one key, as a save renames one into the other
from vitlab.runs import RunFolder


@dataclass
class Position:
    epoch: int = 0  # epochs fully done
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    global_step: int = 0
    best_value: float = -1.0  # the objective's selection figure (validation top-1 for classification) of the best
    best_epoch: int = -1  # checkpoint, and its epoch (-1: none yet, or no validation)
    train_seconds: float = 0.0  # inside training steps
    elapsed_seconds: float = 0.0  # wall time of the run at the last epoch end, over all its sessions
    best_elapsed_seconds: float = -1.0  # wall time at which the best validation accuracy was reached
    augment_state: torch.Tensor | None = None  # generator state mid-epoch
    epoch_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss sum, correct, count so far

    def to_state(self) -> dict[str, Any]:
        """Every field under its own name (epoch_sums as a float64 tensor, which weights_only loading takes)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["epoch_sums"] = torch.tensor(self.epoch_sums, dtype=torch.float64)
        return values

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Position":
        """The fields found in a saved state, by name; a field an older checkpoint lacks keeps its default."""
        values = {f.name: state[f.name] for f in dataclasses.fields(cls) if f.name in state}
        if "best_val_top1" in state and "best_value" not in state:  # schema 1 named it by classification's figure
            values["best_value"] = state["best_val_top1"]
        if isinstance(values.get("epoch_sums"), torch.Tensor):
            values["epoch_sums"] = values["epoch_sums"].tolist()
        return cls(**values)


# 1: the states written before the schema was recorded (no fingerprint, steps per epoch or process count).
# 2: schema_version, data_fingerprint, steps_per_epoch, world_size, cuda_rng_states; best_val_top1 -> best_value.
STATE_SCHEMA_VERSION = 2


def training_state(model, optimizer, scheduler, ema, position: Position, config, rng_states: torch.Tensor,
                   data_fingerprint: dict[str, Any], steps_per_epoch: int, world_size: int,
                   cuda_rng_states: torch.Tensor | None = None,
                   objective_state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Everything a resumed run needs; rng_states holds every rank's global RNG state (gather_rng_states), and
    cuda_rng_states every rank's CUDA generator state on a GPU run; objective_state the objective's own
    parameters (a pre-training decoder or head: `Objective.extra_state`)."""
    return {
        "schema_version": STATE_SCHEMA_VERSION,
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "ema": ema.state if ema else None, **position.to_state(),
        "torch_rng_state": rng_states[0], "rank_rng_states": rng_states, "cuda_rng_states": cuda_rng_states,
        "model_config": model.config.to_json(), "train_config": json.dumps(config.to_dict()),
        "data_fingerprint": json.dumps(data_fingerprint, sort_keys=True), "steps_per_epoch": steps_per_epoch,
        "world_size": world_size, "objective_state": objective_state or {},
    }


def check_resumable(state: dict[str, Any], data_fingerprint: dict[str, Any], steps_per_epoch: int, world_size: int,
                    run: Any) -> list[str]:
    """Compare what a saved state says of its run with the run about to resume it. A change that makes the resumed
    run another run (other data, other batching) is refused with what changed and what to do; one that only loses
    bit-exactness (another number of processes, an older state that cannot be checked) is returned as notes."""
    version = int(state.get("schema_version", 1))
    if version > STATE_SCHEMA_VERSION:
        raise CheckpointError(f"{run}'s training state has schema {version}, newer than this vitlab reads "
                              f"({STATE_SCHEMA_VERSION}); resume it with the vitlab that wrote it, or upgrade")
    if version < 2:
        return [f"{run}'s training state was written by an older vitlab (schema {version}): it records neither the "
                "data, the steps per epoch nor the number of processes, so none of them can be checked; the run "
                "resumes as saved, and is exact only if they are unchanged"]
    saved = json.loads(state["data_fingerprint"])
    if saved != data_fingerprint:
        changed = ", ".join(f"{key} {saved.get(key)} -> {data_fingerprint.get(key)}"
                            for key in sorted(set(saved) | set(data_fingerprint))
                            if saved.get(key) != data_fingerprint.get(key))
        raise ConfigError(f"the training data differ from those {run} was trained on ({changed}); resume with the "
                          "same data (--data-dir, --set classes/max_train_images/val_size/seed as saved), or start "
                          "a new run from its weights: vitlab finetune --from " + str(run))
    if state["steps_per_epoch"] != steps_per_epoch:
        raise ConfigError(f"{run} was saved at {state['steps_per_epoch']} steps per epoch, this resume makes "
                          f"{steps_per_epoch}; resume with the saved batch size")
    notes = []
    if state["world_size"] != world_size:
        notes.append(f"{run} was saved by {state['world_size']} process(es) and resumes on {world_size}: the data "
                     "order and rank 0's random stream continue, the other ranks' streams are re-seeded, so the "
                     "run is no longer bit-identical to an uninterrupted one")
    return notes


def save_training_state(state: dict[str, Any], run: RunFolder) -> Path:
    """Write checkpoints/last.pt, keeping the one before as previous.pt, so that no crash or error loses the
    last good state: the new bytes are written and synced to a temporary file first; only then does last.pt
    become previous.pt and the temporary file become last.pt (two renames). A crash between the renames
    leaves previous.pt as the newest state, which `load_training_state` then takes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    folder = run.checkpoints
    last, previous, pending = folder / "last.pt", folder / "previous.pt", folder / "next.pt"
    try:
        atomic_write_checked(pending, buffer.getvalue(), STATE_CHECKSUM_KEY)
        if last.exists():
            os.replace(last, previous)
        os.replace(pending, last)
    except OSError as error:
        kept = last if last.exists() else previous
        raise CheckpointError(f"could not save the training state in {folder} ({error.strerror or error}); "
                              f"the last good checkpoint {kept} is intact") from None
    return last


def first_sentence(message: str, limit: int = 200) -> str:
    """The first line of a library's error message, cut at a word and marked when longer than `limit`."""
    line = (message.strip().splitlines() or [""])[0]
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


def load_training_state(run: RunFolder | Path, allow_previous: bool = False) -> dict[str, Any]:
    """The newest readable training state of a run; the previous one only when allowed."""
    run = run if isinstance(run, RunFolder) else RunFolder(run)
    if not run.path.is_dir():
        raise MissingPathError(f"cannot resume {run}: no such run folder (runs are under runs/ by default)")
    if not (run.checkpoints / "last.pt").exists() and not (run.checkpoints / "previous.pt").exists():
        raise MissingPathError(f"cannot resume {run}: it holds no training state (checkpoints/last.pt); is it a run "
                               "folder that `vitlab train`, `finetune` or `pretrain` made?")
    folder = run.checkpoints
    last_missing = not (folder / "last.pt").exists() and (folder / "previous.pt").exists()
    # A missing last.pt with a previous.pt means a stop between the two renames of a save: previous.pt is then
    # the newest state, so it is taken without asking. A damaged last.pt needs --use-previous.
    candidates = [folder / "last.pt"] + ([folder / "previous.pt"] if allow_previous or last_missing else [])
    problems = []
    for path in candidates:
        if not path.exists():
            problems.append(f"{path} does not exist")
            continue
        if verify_checksum(path, STATE_CHECKSUM_KEY) is False:
            # Bytes changed inside a tensor load without any error: only the digest recorded at writing tells.
            problems.append(f"{path} is damaged: its content differs from what this run wrote (SHA-256 recorded in "
                            f"{path.parent / 'checksums.json'})")
            continue
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # unreadable: truncated, corrupt or refused
            problems.append(f"{path} is unreadable ({type(error).__name__}: {first_sentence(str(error))})")
    hint = "" if allow_previous or last_missing or not (folder / "previous.pt").exists() else \
        "; the previous checkpoint exists: add --use-previous to resume from it"
    raise CheckpointError(f"cannot resume {run}: " + "; ".join(problems) + hint)
