"""Training state: where a run stands (`Position`) and everything a resumed run needs, saved so that no crash
loses the last good state.

checkpoints/last.pt holds the model, optimizer, schedule, EMA, every rank's RNG state (CPU, and CUDA where the
run has a GPU) and the position, each position field under its own name; checkpoints/previous.pt the state before
it. The state describes itself: a schema version, a fingerprint of the training data, the steps per epoch and the
number of processes, so that a resume on other data, another batching or another number of processes is named
(`check_resumable`) instead of silently continuing as another run.

A resume reads it back in three steps: `read_resumable` (the state and the recipe it was saved with, refused when
nothing is left to train), `restored_model` (the model as saved), and `restore` once the run is assembled around
it (optimizer, schedule, EMA, the objective's own parameters, this rank's random streams, the position).
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

from vitlab.config import ViTConfig
from vitlab.distributed import DistEnv
from vitlab.errors import CheckpointError, ConfigError, MissingPathError
from vitlab.files import atomic_write_checked, verify_checksum
from vitlab.messages import say
from vitlab.models.registry import create_model
from vitlab.models.vit import VisionTransformer
from vitlab.objectives.base import Objective
from vitlab.runs import RunFolder
from vitlab.train.config import TrainConfig
from vitlab.train.lora import add_lora
from vitlab.train.optim import EMA
from vitlab.train.schedule import follow_schedule
from vitlab.train.sharded_state import SHARDED_KEY

STATE_CHECKSUM_KEY = "training state"  # last.pt and previous.pt: one key, as a save renames one into the other


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
    # The data set's unreadable files met by the run at its last epoch end, every rank's ("location: why"): a
    # resumed run still counts and lists those it will not meet again (a run resumed after its last epoch).
    unreadable: list[str] = field(default_factory=list)

    def to_state(self) -> dict[str, Any]:
        """Every field under its own name (epoch_sums as a float64 tensor, which weights_only loading takes)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["epoch_sums"] = torch.tensor(self.epoch_sums, dtype=torch.float64)
        return values

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Position:
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


def training_state(
    model,
    optimizer,
    scheduler,
    ema,
    position: Position,
    config,
    rng_states: torch.Tensor,
    data_fingerprint: dict[str, Any],
    steps_per_epoch: int,
    world_size: int,
    cuda_rng_states: torch.Tensor | None = None,
    objective_state: dict[str, torch.Tensor] | None = None,
    sharded: str | None = None,
) -> dict[str, Any]:
    """Everything a resumed run needs; rng_states holds every rank's global RNG state (gather_rng_states), and
    cuda_rng_states every rank's CUDA generator state on a GPU run; objective_state the objective's own
    parameters (a pre-training decoder or head: `Objective.extra_state`). sharded: the folder under checkpoints/
    that holds the model and optimizer of an FSDP run (`vitlab.train.sharded_state`), which the state then names
    instead of holding them."""
    return {
        "schema_version": STATE_SCHEMA_VERSION,
        "model": {} if sharded else model.state_dict(),
        "optimizer": {} if sharded else optimizer.state_dict(),
        SHARDED_KEY: sharded,
        "scheduler": scheduler.state_dict(),
        "ema": ema.state if ema else None,
        **position.to_state(),
        "torch_rng_state": rng_states[0],
        "rank_rng_states": rng_states,
        "cuda_rng_states": cuda_rng_states,
        "model_config": model.config.to_json(),
        "train_config": json.dumps(config.to_dict()),
        "data_fingerprint": json.dumps(data_fingerprint, sort_keys=True),
        "steps_per_epoch": steps_per_epoch,
        "world_size": world_size,
        "objective_state": objective_state or {},
    }


