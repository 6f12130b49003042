"""The model and optimizer of an FSDP run, saved sharded through `torch.distributed.checkpoint` (DCP): every
process writes its own shards into one folder, checkpoints/sharded-<id>/, and the rest of the state (position,
schedule, random streams, recipe) goes into checkpoints/last.pt as for any run, naming that folder
(`SHARDED_KEY`).

Atomic as every vitlab checkpoint is: the shards go into a new folder, never one a saved state names, and only
once every process has written them does rank 0 write last.pt (itself atomically, the one before kept as
previous.pt: `vitlab.train.state.save_training_state`). A save that fails anywhere leaves last.pt and previous.pt,
and the folders they name, as they were; folders that no state names any more (an older save's, a failed save's)
are removed after the next good save.

DCP records each shard's place in the whole tensor, so a state saved by N processes loads on any number: sharded
again over M processes, or whole on one (`load_sharded_state`), with the optimizer's state keyed by parameter
name (`get_state_dict` / `set_state_dict`), not by position.
"""

from __future__ import annotations

import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.distributed import DistEnv, broadcast_object
from vitlab.errors import CheckpointError
from vitlab.runs import RunFolder

SHARDED_KEY = "sharded_state"  # in a training state: the folder (under checkpoints/) of its model and optimizer
SHARDED_PREFIX = "sharded-"


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, run: RunFolder, env: DistEnv) -> str:
    """Every process writes its shards of the model and optimizer into a new folder under the run's checkpoints
    (a collective: call on every rank at once); returns the folder's name, for the training state to record."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    name = broadcast_object(f"{SHARDED_PREFIX}{uuid.uuid4().hex[:12]}", env)  # one name, rank 0's, on every rank
    folder = run.checkpoints / name
    model_state, optimizer_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    except Exception as error:  # noqa: BLE001 - DCP wraps each rank's OSError in its own exception type
        raise CheckpointError(
            f"could not save the sharded training state in {folder} ({first_line(error)}); "
            f"the last good checkpoint in {run.checkpoints} is intact"
        ) from None
    return name


def load_sharded_state(
    state: dict[str, Any], run: RunFolder, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """The model and optimizer of a sharded training state read into `model` (sharded or whole, on any number of
    processes) and `optimizer`; nothing for a state that holds them itself."""
    if not state.get(SHARDED_KEY):
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = run.checkpoints / state[SHARDED_KEY]
    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"cannot resume {run}: its training state names the sharded model and optimizer in {folder}, which is "
            "missing or incomplete; resume from the state before it with --use-previous"
        )
    model_state, optimizer_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optimizer": optimizer_state}
    with warnings.catch_warnings():  # one process, no process group: DCP warns that it assumes so, as meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(loaded, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])


def remove_unnamed_shards(run: RunFolder, named: set[str]) -> None:
    """Rank 0, after a good save: remove the shard folders that neither last.pt nor previous.pt names (`named`):
    an older save's, or one a failed save left half written."""
    for folder in Path(run.checkpoints).glob(f"{SHARDED_PREFIX}*"):
        if folder.name not in named:
            shutil.rmtree(folder, ignore_errors=True)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