def check_resumable(
    state: dict[str, Any], data_fingerprint: dict[str, Any], steps_per_epoch: int, world_size: int, run: Any
) -> list[str]:
    """Compare what a saved state says of its run with the run about to resume it. A change that makes the resumed
    run another run (other data, other batching) is refused with what changed and what to do; one that only loses
    bit-exactness (another number of processes, an older state that cannot be checked) is returned as notes."""
    version = int(state.get("schema_version", 1))
    if version > STATE_SCHEMA_VERSION:
        raise CheckpointError(
            f"{run}'s training state has schema {version}, newer than this vitlab reads "
            f"({STATE_SCHEMA_VERSION}); resume it with the vitlab that wrote it, or upgrade"
        )
    if version < 2:
        return [
            f"{run}'s training state was written by an older vitlab (schema {version}): it records neither the "
            "data, the steps per epoch nor the number of processes, so none of them can be checked; the run "
            "resumes as saved, and is exact only if they are unchanged"
        ]
    saved = json.loads(state["data_fingerprint"])
    if saved != data_fingerprint:
        changed = ", ".join(
            f"{key} {saved.get(key)} -> {data_fingerprint.get(key)}"
            for key in sorted(set(saved) | set(data_fingerprint))
            if saved.get(key) != data_fingerprint.get(key)
        )
        raise ConfigError(
            f"the training data differ from those {run} was trained on ({changed}); resume with the "
            "same data (--data-dir, --set classes/max_train_images/val_size/seed as saved), or start "
            "a new run from its weights: vitlab finetune --from " + str(run)
        )
    if state["steps_per_epoch"] != steps_per_epoch:
        raise ConfigError(
            f"{run} was saved at {state['steps_per_epoch']} steps per epoch, this resume makes "
            f"{steps_per_epoch}; resume with the saved batch size"
        )
    notes = []
    if state["world_size"] != world_size:
        notes.append(
            f"{run} was saved by {state['world_size']} process(es) and resumes on {world_size}: the data "
            "order and rank 0's random stream continue, the other ranks' streams are re-seeded, so the "
            "run is no longer bit-identical to an uninterrupted one"
        )
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
        raise CheckpointError(
            f"could not save the training state in {folder} ({error.strerror or error}); "
            f"the last good checkpoint {kept} is intact"
        ) from None
    return last


def first_sentence(message: str, limit: int = 200) -> str:
    """The first line of a library's error message, cut at a word and marked when longer than `limit`."""
    line = (message.strip().splitlines() or [""])[0]
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " ..."


def load_training_state(
    run: RunFolder | Path, allow_previous: bool = False, notes: list[str] | None = None
) -> dict[str, Any]:
    """The newest readable training state of a run; the previous one only when allowed, and then what was wrong
    with the newer one is added to `notes`, for the user."""
    run = run if isinstance(run, RunFolder) else RunFolder(run)
    if not run.path.is_dir():
        raise MissingPathError(f"cannot resume {run}: no such run folder (runs are under runs/ by default)")
    if not (run.checkpoints / "last.pt").exists() and not (run.checkpoints / "previous.pt").exists():
        raise MissingPathError(
            f"cannot resume {run}: it holds no training state (checkpoints/last.pt); is it a run "
            "folder that `vitlab train`, `finetune` or `pretrain` made?"
        )
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
            problems.append(
                f"{path} is damaged: its content differs from what this run wrote (SHA-256 recorded in "
                f"{path.parent / 'checksums.json'})"
            )
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # unreadable: truncated, corrupt or refused
            problems.append(f"{path} is unreadable ({type(error).__name__}: {first_sentence(str(error))})")
            continue
        if problems and notes is not None:
            notes.append("; ".join(problems) + f": resuming from {path.name}, the state saved before it")
        state["_loaded_from"] = path.name  # not saved again: `training_state` builds a new dict
        return state
    hint = (
        ""
        if allow_previous or last_missing or not (folder / "previous.pt").exists()
        else "; the previous checkpoint exists: add --use-previous to resume from it"
    )
    raise CheckpointError(f"cannot resume {run}: " + "; ".join(problems) + hint)


def read_resumable(
    run_dir: Path, allow_previous: bool = False, new_epochs: int | None = None, notes: list[str] | None = None
) -> tuple[dict[str, Any], TrainConfig]:
    """(the run's newest readable state, the recipe it was saved with at `new_epochs` if given); a run with
    nothing left to train is refused with what to do."""
    state = load_training_state(run_dir, allow_previous=allow_previous, notes=notes)
    config = resumed_config(state, run_dir, new_epochs)
    refuse_finished(state, run_dir, config)
    return state, config


class RunFinished(ConfigError):
    """A resume of a run with nothing left to train (a restart of the job that finished it exits 0 instead)."""


def refuse_finished(state: dict[str, Any], run_dir: Path, config: TrainConfig) -> None:
    """A run whose every epoch is trained and whose summary is written has nothing left to resume. (One stopped
    after its last state was saved but before its summary resumes into `finish`, which writes it.)"""
    summary = RunFolder(run_dir).summary()
    if state["epoch"] >= config.epochs and summary is not None and summary.get("status") == "finished":
        raise RunFinished(
            f"{run_dir} has finished its {config.epochs} epochs; nothing to resume. To train it "
            f"longer, add --epochs N (more than {config.epochs}); to start again, train a new run"
        )


def resumed_config(state: dict[str, Any], run_dir: Path, new_epochs: int | None) -> TrainConfig:
    """The recipe a run was saved with, at a new length if asked (never below the epochs already trained)."""
    config = TrainConfig.from_dict(json.loads(state["train_config"]))
    if new_epochs is not None and new_epochs != config.epochs:
        done = state["epoch"] + (1 if state["step_in_epoch"] else 0)
        if new_epochs < done:
            raise ConfigError(
                f"{run_dir} has already trained {done} epochs; --epochs must be at least that "
                f"to extend it (the recipe's length is {config.epochs})"
            )
        config.epochs = new_epochs
    return config


def restored_model(state: dict[str, Any]) -> VisionTransformer:
    """The model a state holds: built from its recorded config (with its LoRA adapters, where it had them), with
    its saved weights (those of a sharded state are read once the run is assembled:
    `vitlab.train.sharded_state.load_sharded_state`)."""
    model = create_model(ViTConfig.from_json(state["model_config"]))
    lora = TrainConfig.from_dict(json.loads(state["train_config"])).lora
    if lora.enabled:
        add_lora(model, lora)
    if not state.get(SHARDED_KEY):
        model.load_state_dict(state["model"])
    return model


def restore(
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    ema: EMA | None,
    objective: Objective,
    config: TrainConfig,
    env: DistEnv,
    run: RunFolder,
    steps_per_epoch: int,
) -> Position:
    """Optimizer, schedule, EMA, the objective's own parameters (attached already) and this rank's RNG stream as
    saved (a sharded state's optimizer is read beside its model: `load_sharded_state`); returns the position where
    the run stands."""
    if state.get("objective_state"):
        objective.load_extra_state(state["objective_state"])
    if not state.get(SHARDED_KEY):
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    saved_epochs = TrainConfig.from_dict(json.loads(state["train_config"])).epochs
    if saved_epochs != config.epochs:  # extended (`resumed_config`): the new length's schedule from the next step
        previous_lr = optimizer.param_groups[-1]["lr"]
        follow_schedule(optimizer, scheduler)
        if env.is_main:
            say(
                f"extending {run} from {saved_epochs} to {config.epochs} epochs: the learning rate now follows "
                f"a {config.epochs}-epoch schedule, {previous_lr:.2e} -> {optimizer.param_groups[-1]['lr']:.2e} "
                f"at step {scheduler.last_epoch} of {config.epochs * steps_per_epoch}"
            )
    if ema is not None and state["ema"] is not None:
        ema.state = {k: v.to(env.device) for k, v in state["ema"].items()}
    position = Position.from_state(state)
    rank_states = state.get("rank_rng_states")
    if rank_states is not None and len(rank_states) == env.world_size:
        # clone(): torch 2.13's set_rng_state segfaults on a row view with a storage offset (seen here).
        torch.set_rng_state(rank_states[env.rank].clone())  # each rank continues its own stream exactly
    else:  # resumed on another number of processes: rank 0's stream, fresh distinct ones for the others
        torch.set_rng_state(state["torch_rng_state"].clone())
        if env.rank:
            torch.manual_seed(config.seed + env.rank + position.global_step)
    cuda_states = state.get("cuda_rng_states")
    if env.device.type == "cuda":
        if cuda_states is not None and len(cuda_states) == env.world_size:
            torch.cuda.set_rng_state(cuda_states[env.rank].clone(), env.device)
        elif env.is_main:
            say(
                "note: the saved state holds no CUDA random state for these processes (saved on a CPU, or by "
                "another number of GPUs): dropout and stochastic depth on the GPU continue from a fresh stream"
            )
    return position
